package idemotel

import (
	"context"
	"maps"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// headerCarrier adapts idem message headers to a propagation.TextMapCarrier. Get matches names
// case-insensitively: a broker or a proxy may have canonicalised "traceparent" on the way.
type headerCarrier map[string]string

var _ propagation.TextMapCarrier = headerCarrier(nil)

// Get returns the value of key, matched case-insensitively.
func (h headerCarrier) Get(key string) string {
	if v, ok := h[key]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

// Set stores value under key, replacing a header of the same name in any case.
func (h headerCarrier) Set(key, value string) {
	for k := range h {
		if k != key && strings.EqualFold(k, key) {
			delete(h, k)
		}
	}
	h[key] = value
}

// Keys lists the header names.
func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// Inject returns a copy of headers with the trace context of ctx added (traceparent and
// tracestate with the default propagator). headers itself is never changed: an outbox row or
// a message may share its map with the caller. For producers that write events by another
// path than Outbox (a queue table's QueuePublishTx, a hand-built Message).
func (t *Telemetry) Inject(ctx context.Context, headers map[string]string) map[string]string {
	out := make(map[string]string, len(headers)+2)
	maps.Copy(out, headers)
	t.propagator.Inject(ctx, headerCarrier(out))
	if len(out) == 0 {
		return headers // nothing to carry: keep nil as nil
	}
	return out
}

// Extract returns ctx with the remote span context found in headers as the parent of the next
// span started from it, and that span context; when headers carry none it returns ctx
// unchanged and an invalid span context. Baggage (with a propagator that carries it) is added
// to ctx's.
func (t *Telemetry) Extract(ctx context.Context, headers map[string]string) (context.Context, trace.SpanContext) {
	if len(headers) == 0 {
		return ctx, trace.SpanContext{}
	}
	// Hide ctx's own span, so that a span context found is the headers' and not ctx's.
	ectx := t.propagator.Extract(trace.ContextWithSpanContext(ctx, trace.SpanContext{}), headerCarrier(headers))
	sc := trace.SpanContextFromContext(ectx)
	if !sc.IsValid() {
		return ctx, sc
	}
	return ectx, sc
}
