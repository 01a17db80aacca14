package dashboard

// upstreamErrors explains the upstream (WhatsApp Cloud API) error codes operators meet most, in
// one line each, keyed by error code. The channel, message and broadcast pages show the line
// beside the code; other codes show the upstream's own title alone.
var upstreamErrors = map[int]string{
	131047: "Outside the 24-hour window: the customer has not written in the last 24 hours, so only a template message can be sent.",
	131026: "Undeliverable: the number is not on WhatsApp, has not accepted the latest terms, or runs an app too old to receive it.",
	130429: "Throughput limit: the number sent more messages per second than the upstream allows; send more slowly and retry.",
	131056: "Pair rate limit: too many messages to the same customer in a short time; wait before sending to them again.",
	190:    "Access token dead: the channel's upstream token expired or was revoked; reconnect the channel.",
	132001: "Template missing: no approved template of that name exists in that language for the business account.",
}

// explainError returns the one-line explanation of an upstream error code, or "" for a code
// without one.
func explainError(code int) string {
	return upstreamErrors[code]
}
