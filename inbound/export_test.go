package inbound

// Waiting returns how many posts wait for a group (tests: a post is queued before they go on).
func Waiting(h *Handler) int {
	if h.group == nil {
		return 0
	}
	h.group.mu.Lock()
	defer h.group.mu.Unlock()
	return len(h.group.queue)
}
