package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// JSONHandler adapts a handler of typed events: it decodes each message's payload into a fresh
// T and calls fn with it, in the claim's transaction. A payload that does not decode (not JSON,
// trailing data, a field of the wrong type) is a permanent invalid_payload error: it goes to
// the dead-letter queue and is never retried, since no redelivery can make it decode.
func JSONHandler[T any, TTx any](fn func(ctx context.Context, tx TTx, msg Message, event T) error) Handler[TTx] {
	return func(ctx context.Context, tx TTx, msg Message) error {
		var event T
		if err := decodeJSON(msg.Payload, &event); err != nil {
			return Permanent(fmt.Errorf("%w: payload does not decode into %T: %w", ErrInvalidPayload, event, err))
		}
		return fn(ctx, tx, msg, event)
	}
}

// decodeJSON decodes exactly one JSON value into v; anything after it is an error.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("payload is empty")
		}
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("payload has data after its JSON value")
	}
	return nil
}

// Router sends each message to the handler registered for its Message.Type, so one consumer
// (one claim key space, one effect version) can apply several event types. Register handlers
// with Handle before the consumer starts; a Router is read-only afterwards.
type Router[TTx any] struct {
	routes   map[string]Handler[TTx]
	fallback Handler[TTx]
}

// NewRouter returns an empty Router. Messages of a type it has no handler for are refused as
// permanent invalid_payload errors unless a Fallback is set.
func NewRouter[TTx any]() *Router[TTx] {
	return &Router[TTx]{routes: map[string]Handler[TTx]{}}
}

// Handle registers h for eventType and returns the router, for chaining. Like http.ServeMux it
// panics on a programming error: an empty type, a nil handler, or a type registered twice.
func (r *Router[TTx]) Handle(eventType string, h Handler[TTx]) *Router[TTx] {
	switch {
	case eventType == "":
		panic("idem: Router.Handle: empty event type")
	case h == nil:
		panic(fmt.Sprintf("idem: Router.Handle: nil handler for event type %q", eventType))
	}
	if _, dup := r.routes[eventType]; dup {
		panic(fmt.Sprintf("idem: Router.Handle: event type %q registered twice", eventType))
	}
	r.routes[eventType] = h
	return r
}

// Fallback sets the handler for types without a registered handler and returns the router.
func (r *Router[TTx]) Fallback(h Handler[TTx]) *Router[TTx] {
	r.fallback = h
	return r
}

// Types lists the registered event types, sorted.
func (r *Router[TTx]) Types() []string {
	types := make([]string, 0, len(r.routes))
	for t := range r.routes {
		types = append(types, t)
	}
	sort.Strings(types)
	return types
}

// Handler returns the routing handler to put in ConsumerConfig.Handler.
func (r *Router[TTx]) Handler() Handler[TTx] {
	return func(ctx context.Context, tx TTx, msg Message) error {
		if h, ok := r.routes[msg.Type]; ok {
			return h(ctx, tx, msg)
		}
		if r.fallback != nil {
			return r.fallback(ctx, tx, msg)
		}
		return Permanent(fmt.Errorf("%w: no handler for event type %s (known: %s)", ErrInvalidPayload,
			quoteBounded(msg.Type), strings.Join(r.Types(), ", ")))
	}
}

// quoteBounded quotes s for an error text, cut to 64 bytes so hostile input stays bounded.
func quoteBounded(s string) string {
	const limit = 64
	if len(s) <= limit {
		return fmt.Sprintf("%q", s)
	}
	cut := limit
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q…", s[:cut])
}

// utf8RuneStart reports whether b can start a UTF-8 sequence.
func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
