package idemwebhook

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ContentTypeProblem is the media type of error bodies (RFC 9457).
const ContentTypeProblem = "application/problem+json"

// Problem is the body of every error answer (RFC 9457 problem details). Type is "about:blank":
// the status and Reason say what happened; Detail never holds a secret, an SQL error or a
// handler's error text, only what the sender can act on.
type Problem struct {
	// Type is always "about:blank": the status says what kind of problem it is.
	Type string `json:"type"`
	// Title is the status text ("Unauthorized").
	Title string `json:"title"`
	// Status repeats the HTTP status.
	Status int `json:"status"`
	// Detail says what the sender can do about it.
	Detail string `json:"detail,omitempty"`
	// Reason is the dead-letter reason when the delivery was dead-lettered, "unauthenticated"
	// when its signature did not verify (such a delivery is not stored), or "retry" when it
	// should be sent again.
	Reason string `json:"reason,omitempty"`
	// EventID is the (bounded) event id the request carried, when known.
	EventID string `json:"event_id,omitempty"`
	// Provider names the verifier's provider.
	Provider string `json:"provider,omitempty"`
}

// Answer is the body of a 200: what happened to the event.
type Answer struct {
	EventID string `json:"event_id"`
	// Outcome is "processed" (applied now), "duplicate" (applied before; nothing done) or
	// "ignored" (the handler returned idem.Ignore: acknowledged without effect).
	Outcome string `json:"outcome"`
}

// writeProblem writes p with its status and the extra headers.
func writeProblem(w http.ResponseWriter, p Problem, extra map[string]string) {
	p.Type = "about:blank"
	p.Title = http.StatusText(p.Status)
	if p.Title == "" {
		p.Title = "Status " + strconv.Itoa(p.Status)
	}
	for k, v := range extra {
		w.Header().Set(k, v)
	}
	writeJSON(w, ContentTypeProblem, p.Status, p)
}

// writeJSON writes v as the body; v is always one of this package's plain structs, which
// marshal without error.
func writeJSON(w http.ResponseWriter, contentType string, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
