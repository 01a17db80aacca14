package managementapi

import (
	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/store"
)

// Delivery is the JSON form of a delivery with its attempts.
type Delivery struct {
	ID             uuid.UUID `json:"id"`
	EventID        uuid.UUID `json:"event_id"`
	EventType      string    `json:"event_type"`
	Status         string    `json:"status"`
	Attempts       int       `json:"attempts"`
	NextAttemptAt  *Time     `json:"next_attempt_at"`
	LastStatusCode *int      `json:"last_status_code"`
	LastError      *string   `json:"last_error"`
	CreatedAt      Time      `json:"created_at"`
	UpdatedAt      Time      `json:"updated_at"`
	AttemptLog     []Attempt `json:"attempt_log"`
}

// Attempt is the JSON form of one delivery attempt.
type Attempt struct {
	Attempt int `json:"attempt"`
	// Schedule is 1 for the original schedule, 2 for the first manual retry or recovery, ….
	Schedule     int     `json:"schedule"`
	StartedAt    Time    `json:"started_at"`
	DurationMS   int     `json:"duration_ms"`
	StatusCode   *int    `json:"status_code"`
	Error        *string `json:"error"`
	ResponseBody *string `json:"response_body"`
}

func newDelivery(d store.Delivery) Delivery {
	out := Delivery{ID: d.ID, EventID: d.EventID, EventType: d.EventType, Status: d.Status, Attempts: d.Attempts,
		NextAttemptAt: optTime(d.NextAttemptAt), LastStatusCode: d.LastStatusCode, LastError: d.LastError,
		CreatedAt: Time(d.CreatedAt), UpdatedAt: Time(d.UpdatedAt), AttemptLog: make([]Attempt, len(d.Log))}
	for i, a := range d.Log {
		out.AttemptLog[i] = Attempt{Attempt: a.Attempt, Schedule: a.Schedule, StartedAt: Time(a.StartedAt), DurationMS: a.DurationMS,
			StatusCode: a.StatusCode, Error: a.Error, ResponseBody: a.ResponseBody}
	}
	return out
}
