package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// outboxOf returns the bundle's store as an outbox, skipping the test when it has none.
func outboxOf[TTx any](t *testing.T, b Bundle[TTx]) idemstore.OutboxStore[TTx] {
	t.Helper()
	ob, ok := b.Store.(idemstore.OutboxStore[TTx])
	if !ok {
		t.Skip("the store has no outbox (not an idemstore.OutboxStore)")
	}
	return ob
}

// outgoingEvent is an outgoing event with ordering key key.
func outgoingEvent(eventID, key string) idem.Outgoing {
	return idem.Outgoing{EventID: eventID, Tenant: "acme", Topic: "payments", Key: key, Type: "payment.captured",
		Payload: []byte(`{"id":"` + eventID + `"}`)}
}

// enqueueOutgoing commits msgs to the outbox in one transaction of the store.
func enqueueOutgoing[TTx any](t *testing.T, store idemstore.Store[TTx], ob idemstore.OutboxStore[TTx], msgs ...idem.Outgoing) {
	t.Helper()
	require.NoError(t, store.InTx(context.Background(), func(ctx context.Context, tx TTx) error {
		return ob.EnqueueTx(ctx, tx, msgs...)
	}), "enqueue")
}

// allOutboxPartitions lists every partition of the outbox.
func allOutboxPartitions(ob idemstore.OutboxRelayStore) []int {
	ps := make([]int, ob.OutboxPartitions())
	for i := range ps {
		ps[i] = i
	}
	return ps
}

// outboxEventIDs lists the event ids of rows, in order.
func outboxEventIDs(rows []idemstore.OutboxRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.Outgoing.EventID
	}
	return out
}

// ExerciseOutboxHeldRows checks that the outbox keeps a row's first attempt time (the relay's
// budget counts from it), and that a dead row with a dead letter stays in the fetch, holding its
// key and merged in id order with live rows under the limit, until it is marked published; a
// dead row without one (written before the dead letter id existed) is out of the way. A store
// that is no idemstore.OutboxStore is skipped.
func ExerciseOutboxHeldRows[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	ctx := context.Background()
	b := factory(t)
	ob := outboxOf(t, b)
	enqueueOutgoing(t, b.Store, ob, outgoingEvent("e1", "k"), outgoingEvent("e2", "k"), outgoingEvent("e3", "j"))
	parts := allOutboxPartitions(ob)
	fetchN := func(limit int) []idemstore.OutboxRow {
		rows, err := ob.OutboxFetch(ctx, idemstore.OutboxFetchParams{Partitions: parts, Limit: limit})
		require.NoError(t, err)
		return rows
	}
	fetch := func() []idemstore.OutboxRow { return fetchN(10) }
	now := func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
	rows := fetch()
	require.Equal(t, []string{"e1", "e2", "e3"}, outboxEventIDs(rows), "enqueue order")
	require.True(t, rows[0].FirstAttemptAt.IsZero(), "never tried")

	first := now().Add(-time.Hour)
	require.NoError(t, ob.OutboxMarkFailed(ctx, idemstore.OutboxFailParams{
		ID: rows[0].ID, Attempts: 1, LastError: "down", NextAttemptAt: now(), FirstAttemptAt: first}))
	got := fetch()[0]
	require.Equal(t, first, got.FirstAttemptAt, "first attempt")
	require.False(t, got.Dead)

	require.NoError(t, ob.OutboxMarkFailed(ctx, idemstore.OutboxFailParams{
		ID: rows[0].ID, Attempts: 2, LastError: "gave up", NextAttemptAt: now(), FirstAttemptAt: first, Dead: true, DeadLetterID: 42}))
	require.NoError(t, ob.OutboxMarkFailed(ctx, idemstore.OutboxFailParams{
		ID: rows[2].ID, Attempts: 1, LastError: "no dead letter", NextAttemptAt: now(), Dead: true}))
	held := fetch()
	require.Equal(t, []string{"e1", "e2"}, outboxEventIDs(held), "the dead row with a dead letter stays; the one without is gone")
	require.True(t, held[0].Dead)
	require.EqualValues(t, 42, held[0].DeadLetterID)
	require.Equal(t, first, held[0].FirstAttemptAt, "first attempt of the held row")

	require.Equal(t, []string{"e1"}, outboxEventIDs(fetchN(1)), "dead and live rows merge in id order under the limit")

	require.NoError(t, ob.OutboxMarkPublished(ctx, []int64{held[0].ID}, now()))
	require.Equal(t, []string{"e2"}, outboxEventIDs(fetch()), "released")
}
