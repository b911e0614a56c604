package handoff_test

import (
	"sync"
	"testing"

	"github.com/idemkit/idem/internal/handoff"
)

// TestOrders: whichever of Put and Abandon comes first, the result is taken by exactly one side
// — the Receive (through Done or Abandon) or the read, which gives it back.
func TestOrders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		putFirst      bool
		wantPut       bool // Put handed the result over
		wantAbandoned bool // Abandon returned it
	}{
		{name: "put then abandon", putFirst: true, wantPut: true, wantAbandoned: true},
		{name: "abandon then put", putFirst: false, wantPut: false, wantAbandoned: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := handoff.New[[]string]()
			r := []string{"a"}
			var (
				put, abandoned bool
				got            []string
			)
			if tc.putFirst {
				put = h.Put(r)
				got, abandoned = h.Abandon()
			} else {
				got, abandoned = h.Abandon()
				put = h.Put(r)
			}
			if put != tc.wantPut || abandoned != tc.wantAbandoned {
				t.Fatalf("Put = %v, Abandon = %v; want %v, %v", put, abandoned, tc.wantPut, tc.wantAbandoned)
			}
			if abandoned && len(got) != 1 {
				t.Fatalf("Abandon returned %d messages, want the 1 Put handed over", len(got))
			}
			select {
			case <-h.Done():
				t.Fatal("a result is left in Done after Abandon: nobody will read it")
			default:
			}
		})
	}
}

// TestRace: Put and Abandon racing many times never lose a result: each is either refused by
// Put (the read gives it back) or returned by Abandon (the Receive gives it back).
func TestRace(t *testing.T) {
	t.Parallel()
	const runs = 2000
	lost := 0
	for range runs {
		h := handoff.New[int]()
		var put bool
		var wg sync.WaitGroup
		wg.Go(func() { put = h.Put(1) })
		_, abandoned := h.Abandon()
		wg.Wait()
		if put != abandoned {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d results were neither refused nor returned by Abandon", lost, runs)
	}
}
