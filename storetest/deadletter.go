package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// ExerciseDeadLetters checks a dead letter store through idemstore.DeadLetterStore: one pending row per
// delivery (consumer, key, fingerprint) that a repeat failure updates, status changes of pending
// rows only with one audit row each, recovery recorded once for replayed rows, the list filters,
// the default limit and the stats. A store that is no idemstore.DeadLetterStore is skipped.
func ExerciseDeadLetters[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	t.Run("Insert", func(t *testing.T) { checkDeadLetterInsert(t, factory) })
	t.Run("StatusAndAudit", func(t *testing.T) { checkDeadLetterStatusAndAudit(t, factory) })
	t.Run("List", func(t *testing.T) { checkListDeadLetters(t, factory) })
	t.Run("Owner", func(t *testing.T) { checkDeadLetterOwner(t, factory) })
}

// checkDeadLetterOwner: the consumer's owner is stored with the dead letter, read back by get
// and list, updated by the upsert of a pending delivery, and refused when it is not a valid
// owner (idem.ValidateOwner).
func checkDeadLetterOwner[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Parallel()
	ctx := context.Background()
	ds := deadLettersOf(t, factory)
	now := utcNow()

	in := newDeadLetter("ledger@v1", "acme", "e-owner", idem.ReasonPermanentError, fingerprintOf(7), now)
	in.Owner, in.Topic = "payments", "payments.captured.eu"
	got, err := ds.InsertDeadLetter(ctx, in)
	require.NoError(t, err)
	require.Equal(t, "payments", got.Owner)
	require.Equal(t, "payments.captured.eu", got.Topic, "the topic it arrived on, where a replay goes")
	back, err := ds.GetDeadLetter(ctx, got.ID)
	require.NoError(t, err)
	require.Equal(t, "payments", back.Owner)
	require.Equal(t, "payments.captured.eu", back.Topic)

	none, err := ds.InsertDeadLetter(ctx, newDeadLetter("mailer@v1", "acme", "e-none", idem.ReasonPermanentError, fingerprintOf(8), now))
	require.NoError(t, err)
	require.Empty(t, none.Owner, "no owner is stored as none")

	// The consumer changed hands; its next failure of the same delivery says so.
	in.Owner, in.Attempts = "ledger-oncall", 2
	again, err := ds.InsertDeadLetter(ctx, in)
	require.NoError(t, err)
	require.Equal(t, got.ID, again.ID)
	require.Equal(t, "ledger-oncall", again.Owner)
	list, err := ds.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: "ledger@v1"})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, "ledger-oncall", list[0].Owner)
	byOwner, err := ds.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Owner: "ledger-oncall"})
	require.NoError(t, err)
	require.Len(t, byOwner, 1, "the filter by owner")
	require.Equal(t, got.ID, byOwner[0].ID)
	byOwner, err = ds.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Owner: "payments"})
	require.NoError(t, err)
	require.Empty(t, byOwner, "the owner it had before the upsert")

	// The audit says where a replay went.
	changed, err := ds.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{IDs: []int64{got.ID}, Status: idem.DeadLetterReplayed,
		Actor: "alice", Reason: "fixed", Destination: "payments.captured.eu", Now: now})
	require.NoError(t, err)
	require.Equal(t, []int64{got.ID}, changed)
	changed, err = ds.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{IDs: []int64{none.ID}, Status: idem.DeadLetterDiscarded,
		Actor: "alice", Reason: "test data", Now: now})
	require.NoError(t, err)
	require.Equal(t, []int64{none.ID}, changed)
	audit, err := ds.ListAudit(ctx, 10)
	require.NoError(t, err)
	dest := map[int64]string{}
	for _, a := range audit {
		dest[a.DeadLetterID] = a.Destination
	}
	require.Equal(t, "payments.captured.eu", dest[got.ID])
	require.Empty(t, dest[none.ID], "a discard goes nowhere")

	bad := newDeadLetter("ledger@v1", "acme", "e-bad", idem.ReasonPermanentError, fingerprintOf(9), now)
	bad.Owner = "Payments Team\n"
	_, err = ds.InsertDeadLetter(ctx, bad)
	requireErrorNames(t, err, "owner")
}

// deadLettersOf builds a store and returns it as a dead letter store, skipping the test when it
// is none.
func deadLettersOf[TTx any](t *testing.T, factory Factory[TTx]) idemstore.DeadLetterStore {
	t.Helper()
	ds, ok := factory(t).Store.(idemstore.DeadLetterStore)
	if !ok {
		t.Skip("the store keeps no dead letters (not an idemstore.DeadLetterStore)")
	}
	return ds
}

// requireErrorNames checks that err is an error whose text holds want, ignoring case: the stores
// name the field in the caller's spelling (Consumer) or the column's (consumer).
func requireErrorNames(t *testing.T, err error, want string) {
	t.Helper()
	require.Error(t, err)
	require.Contains(t, strings.ToLower(err.Error()), strings.ToLower(want))
}

// utcNow is the current time in UTC at whole microseconds, the stores' precision.
func utcNow() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

// fingerprintOf is a fingerprint whose every byte is b.
func fingerprintOf(b byte) idem.Fingerprint {
	var f idem.Fingerprint
	for i := range f {
		f[i] = b
	}
	return f
}

// newDeadLetter is a dead letter of a payment event that failed once at at.
func newDeadLetter(consumer, tenant, eventID string, reason idem.Reason, f idem.Fingerprint, at time.Time) idem.DeadLetter {
	return idem.DeadLetter{
		Consumer:    consumer,
		Message:     idem.Message{EventID: eventID, Tenant: tenant, Type: "payment.captured", Payload: []byte(`{}`)},
		Fingerprint: f,
		Reason:      reason,
		Error:       "boom",
		Attempts:    1,
		FirstFailed: at,
		LastFailed:  at,
		Source:      "queue:payments",
	}
}

// checkDeadLetterInsert: insert, read back, the upsert of a pending delivery, validation.
func checkDeadLetterInsert[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Parallel()
	ctx := context.Background()
	ds := deadLettersOf(t, factory)
	t0 := utcNow().Add(-time.Hour)

	in := idem.DeadLetter{
		Consumer: "ledger@v1",
		Message: idem.Message{EventID: "e1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"a":1}`),
			Headers: map[string]string{"trace": "t1"}, PublishedAt: t0.Add(-time.Minute), OccurredAt: t0.Add(-2 * time.Minute)},
		Fingerprint: fingerprintOf(7),
		Reason:      idem.ReasonRetriesExhausted,
		Error:       "timeout",
		Attempts:    5,
		FirstFailed: t0,
		LastFailed:  t0.Add(time.Minute),
		Source:      "queue:payments",
	}
	got, err := ds.InsertDeadLetter(ctx, in)
	require.NoError(t, err)
	require.NotZero(t, got.ID)
	want := in
	want.ID = got.ID
	want.Status = idem.DeadLetterPending
	require.Equal(t, want, got, "returned as stored")
	read, err := ds.GetDeadLetter(ctx, got.ID)
	require.NoError(t, err)
	require.Equal(t, want, read)

	// The same delivery again updates the pending row.
	again := in
	again.Attempts = 6
	again.Error = "timeout again"
	again.Reason = idem.ReasonPermanentError
	again.FirstFailed = t0.Add(10 * time.Minute)
	again.LastFailed = t0.Add(10 * time.Minute)
	upd, err := ds.InsertDeadLetter(ctx, again)
	require.NoError(t, err)
	require.Equal(t, got.ID, upd.ID, "one pending row per delivery")
	require.Equal(t, 6, upd.Attempts)
	require.Equal(t, "timeout again", upd.Error)
	require.Equal(t, idem.ReasonPermanentError, upd.Reason)
	require.Equal(t, t0, upd.FirstFailed, "first failure kept")
	require.Equal(t, t0.Add(10*time.Minute), upd.LastFailed)

	// Another fingerprint, or a zero one, is another delivery; the zero one also dedups.
	other := in
	other.Fingerprint = fingerprintOf(8)
	o, err := ds.InsertDeadLetter(ctx, other)
	require.NoError(t, err)
	require.NotEqual(t, got.ID, o.ID)
	zero := in
	zero.Fingerprint = idem.Fingerprint{}
	z1, err := ds.InsertDeadLetter(ctx, zero)
	require.NoError(t, err)
	z2, err := ds.InsertDeadLetter(ctx, zero)
	require.NoError(t, err)
	require.Equal(t, z1.ID, z2.ID)
	require.True(t, z2.Fingerprint.IsZero())

	// Once replayed, a new failure is a new pending row.
	ids, err := ds.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{
		IDs: []int64{got.ID}, Status: idem.DeadLetterReplayed, Actor: "ops", Now: utcNow()})
	require.NoError(t, err)
	require.Equal(t, []int64{got.ID}, ids)
	fresh, err := ds.InsertDeadLetter(ctx, in)
	require.NoError(t, err)
	require.NotEqual(t, got.ID, fresh.ID)
	require.Equal(t, idem.DeadLetterPending, fresh.Status)

	// Validation names the event.
	// A message that arrived without an event id is kept all the same.
	noID, err := ds.InsertDeadLetter(ctx, idem.DeadLetter{Consumer: "c", Reason: idem.ReasonInvalidPayload, Fingerprint: idem.Fingerprint{1}})
	require.NoError(t, err)
	require.Empty(t, noID.Message.EventID)
	_, err = ds.InsertDeadLetter(ctx, idem.DeadLetter{Message: idem.Message{EventID: "e9"}, Reason: idem.ReasonTooOld})
	requireErrorNames(t, err, "consumer is empty") // the caller (the consumer) adds the event id once

	_, err = ds.GetDeadLetter(ctx, 424242)
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.ErrorContains(t, err, "424242")
}

// checkDeadLetterStatusAndAudit: status changes of pending rows, their audit, recovery once.
func checkDeadLetterStatusAndAudit[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Parallel()
	ctx := context.Background()
	ds := deadLettersOf(t, factory)
	t0 := utcNow().Add(-time.Hour)
	var ids []int64
	for _, ev := range []string{"e1", "e2", "e3"} {
		dl, err := ds.InsertDeadLetter(ctx, newDeadLetter("ledger@v1", "acme", ev, idem.ReasonPermanentError, fingerprintOf(1), t0))
		require.NoError(t, err)
		ids = append(ids, dl.ID)
	}
	t1 := utcNow()
	changed, err := ds.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{
		IDs: []int64{ids[1], ids[0], 9999}, Status: idem.DeadLetterReplayed, Actor: "alice", Reason: "fixed bug", Now: t1})
	require.NoError(t, err)
	require.Equal(t, []int64{ids[0], ids[1]}, changed, "unknown ids skipped, ordered")

	// Only pending rows move: e1 is replayed already.
	t2 := t1.Add(time.Second)
	changed, err = ds.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{
		IDs: []int64{ids[0], ids[2]}, Status: idem.DeadLetterDiscarded, Actor: "bob", Reason: "spam", Now: t2})
	require.NoError(t, err)
	require.Equal(t, []int64{ids[2]}, changed)

	dl, err := ds.GetDeadLetter(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, idem.DeadLetterReplayed, dl.Status)

	audit, err := ds.ListAudit(ctx, 0)
	require.NoError(t, err)
	require.Len(t, audit, 3, "one audit row per change")
	strip := func(a idemstore.AuditEntry) idemstore.AuditEntry { a.ID = 0; return a }
	require.Equal(t, idemstore.AuditEntry{At: t2, Actor: "bob", Action: "discard", DeadLetterID: ids[2], EventID: "e3", Reason: "spam"}, strip(audit[0]), "newest first")
	require.Equal(t, idemstore.AuditEntry{At: t1, Actor: "alice", Action: "replay", DeadLetterID: ids[1], EventID: "e2", Reason: "fixed bug"}, strip(audit[1]))
	require.Equal(t, idemstore.AuditEntry{At: t1, Actor: "alice", Action: "replay", DeadLetterID: ids[0], EventID: "e1", Reason: "fixed bug"}, strip(audit[2]))
	limited, err := ds.ListAudit(ctx, 1)
	require.NoError(t, err)
	require.Len(t, limited, 1)

	_, err = ds.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{IDs: ids, Status: idem.DeadLetterPending})
	requireErrorNames(t, err, `status "pending"`)

	// Recovery: the replayed rows of the key, once.
	key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "e1"}
	rec := t0.Add(3 * time.Hour)
	durs, err := ds.RecordRecovery(ctx, key, 0, rec)
	require.NoError(t, err)
	require.Equal(t, []time.Duration{3 * time.Hour}, durs)
	durs, err = ds.RecordRecovery(ctx, key, ids[0], rec.Add(time.Hour))
	require.NoError(t, err)
	require.Empty(t, durs, "already recorded")
	dl, err = ds.GetDeadLetter(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, rec, dl.RecoveredAt)
	durs, err = ds.RecordRecovery(ctx, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "e3"}, 0, rec)
	require.NoError(t, err)
	require.Empty(t, durs, "discarded, not replayed")
}

// checkListDeadLetters: the list filters, the default limit and the stats.
func checkListDeadLetters[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Parallel()
	ctx := context.Background()
	ds := deadLettersOf(t, factory)
	t0 := utcNow().Add(-24 * time.Hour)
	seed := []idem.DeadLetter{
		newDeadLetter("ledger@v1", "acme", "e1", idem.ReasonPermanentError, fingerprintOf(1), t0),
		newDeadLetter("ledger@v1", "globex", "e2", idem.ReasonKeyReuse, fingerprintOf(1), t0.Add(time.Hour)),
		newDeadLetter("mailer@v1", "acme", "e3", idem.ReasonPermanentError, fingerprintOf(1), t0.Add(2*time.Hour)),
		newDeadLetter("mailer@v1", "acme", "e4", idem.ReasonTooOld, fingerprintOf(1), t0.Add(3*time.Hour)),
	}
	var ids []int64
	for _, dl := range seed {
		got, err := ds.InsertDeadLetter(ctx, dl)
		require.NoError(t, err)
		ids = append(ids, got.ID)
	}
	_, err := ds.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{
		IDs: []int64{ids[3]}, Status: idem.DeadLetterDiscarded, Actor: "ops", Now: utcNow()})
	require.NoError(t, err)

	tests := []struct {
		name   string
		filter idemstore.DeadLetterFilter
		want   []string
	}{
		{"all", idemstore.DeadLetterFilter{}, []string{"e1", "e2", "e3", "e4"}},
		{"ids", idemstore.DeadLetterFilter{IDs: []int64{ids[2], ids[0]}}, []string{"e1", "e3"}},
		{"consumer", idemstore.DeadLetterFilter{Consumer: "mailer@v1"}, []string{"e3", "e4"}},
		{"tenant", idemstore.DeadLetterFilter{Tenant: "acme"}, []string{"e1", "e3", "e4"}},
		{"reason", idemstore.DeadLetterFilter{Reason: idem.ReasonPermanentError}, []string{"e1", "e3"}},
		{"status", idemstore.DeadLetterFilter{Status: idem.DeadLetterPending}, []string{"e1", "e2", "e3"}},
		{"older than", idemstore.DeadLetterFilter{OlderThan: t0.Add(2 * time.Hour)}, []string{"e1", "e2"}},
		{"limit", idemstore.DeadLetterFilter{Limit: 2}, []string{"e1", "e2"}},
		{"combined", idemstore.DeadLetterFilter{Tenant: "acme", Status: idem.DeadLetterPending, Reason: idem.ReasonPermanentError,
			OlderThan: t0.Add(90 * time.Minute)}, []string{"e1"}},
		{"none", idemstore.DeadLetterFilter{Consumer: "nobody"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ds.ListDeadLetters(ctx, tt.filter)
			require.NoError(t, err)
			var events []string
			for _, dl := range got {
				events = append(events, dl.Message.EventID)
			}
			require.Equal(t, tt.want, events)
		})
	}

	t.Run("stats", func(t *testing.T) {
		t.Parallel()
		st, err := ds.DeadLetterStats(ctx)
		require.NoError(t, err)
		require.Equal(t, idemstore.DeadLetterStats{
			Pending:       3,
			OldestPending: t0,
			ByReason:      map[idem.Reason]int64{idem.ReasonPermanentError: 2, idem.ReasonKeyReuse: 1},
		}, st)
	})

	t.Run("default limit", func(t *testing.T) {
		t.Parallel()
		other := deadLettersOf(t, factory)
		for i := range 120 {
			_, err := other.InsertDeadLetter(ctx, newDeadLetter("c@v1", "", string(rune('a'+i%26))+string(rune('0'+i/26)), idem.ReasonTooOld, fingerprintOf(1), t0))
			require.NoError(t, err)
		}
		got, err := other.ListDeadLetters(ctx, idemstore.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, got, 100)
		st, err := other.DeadLetterStats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 120, st.Pending)
	})
}
