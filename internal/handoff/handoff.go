// Package handoff passes one background read's result to the Receive waiting for it, or, once
// that Receive gave up on its context, back to the read, so that exactly one side owns the
// result. The transports whose Receive starts a read it may abandon (idempubsub, idemredis) use
// it, so a Receive returning just as its read finishes never strands the read's messages for a
// whole lease.
package handoff

import "sync"

// Handoff carries at most one result of type T from a read to a Receive.
type Handoff[T any] struct {
	mu        sync.Mutex
	abandoned bool
	done      chan T // buffered: Put never blocks
}

// New returns a Handoff for one read.
func New[T any]() *Handoff[T] { return &Handoff[T]{done: make(chan T, 1)} }

// Done delivers the result Put handed over, for the Receive to select on.
func (h *Handoff[T]) Done() <-chan T { return h.done }

// Put hands r to the Receive; false means it gave up, and the caller must give r's messages
// back. The send happens under the lock, so Abandon either sees r or makes Put refuse it.
func (h *Handoff[T]) Put(r T) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.abandoned {
		return false
	}
	h.done <- r
	return true
}

// Abandon records that the Receive gave up and returns the result Put handed over before, if
// any, for the Receive to give back.
func (h *Handoff[T]) Abandon() (T, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.abandoned = true
	select {
	case r := <-h.done:
		return r, true
	default:
		var zero T
		return zero, false
	}
}
