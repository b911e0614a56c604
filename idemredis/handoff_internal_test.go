package idemredis

import (
	"sync"
	"testing"
)

// TestHandoffOrders: whichever of put and abandon comes first, the result is taken by exactly
// one side — the Receive (through done or abandon) or the read, which gives it back.
func TestHandoffOrders(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name          string
		putFirst      bool
		wantPut       bool // put handed the result over
		wantAbandoned bool // abandon returned it
	}{
		{name: "put then abandon", putFirst: true, wantPut: true, wantAbandoned: true},
		{name: "abandon then put", putFirst: false, wantPut: false, wantAbandoned: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHandoff()
			r := received{ds: []*Delivery{{id: "1-0"}}}
			var put, abandoned bool
			var got received
			if tc.putFirst {
				put = h.put(r)
				got, abandoned = h.abandon()
			} else {
				got, abandoned = h.abandon()
				put = h.put(r)
			}
			if put != tc.wantPut || abandoned != tc.wantAbandoned {
				t.Fatalf("put = %v, abandon = %v; want %v, %v", put, abandoned, tc.wantPut, tc.wantAbandoned)
			}
			if abandoned && len(got.ds) != 1 {
				t.Fatalf("abandon returned %d deliveries, want the 1 put handed over", len(got.ds))
			}
			if len(h.done) != 0 {
				t.Fatal("a result is left in done after abandon: nobody will read it")
			}
		})
	}
}

// TestHandoffRace: put and abandon racing many times never lose a result: each is either
// refused by put (the read gives it back) or returned by abandon (the Receive gives it back).
// Before handoff, a read that saw the Receive still waiting could send after the Receive had
// looked and returned, stranding its messages for a lease.
func TestHandoffRace(t *testing.T) {
	t.Parallel()
	const runs = 2000
	lost := 0
	for range runs {
		h := newHandoff()
		var put bool
		var wg sync.WaitGroup
		wg.Go(func() { put = h.put(received{ds: []*Delivery{{id: "1-0"}}}) })
		_, abandoned := h.abandon()
		wg.Wait()
		if put != abandoned {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d results were neither refused nor returned by abandon", lost, runs)
	}
}
