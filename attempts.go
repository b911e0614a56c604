package idem

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"time"
)

// FirstAttempter is a Delivery that knows when its message was first delivered to a consumer
// (the queue table records its first fetch). The retry budget's elapsed time counts from it;
// for a delivery that does not implement it, or reports zero, the consumer uses the first
// attempt it saw itself.
type FirstAttempter interface {
	FirstAttempt() time.Time
}

// attemptMemoSize bounds the attempts a consumer remembers. Only events between a failed
// attempt and their verdict are kept, so the bound is rarely reached; when it is, the oldest
// entry goes, and that event's budget starts again at its next attempt (more retries, never
// fewer).
const attemptMemoSize = 1 << 16

// attemptMemo remembers, per event a consumer is retrying, when it first saw it and how many of
// its deliveries ended without a verdict (a lost lease, a give-back at shutdown or pause): the
// retry budget counts from the first attempt, not from PublishedAt, and only deliveries that
// reached a verdict spend attempts. It lives as long as the Consumer, across Runs.
type attemptMemo struct {
	mu      sync.Mutex
	entries map[attemptKey]*list.Element
	order   *list.List // of *attemptEntry, oldest first
	limit   int
}

// attemptKey is a hash of the source, tenant and event id as delivered: bounded whatever the
// identity's size.
type attemptKey [32]byte

type attemptEntry struct {
	key       attemptKey
	first     time.Time
	noVerdict int
}

func newAttemptMemo(limit int) *attemptMemo {
	return &attemptMemo{entries: map[attemptKey]*list.Element{}, order: list.New(), limit: limit}
}

func makeAttemptKey(source string, msg Message) attemptKey {
	h := sha256.New()
	for _, f := range []string{source, msg.Tenant, msg.EventID} {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var k attemptKey
	h.Sum(k[:0])
	return k
}

// entry returns k's entry, creating it (and evicting the oldest when full). Callers hold mu.
func (m *attemptMemo) entry(k attemptKey) *attemptEntry {
	if el, ok := m.entries[k]; ok {
		return el.Value.(*attemptEntry)
	}
	if m.order.Len() >= m.limit {
		oldest := m.order.Front()
		delete(m.entries, oldest.Value.(*attemptEntry).key)
		m.order.Remove(oldest)
	}
	e := &attemptEntry{key: k}
	m.entries[k] = m.order.PushBack(e)
	return e
}

// begin records an attempt at now and returns when the event was first attempted and how many
// of its deliveries ended without a verdict.
func (m *attemptMemo) begin(k attemptKey, now time.Time) (first time.Time, noVerdict int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entry(k)
	if e.first.IsZero() {
		e.first = now
	}
	return e.first, e.noVerdict
}

// abandon counts a delivery of k that ended without a verdict.
func (m *attemptMemo) abandon(k attemptKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entry(k).noVerdict++
}

// forget drops k once its event reached a final verdict (applied, duplicate, dead-lettered).
func (m *attemptMemo) forget(k attemptKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if el, ok := m.entries[k]; ok {
		delete(m.entries, k)
		m.order.Remove(el)
	}
}

// len reports how many events the memo holds.
func (m *attemptMemo) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.order.Len()
}
