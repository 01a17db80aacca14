package dashboard

import (
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/wabarelay/wabarelay/managementapi"
)

// TODO(timeline, relaylog): read through managementapi.Service.ListMessages / GetMessage and
// store.SendsPerMinute once those branches land.

// listMessages returns a page of a channel's outgoing messages and the cursor of the next page
// ("" when none follows).
func (h *Handler) listMessages(r *http.Request, s *session, channelID uuid.UUID, f messageFilter, cursor string) ([]messageRow, string, *managementapi.Error) {
	return nil, "", nil
}

// sendsPerMinute returns a channel's relay calls per minute by outcome since a time.
func (h *Handler) sendsPerMinute(r *http.Request, orgID, channelID uuid.UUID, since time.Time) ([]sendMinute, error) {
	return nil, nil
}

// getMessage returns a message's timeline as the message page shows it.
func (h *Handler) getMessage(r *http.Request, s *session, wamid string) (messageData, *managementapi.Error) {
	return messageData{}, &managementapi.Error{Status: http.StatusNotFound, Message: "Message not found"}
}
