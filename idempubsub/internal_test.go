package idempubsub

import (
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
