package idemkey

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// errResponseTooLarge is what a handler's Write returns once its response exceeds
// Config.MaxResponseBytes; the transaction then rolls back.
var errResponseTooLarge = errors.New("idemkey: response exceeds Config.MaxResponseBytes")

// buffer holds a handler's response until its transaction has committed: the client must never
// see a response whose effect may still roll back.
type buffer struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int // -1: none
	overflow bool
}

var _ http.ResponseWriter = (*buffer)(nil)

func newBuffer(limit int) *buffer { return &buffer{header: http.Header{}, limit: limit} }

// Header returns the response's header map.
func (b *buffer) Header() http.Header { return b.header }

// WriteHeader records the first final status; informational ones (1xx) are dropped, and calls
// after the status is set are ignored. A code outside 100-999 panics, as in net/http (whose
// WriteHeader would panic on it when the response goes out, or on every replay): the panic
// rolls the handler's transaction back and releases its key like any handler panic, so such a
// code is never committed or stored.
func (b *buffer) WriteHeader(code int) {
	if b.status != 0 {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 200 {
		b.status = code
	}
}

// Write appends p to the body, or fails once the body would exceed the limit.
func (b *buffer) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	if b.limit >= 0 && b.body.Len()+len(p) > b.limit {
		b.overflow = true
		return 0, errResponseTooLarge
	}
	return b.body.Write(p)
}

// statusCode is the response's status: 200 when the handler set none, as net/http would send.
func (b *buffer) statusCode() int {
	if b.status == 0 {
		return http.StatusOK
	}
	return b.status
}

// kept returns the headers of names that the response has, for storing.
func (b *buffer) kept(names []string) http.Header {
	h := http.Header{}
	for _, n := range names {
		if v := b.header.Values(n); len(v) > 0 {
			h[http.CanonicalHeaderKey(n)] = append([]string(nil), v...)
		}
	}
	return h
}

// writeTo sends the buffered response to w, with replayHeader set to "true" when not empty.
func (b *buffer) writeTo(w http.ResponseWriter, replayHeader string) {
	dst := w.Header()
	for k, v := range b.header {
		dst[k] = v
	}
	if replayHeader != "" {
		dst.Set(replayHeader, "true")
	}
	dst.Set("Content-Length", strconv.Itoa(b.body.Len()))
	w.WriteHeader(b.statusCode())
	_, _ = w.Write(b.body.Bytes())
}

// ContentTypeProblem is the media type of the middleware's own error bodies (RFC 9457).
const ContentTypeProblem = "application/problem+json"

// Problem is the body of the middleware's own error answers (RFC 9457 problem details): 400
// for a missing or malformed key, 401 without a principal, 409 while the key is in flight, 413
// for a body over the limit, 422 for a key reused with another request, 500 and 503 when nothing
// was done.
type Problem struct {
	// Type is always "about:blank": the status says what kind of problem it is.
	Type string `json:"type"`
	// Title is the status text ("Conflict").
	Title string `json:"title"`
	// Status repeats the HTTP status.
	Status int `json:"status"`
	// Detail says what the client can do about it.
	Detail string `json:"detail"`
}

// writeProblem answers with a problem body and the extra headers, and returns status.
func writeProblem(w http.ResponseWriter, status int, detail string, extra map[string]string) int {
	b, _ := json.Marshal(Problem{Type: "about:blank", Title: statusText(status), Status: status, Detail: detail})
	b = append(b, '\n')
	for k, v := range extra {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", ContentTypeProblem)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
	return status
}
