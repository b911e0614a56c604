package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemstore"
)

// ExerciseLeases checks a lease store through idemstore.LeaseStore: a free or expired lease goes to
// the asker with a larger token, its owner renews it keeping the token, only the owner releases
// it, LeaseList lists the unexpired leases of a prefix (no wildcards), a lease holds to the
// millisecond of its end, and an empty owner or a zero TTL is refused. A store that is no
// idemstore.LeaseStore is skipped.
func ExerciseLeases[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	ctx := context.Background()
	ls, ok := factory(t).Store.(idemstore.LeaseStore)
	if !ok {
		t.Skip("the store has no leases (not an idemstore.LeaseStore)")
	}
	t0 := utcNow()
	acquire := func(name, owner string, at time.Time) (int64, bool) {
		t.Helper()
		tok, ok, err := ls.LeaseAcquire(ctx, idemstore.LeaseParams{Name: name, Owner: owner, TTL: time.Minute, Now: at})
		require.NoError(t, err)
		return tok, ok
	}
	steps := []struct {
		name      string
		owner     string
		at        time.Time
		wantToken int64
		wantOK    bool
	}{
		{"free lease", "a", t0, 1, true},
		{"held by another", "b", t0.Add(30 * time.Second), 0, false},
		{"renewed by owner keeps token", "a", t0.Add(30 * time.Second), 1, true},
		{"renewal extended it", "b", t0.Add(70 * time.Second), 0, false},
		{"stolen after expiry", "b", t0.Add(91 * time.Second), 2, true},
		{"old owner is out", "a", t0.Add(100 * time.Second), 0, false},
		{"old owner back after expiry", "a", t0.Add(10 * time.Minute), 3, true},
	}
	for _, s := range steps {
		tok, ok := acquire("relay/p0", s.owner, s.at)
		require.Equal(t, s.wantOK, ok, s.name)
		require.Equal(t, s.wantToken, tok, s.name)
	}

	t1 := t0.Add(10 * time.Minute)
	// Release only works for the owner, and the next owner's token is larger.
	require.NoError(t, ls.LeaseRelease(ctx, "relay/p0", "b"))
	_, ok = acquire("relay/p0", "b", t1)
	require.False(t, ok, "a release by a non-owner does nothing")
	require.NoError(t, ls.LeaseRelease(ctx, "relay/p0", "a"))
	tok, ok := acquire("relay/p0", "b", t1)
	require.True(t, ok)
	require.EqualValues(t, 4, tok)

	// LeaseList: unexpired, by prefix ("_" is no wildcard), by name.
	_, ok = acquire("relay/p1", "c", t1)
	require.True(t, ok)
	_, ok = acquire("relay/p2", "c", t1.Add(-2*time.Minute)) // expired at t1
	require.True(t, ok)
	_, ok = acquire("relayXp3", "c", t1)
	require.True(t, ok)
	_, ok = acquire("members/c", "c", t1)
	require.True(t, ok)

	list, err := ls.LeaseList(ctx, "relay/", t1)
	require.NoError(t, err)
	require.Equal(t, []idemstore.Lease{
		{Name: "relay/p0", Owner: "b", Token: 4, LeaseUntil: t1.Add(time.Minute)},
		{Name: "relay/p1", Owner: "c", Token: 1, LeaseUntil: t1.Add(time.Minute)},
	}, list)
	list, err = ls.LeaseList(ctx, "relay_", t1)
	require.NoError(t, err)
	require.Empty(t, list)
	list, err = ls.LeaseList(ctx, "", t1)
	require.NoError(t, err)
	require.Len(t, list, 4)

	// A lease holds to the millisecond of its end, on the Now it is given: the relay cuts its
	// publishes off a tenth of the TTL before that end, which is a margin only if the store
	// lets no one else take the lease sooner (a store that compares whole seconds, or its own
	// clock, would).
	te := t1.Add(time.Hour)
	_, ok = acquire("edge/p0", "a", te)
	require.True(t, ok)
	_, ok = acquire("edge/p0", "b", te.Add(time.Minute-time.Millisecond))
	require.False(t, ok, "the lease was taken a millisecond before its end")
	_, ok = acquire("edge/p0", "b", te.Add(time.Minute+time.Millisecond))
	require.True(t, ok, "the lease was not free a millisecond after its end")

	_, _, err = ls.LeaseAcquire(ctx, idemstore.LeaseParams{Name: "x", Owner: "", TTL: time.Second})
	require.ErrorContains(t, err, "owner")
	_, _, err = ls.LeaseAcquire(ctx, idemstore.LeaseParams{Name: "x", Owner: "a"})
	require.ErrorContains(t, err, "TTL")
}
