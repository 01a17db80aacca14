package httpx

import (
	"encoding/json"
	"net/http"
)

// Error messages shared by every wabarelay handler (the interface document's wording).
const (
	MsgRateLimited = "Rate limit exceeded"
	MsgNotFound    = "Not found"
	MsgMethod      = "Method not allowed"
	MsgInternal    = "Internal server error"
	MsgUnavailable = "Service unavailable"
)

// errorBody is the body of every error answer.
type errorBody struct {
	Error string `json:"error"`
}

// WriteJSON writes v as JSON with status, marked not cacheable and not sniffable.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"`+MsgInternal+`"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// WriteError writes the documented error answer {"error": msg} with status.
func WriteError(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, errorBody{Error: msg})
}
