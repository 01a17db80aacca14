package managementapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/wabarelay/wabarelay/docs"
	"github.com/wabarelay/wabarelay/internal/httpx"
)

// openAPIETag is the entity tag of docs.OpenAPI: the first 16 bytes of its SHA-256, computed
// once (the document is embedded in the build).
var openAPIETag = func() string {
	sum := sha256.Sum256(docs.OpenAPI)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}()

// serveOpenAPI answers GET and HEAD /openapi.yaml with the OpenAPI document the tests validate
// the API against (docs/openapi.yaml, embedded), without an API key: clients generate their code
// from it. Conditional requests (If-None-Match) get 304; other methods 405.
func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		httpx.WriteError(w, http.StatusMethodNotAllowed, httpx.MsgMethod)
		return
	}
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.Header().Set("ETag", openAPIETag)
	http.ServeContent(w, r, "openapi.yaml", time.Time{}, bytes.NewReader(docs.OpenAPI))
}
