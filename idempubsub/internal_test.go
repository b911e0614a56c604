package idempubsub

import (
	"fmt"
	"testing"
	"time"
)

// TestSeconds: ack deadlines are whole seconds, rounded up, capped at Pub/Sub's 600 s.
func TestSeconds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   time.Duration
		want int32
	}{
		{0, 0},
		{-time.Second, 0},
		{time.Millisecond, 1},
		{time.Second, 1},
		{1500 * time.Millisecond, 2},
		{10 * time.Minute, 600},
		{time.Hour, 600},
	}
	for _, tc := range cases {
		if got := seconds(tc.in); got != tc.want {
			t.Errorf("seconds(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// len is how many ids a are counting.
func (a *attemptCounts) len() int { return len(a.cur) + len(a.prev) }

// TestAttemptCounts: a message's count goes on while it keeps coming back, a settled one starts
// again, and ids that are never settled here (another source of the subscription acked them)
// stay bounded at two generations instead of growing for the life of the process.
func TestAttemptCounts(t *testing.T) {
	t.Parallel()
	const max = 4
	a := newAttemptCounts(max)
	if n := a.next("x"); n != 1 {
		t.Fatalf("first delivery: attempt %d, want 1", n)
	}
	for i := range 100 {
		a.next(fmt.Sprintf("other-%d", i)) // settled elsewhere: never forgotten here
		if i%3 == 0 {
			want := 2 + i/3
			if n := a.next("x"); n != want {
				t.Fatalf("after %d other ids: attempt %d, want %d (a message still going round keeps its count)", i+1, n, want)
			}
		}
		if l := a.len(); l > 2*max {
			t.Fatalf("after %d other ids: %d ids counted, want at most %d", i+1, l, 2*max)
		}
	}
	a.forget("x")
	if n := a.next("x"); n != 1 {
		t.Errorf("after forget: attempt %d, want 1", n)
	}
	if n := a.next("other-0"); n != 1 {
		t.Errorf("an id not seen for %d others: attempt %d, want 1 (dropped with its generation)", 100, n)
	}
	if n := a.next("other-99"); n != 2 {
		t.Errorf("an id of the current generation: attempt %d, want 2", n)
	}
}
