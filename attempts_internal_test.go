package idem

import (
	"testing"
	"time"
)

func TestAttemptMemoIsBounded(t *testing.T) {
	t.Parallel()
	m := newAttemptMemo(3)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := func(id string) attemptKey { return makeAttemptKey("q", Message{EventID: id}) }
	for i, id := range []string{"a", "b", "c", "d"} {
		m.begin(key(id), t0.Add(time.Duration(i)*time.Minute))
	}
	if got := m.len(); got != 3 {
		t.Fatalf("memo holds %d entries, want the bound 3", got)
	}
	if first, _ := m.begin(key("a"), t0.Add(time.Hour)); !first.Equal(t0.Add(time.Hour)) {
		t.Fatalf("evicted entry a kept its first attempt %v; its budget should start again", first)
	}
	if first, _ := m.begin(key("d"), t0.Add(time.Hour)); !first.Equal(t0.Add(3 * time.Minute)) {
		t.Fatalf("entry d: first attempt %v, want %v", first, t0.Add(3*time.Minute))
	}
	m.abandon(key("d"))
	m.abandon(key("d"))
	if _, nv := m.begin(key("d"), t0); nv != 2 {
		t.Fatalf("entry d: %d deliveries without verdict, want 2", nv)
	}
	m.forget(key("d"))
	if first, nv := m.begin(key("d"), t0.Add(2*time.Hour)); nv != 0 || !first.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("forgotten entry came back as (%v, %d)", first, nv)
	}
	if makeAttemptKey("q", Message{Tenant: "a", EventID: "bc"}) == makeAttemptKey("q", Message{Tenant: "ab", EventID: "c"}) {
		t.Fatal("tenant and event id are not delimited in the key")
	}
}
