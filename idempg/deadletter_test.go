package idempg_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/storetest"
)

func deadLetter(consumer, tenant, eventID string, reason idem.Reason, at time.Time) idem.DeadLetter {
	return idem.DeadLetter{
		Consumer: consumer,
		Message: idem.Message{
			EventID: eventID, Tenant: tenant, Type: "payment.captured",
			Payload:     []byte(`{"amount":1}`),
			Headers:     map[string]string{"Trace": eventID},
			PublishedAt: at.Add(-time.Minute),
		},
		Fingerprint: idem.Fingerprint{byte(len(eventID)), 7},
		Reason:      reason,
		Error:       "boom",
		Attempts:    1,
		FirstFailed: at,
		LastFailed:  at,
		Status:      idem.DeadLetterPending,
		Source:      "queue/payments",
	}
}

func ids(dls []idem.DeadLetter) []int64 {
	var out []int64
	for _, d := range dls {
		out = append(out, d.ID)
	}
	return out
}

func TestDeadLetterUpsert(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

	dl := deadLetter("ledger@v1", "acme", "evt-1", idem.ReasonRetriesExhausted, t0)
	first, err := store.InsertDeadLetter(ctx, dl)
	require.NoError(t, err)
	require.NotZero(t, first.ID)
	want := dl
	want.ID = first.ID
	require.Equal(t, want, first, "stored as given")

	// The same delivery fails again: the pending row is updated, its first failure kept.
	again := dl
	again.Attempts, again.Error, again.Reason = 5, "boom again", idem.ReasonPermanentError
	again.FirstFailed, again.LastFailed = t0.Add(time.Hour), t0.Add(time.Hour)
	second, err := store.InsertDeadLetter(ctx, again)
	require.NoError(t, err)
	require.Equal(t, first.ID, second.ID)
	require.Equal(t, 5, second.Attempts)
	require.Equal(t, "boom again", second.Error)
	require.Equal(t, idem.ReasonPermanentError, second.Reason)
	require.True(t, second.FirstFailed.Equal(t0))
	require.True(t, second.LastFailed.Equal(t0.Add(time.Hour)))
	got, err := store.GetDeadLetter(ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, second, got)

	// Other content under the same key is another delivery, so another row.
	other := dl
	other.Fingerprint = idem.Fingerprint{0xff}
	third, err := store.InsertDeadLetter(ctx, other)
	require.NoError(t, err)
	require.NotEqual(t, first.ID, third.ID)

	// A message that failed before its fingerprint was computed, twice: still one row, and
	// minimal fields come back as zero values.
	bare := idem.DeadLetter{Consumer: "ledger@v1", Message: idem.Message{EventID: "evt-bare"}, Reason: idem.ReasonInvalidPayload}
	b1, err := store.InsertDeadLetter(ctx, bare)
	require.NoError(t, err)
	b2, err := store.InsertDeadLetter(ctx, bare)
	require.NoError(t, err)
	require.Equal(t, b1.ID, b2.ID)
	require.True(t, b2.Fingerprint.IsZero())
	require.Nil(t, b2.Message.Headers)
	require.Nil(t, b2.Message.Payload)
	require.True(t, b2.Message.PublishedAt.IsZero())
	require.True(t, b2.Message.OccurredAt.IsZero())
	require.WithinDuration(t, time.Now(), b2.FirstFailed, time.Minute, "zero FirstFailed is now")
	require.True(t, b1.LastFailed.Equal(b1.FirstFailed), "zero LastFailed is FirstFailed")
	require.True(t, b2.FirstFailed.Equal(b1.FirstFailed), "first failure kept")

	// A message that arrived without an event id is kept all the same.
	noID, err := store.InsertDeadLetter(ctx, idem.DeadLetter{Consumer: "c", Reason: idem.ReasonInvalidPayload, Fingerprint: idem.Fingerprint{1}})
	require.NoError(t, err)
	require.Empty(t, noID.Message.EventID)

	_, err = store.GetDeadLetter(ctx, 987654321)
	require.ErrorIs(t, err, idem.ErrNotFound)
	require.ErrorContains(t, err, "987654321")
}

func TestDeadLetterStatusAuditRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var all []idem.DeadLetter
	for i := range 3 {
		dl, err := store.InsertDeadLetter(ctx, deadLetter("ledger@v1", "acme", fmt.Sprintf("evt-%d", i), idem.ReasonPermanentError, t0))
		require.NoError(t, err)
		all = append(all, dl)
	}

	for _, step := range []struct {
		what   string
		ids    []int64
		status idem.DeadLetterStatus
		want   []int64
	}{
		{"replay two and a missing id", []int64{all[1].ID, all[0].ID, 1 << 40}, idem.DeadLetterReplayed, []int64{all[0].ID, all[1].ID}},
		{"replayed ones are no longer pending", []int64{all[0].ID}, idem.DeadLetterDiscarded, nil},
		{"discard the third", []int64{all[2].ID}, idem.DeadLetterDiscarded, []int64{all[2].ID}},
		{"nothing", nil, idem.DeadLetterDiscarded, nil},
	} {
		changed, err := store.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{IDs: step.ids, Status: step.status,
			Actor: "ops@example.com", Reason: step.what, Now: t0.Add(time.Hour)})
		require.NoError(t, err, step.what)
		require.Equal(t, step.want, changed, step.what)
	}
	_, err := store.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{IDs: []int64{all[0].ID}, Status: idem.DeadLetterPending})
	require.ErrorContains(t, err, `status "pending"`)

	for i, want := range []idem.DeadLetterStatus{idem.DeadLetterReplayed, idem.DeadLetterReplayed, idem.DeadLetterDiscarded} {
		got, err := store.GetDeadLetter(ctx, all[i].ID)
		require.NoError(t, err)
		require.Equal(t, want, got.Status)
	}

	audit, err := store.ListAudit(ctx, 0)
	require.NoError(t, err)
	require.Len(t, audit, 3, "one audit row per change")
	require.Equal(t, "discard", audit[0].Action, "newest first")
	require.Equal(t, all[2].ID, audit[0].DeadLetterID)
	require.Equal(t, "evt-2", audit[0].EventID)
	require.Equal(t, "discard the third", audit[0].Reason)
	require.Equal(t, "ops@example.com", audit[0].Actor)
	require.True(t, audit[0].At.Equal(t0.Add(time.Hour)))
	require.ElementsMatch(t, []int64{all[0].ID, all[1].ID}, []int64{audit[1].DeadLetterID, audit[2].DeadLetterID})
	for _, a := range audit[1:] {
		require.Equal(t, "replay", a.Action)
	}
	require.Greater(t, audit[0].ID, audit[1].ID)
	limited, err := store.ListAudit(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, audit[:1], limited)

	// The replay of evt-0 is processed two hours after its first failure.
	key := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-0"}
	rec, err := store.RecordRecovery(ctx, key, 0, t0.Add(2*time.Hour))
	require.NoError(t, err)
	require.Equal(t, []time.Duration{2 * time.Hour}, rec)
	rec, err = store.RecordRecovery(ctx, key, all[0].ID, t0.Add(3*time.Hour))
	require.NoError(t, err)
	require.Empty(t, rec, "recorded once")
	got, err := store.GetDeadLetter(ctx, all[0].ID)
	require.NoError(t, err)
	require.True(t, got.RecoveredAt.Equal(t0.Add(2*time.Hour)))
	rec, err = store.RecordRecovery(ctx, idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-2"}, all[2].ID, t0)
	require.NoError(t, err)
	require.Empty(t, rec, "discarded, not replayed")
}

func TestListDeadLettersAndStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, idempg.Config{})
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

	st, err := store.DeadLetterStats(ctx)
	require.NoError(t, err)
	require.Equal(t, idemstore.DeadLetterStats{ByReason: map[idem.Reason]int64{}}, st)

	var dls []idem.DeadLetter
	for _, d := range []idem.DeadLetter{
		deadLetter("ledger@v1", "acme", "e0", idem.ReasonPermanentError, t0),
		deadLetter("ledger@v1", "globex", "e1", idem.ReasonKeyReuse, t0.Add(time.Hour)),
		deadLetter("notifier@v1", "acme", "e2", idem.ReasonPermanentError, t0.Add(2*time.Hour)),
		deadLetter("ledger@v2", "acme", "e3", idem.ReasonTooOld, t0.Add(3*time.Hour)),
	} {
		got, err := store.InsertDeadLetter(ctx, d)
		require.NoError(t, err)
		dls = append(dls, got)
	}
	_, err = store.SetDeadLetterStatus(ctx, idemstore.SetDeadLetterStatusParams{IDs: []int64{dls[3].ID},
		Status: idem.DeadLetterDiscarded, Actor: "ops", Reason: "obsolete"})
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		f    idemstore.DeadLetterFilter
		want []int
	}{
		{"all", idemstore.DeadLetterFilter{}, []int{0, 1, 2, 3}},
		{"ids", idemstore.DeadLetterFilter{IDs: []int64{dls[2].ID, dls[0].ID}}, []int{0, 2}},
		{"consumer", idemstore.DeadLetterFilter{Consumer: "ledger@v1"}, []int{0, 1}},
		{"tenant", idemstore.DeadLetterFilter{Tenant: "acme"}, []int{0, 2, 3}},
		{"reason", idemstore.DeadLetterFilter{Reason: idem.ReasonPermanentError}, []int{0, 2}},
		{"status pending", idemstore.DeadLetterFilter{Status: idem.DeadLetterPending}, []int{0, 1, 2}},
		{"status discarded", idemstore.DeadLetterFilter{Status: idem.DeadLetterDiscarded}, []int{3}},
		{"older than", idemstore.DeadLetterFilter{OlderThan: t0.Add(2 * time.Hour)}, []int{0, 1}},
		{"limit", idemstore.DeadLetterFilter{Limit: 2}, []int{0, 1}},
		{"combined", idemstore.DeadLetterFilter{Tenant: "acme", Reason: idem.ReasonPermanentError, Status: idem.DeadLetterPending, Limit: 1}, []int{0}},
		{"none", idemstore.DeadLetterFilter{Consumer: "nobody"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := store.ListDeadLetters(ctx, tc.f)
			require.NoError(t, err)
			var want []int64
			for _, i := range tc.want {
				want = append(want, dls[i].ID)
			}
			require.Equal(t, want, ids(got))
		})
	}

	st, err = store.DeadLetterStats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Pending)
	require.True(t, st.OldestPending.Equal(t0))
	require.Equal(t, map[idem.Reason]int64{idem.ReasonPermanentError: 2, idem.ReasonKeyReuse: 1}, st.ByReason)
}

// TestDeadLetterConformance runs the dead letter checks every store passes
// (storetest.ExerciseDeadLetters) besides the PostgreSQL ones above.
func TestDeadLetterConformance(t *testing.T) {
	t.Parallel()
	storetest.ExerciseDeadLetters(t, factory)
}
