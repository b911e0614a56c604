package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// QueueConfig is what the queue checks ask of a store they open.
type QueueConfig struct {
	// PollInterval is how often QueueWait polls when nothing wakes it; 0 is the default.
	PollInterval time.Duration
}

// QueueBundle is one isolated store for the queue checks, plus the few hooks only the store's
// SQL can do.
type QueueBundle[TTx any] struct {
	// Store is migrated and private to the test; it must be an idemstore.QueueStore and an
	// idemstore.QueueTxStore[TTx].
	Store idemstore.Store[TTx]
	// LastError reads the last error the queue table recorded for job id. Optional: the nak
	// check does not read it back without it.
	LastError func(ctx context.Context, id int64) (string, error)
	// BeginTx begins a transaction outside the store (the caller's own) and returns it with its
	// commit. Optional: the check that a publish in it wakes a waiter is skipped without it.
	BeginTx func(ctx context.Context) (tx TTx, commit func() error, err error)
	// SpuriousWakes says QueueWait may return before anything was published (the interface
	// allows it; PostgreSQL's LISTEN wakes for every queue of the database): the Wait check
	// then does not ask that an uncommitted or rolled-back publish leave a waiter asleep.
	SpuriousWakes bool
	// Stall makes the store's queue fetches wait until release is called, the way a fetch
	// waits in production: SQLite's write lock held by another transaction (a slow handler's),
	// a table lock on MySQL. Optional: without it LeaseFromTake does not check a fetch that
	// waited.
	Stall func(ctx context.Context) (release func() error, err error)
	// RawIdentities says the store keeps event ids, tenants and types byte for byte, also when
	// they are not valid UTF-8 or hold a NUL (SQLite, MySQL's binary columns; PostgreSQL's text
	// refuses them): PublishKeepsBytes then publishes such identities too.
	RawIdentities bool
}

// QueueFactory builds a fresh QueueBundle with cfg for one test; cleanup goes through tb.Cleanup.
type QueueFactory[TTx any] func(tb testing.TB, cfg QueueConfig) QueueBundle[TTx]

// ExerciseQueue checks a job queue through idemstore.QueueStore and idemstore.QueueTxStore: fetch order,
// leases and their tokens fencing acks, naks and extends, nak delays, publish and ack inside a
// transaction, every field of a publish kept (one message or several), ids never reused, QueueWait woken by a committed publish only, and subscriptions
// (fan-out, idemstore.QueueSubscriptionStore, skipped for a store without them). A store that is no
// queue store is skipped.
func ExerciseQueue[TTx any](t *testing.T, factory QueueFactory[TTx]) {
	t.Helper()
	t.Run("Fetch", func(t *testing.T) { checkQueueFetch(t, factory) })
	t.Run("LeaseFromTake", func(t *testing.T) { checkQueueLeaseFromTake(t, factory) })
	t.Run("Fencing", func(t *testing.T) { checkQueueFencing(t, factory) })
	t.Run("ExtendExpired", func(t *testing.T) { checkQueueExtendExpired(t, factory) })
	t.Run("Nak", func(t *testing.T) { checkQueueNak(t, factory) })
	t.Run("PublishTx", func(t *testing.T) { checkQueuePublishTx(t, factory) })
	t.Run("AckTx", func(t *testing.T) { checkQueueAckTx(t, factory) })
	t.Run("AckTxCommitsWithTheTransaction", func(t *testing.T) { checkQueueAckTxAtomic(t, factory) })
	t.Run("PublishKeepsBytes", func(t *testing.T) { checkQueuePublishKeepsBytes(t, factory) })
	t.Run("IDsNotReused", func(t *testing.T) { checkQueueIDsNotReused(t, factory) })
	t.Run("Wait", func(t *testing.T) { checkQueueWait(t, factory) })
	ExerciseQueueSubscriptions(t, factory)
}

// queueTxStore is a store with a queue.
type queueTxStore[TTx any] interface {
	idemstore.Store[TTx]
	idemstore.QueueStore
	idemstore.QueueTxStore[TTx]
}

// openedQueue is an opened QueueBundle with its store as a queue.
type openedQueue[TTx any] struct {
	QueueBundle[TTx]
	ctx   context.Context
	store queueTxStore[TTx]
}

// openQueue opens a bundle with cfg, skipping the test when its store has no queue.
func openQueue[TTx any](t *testing.T, f QueueFactory[TTx], cfg QueueConfig) *openedQueue[TTx] {
	t.Helper()
	b := f(t, cfg)
	s, ok := b.Store.(queueTxStore[TTx])
	if !ok {
		t.Skip("the store has no queue (not an idemstore.QueueStore and idemstore.QueueTxStore)")
	}
	return &openedQueue[TTx]{QueueBundle: b, ctx: context.Background(), store: s}
}

// queueMessages builds one message per event id, with distinct payloads.
func queueMessages(ids ...string) []idem.Message {
	out := make([]idem.Message, len(ids))
	for i, id := range ids {
		out[i] = idem.Message{EventID: id, Tenant: "acme", Type: "t", Payload: []byte(`{"n":` + fmt.Sprint(i) + `}`)}
	}
	return out
}

// jobEventIDs lists the event ids of jobs, in order.
func jobEventIDs(jobs []idemstore.QueueJob) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.Message.EventID
	}
	return out
}

func checkQueueFetch[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	occurred := utcNow().Add(-time.Minute)
	in := idem.Message{EventID: "e1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"a":1}`),
		Headers: map[string]string{"trace": "x"}, OccurredAt: occurred}
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", in))
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e2", "e3", "e4")...))
	require.NoError(t, b.store.QueuePublish(b.ctx, "other", queueMessages("x1")...))

	t0 := time.Now()
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 2, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Equal(t, []string{"e1", "e2"}, jobEventIDs(jobs), "lowest ids first, at most Max")
	got := jobs[0].Message
	require.Equal(t, 1, got.Attempt)
	require.EqualValues(t, 1, jobs[0].Token)
	require.Equal(t, in.Payload, got.Payload)
	require.Equal(t, in.Headers, got.Headers)
	require.Equal(t, in.Tenant, got.Tenant)
	require.Equal(t, in.Type, got.Type)
	require.True(t, occurred.Equal(got.OccurredAt))
	require.WithinDuration(t, t0, got.PublishedAt, 5*time.Second, "PublishedAt is the enqueue time")

	jobs2, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Equal(t, []string{"e3", "e4"}, jobEventIDs(jobs2), "leased jobs are not fetched twice")

	none, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Empty(t, none)

	// After the lease runs out the jobs come back with a new token and attempt.
	again, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: t0.Add(2 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, []string{"e1"}, jobEventIDs(again))
	require.Equal(t, jobs[0].ID, again[0].ID)
	require.EqualValues(t, 2, again[0].Token)
	require.Equal(t, 2, again[0].Message.Attempt)

	// The old holder is fenced off.
	err = b.store.QueueAck(b.ctx, jobs[0].ID, jobs[0].Token)
	require.ErrorIs(t, err, idem.ErrLeaseLost)
	require.ErrorContains(t, err, fmt.Sprintf("job %d", jobs[0].ID))
	require.NoError(t, b.store.QueueAck(b.ctx, again[0].ID, again[0].Token))

	st, err := b.store.QueueStats(b.ctx, "q")
	require.NoError(t, err)
	require.EqualValues(t, 3, st.Backlog)
	require.WithinDuration(t, t0, st.Oldest, 5*time.Second)
	st, err = b.store.QueueStats(b.ctx, "empty")
	require.NoError(t, err)
	require.Equal(t, idemstore.QueueStats{}, st)
}

// checkQueueLeaseFromTake: a fetch without Now leases from the store's clock, read when it takes
// the leases (idemstore.QueueFetchParams.Now), so that the queue Source, which leaves Now zero,
// gets the lease it asked for: the job is not handed out again within the lease and is after it.
// With Stall, the same holds for a fetch that waited longer than its lease (here 1.5 s for a
// 0.5 s lease): leasing from the time it was asked for, it handed out a job whose lease was
// already over, which another worker could take while the first started on it.
func checkQueueLeaseFromTake[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e1")...))
	before := time.Now()
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Hour})
	require.NoError(t, err)
	require.Equal(t, []string{"e1"}, jobEventIDs(jobs), "a fetch without Now finds what is available now")
	require.WithinDuration(t, before, jobs[0].FirstFetchedAt, time.Minute, "the first fetch is recorded at the store's clock")
	within, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Hour, Now: before.Add(59 * time.Minute)})
	require.NoError(t, err)
	require.Empty(t, within, "a job leased for an hour from the store's clock was handed out again within it")
	after, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Hour, Now: before.Add(2 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, []string{"e1"}, jobEventIDs(after), "the lease ends")
	require.Greater(t, after[0].Token, jobs[0].Token)

	if b.Stall == nil {
		t.Log("no Stall hook: a fetch that waited is not checked")
		return
	}
	require.NoError(t, b.store.QueuePublish(b.ctx, "waited", queueMessages("w1")...))
	const lease = 500 * time.Millisecond
	release, err := b.Stall(b.ctx)
	require.NoError(t, err)
	type fetched struct {
		jobs []idemstore.QueueJob
		err  error
	}
	done := make(chan fetched, 1)
	go func() {
		jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "waited", Max: 1, Lease: lease})
		done <- fetched{jobs, err}
	}()
	time.Sleep(3 * lease) // the fetch waits meanwhile
	require.NoError(t, release())
	first := <-done
	require.NoError(t, first.err)
	require.Equal(t, []string{"w1"}, jobEventIDs(first.jobs))
	// Past the lease as counted from the ask, within it as counted from the take.
	again, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "waited", Max: 1, Lease: lease})
	require.NoError(t, err)
	require.Empty(t, again, "the job was handed out again within the lease of the fetch that waited")
	require.NoError(t, b.store.QueueAck(b.ctx, first.jobs[0].ID, first.jobs[0].Token))
}

func checkQueueFencing[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e1")...))
	t0 := time.Now()
	first, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Second, Now: t0})
	require.NoError(t, err)
	require.Len(t, first, 1)
	// The lease has expired; another worker takes the job (a clock an hour on, so that the new
	// lease outlives the test).
	second, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Hour, Now: t0.Add(time.Hour)})
	require.NoError(t, err)
	require.Len(t, second, 1)
	stale, cur := first[0], second[0]

	tests := []struct {
		name string
		op   func(id, token int64) error
	}{
		{"ack", func(id, token int64) error { return b.store.QueueAck(b.ctx, id, token) }},
		{"ackTx", func(id, token int64) error {
			return b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
				return b.store.QueueAckTx(ctx, tx, id, token)
			})
		}},
		{"nak", func(id, token int64) error {
			return b.store.QueueNak(b.ctx, idemstore.QueueNakParams{ID: id, Token: token, Error: "x", Now: t0})
		}},
		{"extend", func(id, token int64) error { return b.store.QueueExtend(b.ctx, id, token, time.Minute) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.op(stale.ID, stale.Token)
			require.ErrorIs(t, err, idem.ErrLeaseLost)
			require.ErrorContains(t, err, fmt.Sprintf("job %d", stale.ID))
			err = tt.op(stale.ID+1000, cur.Token)
			require.ErrorIs(t, err, idem.ErrLeaseLost, "unknown id")
		})
	}
	// The current holder still owns the job.
	require.NoError(t, b.store.QueueExtend(b.ctx, cur.ID, cur.Token, time.Hour))
	require.NoError(t, b.store.QueueAck(b.ctx, cur.ID, cur.Token))
	err = b.store.QueueAck(b.ctx, cur.ID, cur.Token)
	require.ErrorIs(t, err, idem.ErrLeaseLost, "acked twice")
}

func checkQueueExtendExpired[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e1", "e2")...))
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 2, Lease: time.Microsecond, Now: time.Now()})
	require.NoError(t, err)
	require.Len(t, jobs, 2)
	time.Sleep(2 * time.Millisecond)

	// Its lease is over: another worker may fetch it at any moment, so it cannot be extended.
	require.ErrorIs(t, b.store.QueueExtend(b.ctx, jobs[0].ID, jobs[0].Token, time.Hour), idem.ErrLeaseLost)

	// A live lease can: fetched with a real clock, extended by an hour, it is not fetched 2 minutes on.
	t0 := time.Now()
	live, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: t0})
	require.NoError(t, err)
	require.Len(t, live, 1)
	require.NoError(t, b.store.QueueExtend(b.ctx, live[0].ID, live[0].Token, time.Hour))
	later, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 2, Lease: time.Minute, Now: t0.Add(2 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, []string{"e2"}, jobEventIDs(later))
	require.ErrorContains(t, b.store.QueueExtend(b.ctx, live[0].ID, live[0].Token, 0), "lease is 0s")
}

func checkQueueNak[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e1")...))
	t0 := time.Now()
	fetch := func(at time.Time) []idemstore.QueueJob {
		t.Helper()
		jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Hour, Now: at})
		require.NoError(t, err)
		return jobs
	}
	jobs := fetch(t0)
	require.Len(t, jobs, 1)
	require.NoError(t, b.store.QueueNak(b.ctx, idemstore.QueueNakParams{
		ID: jobs[0].ID, Token: jobs[0].Token, Delay: 30 * time.Second, Error: "downstream 503", Now: t0}))

	require.Empty(t, fetch(t0.Add(29*time.Second)), "not before the delay, although the lease is cleared")
	again := fetch(t0.Add(30 * time.Second))
	require.Len(t, again, 1)
	require.Equal(t, 2, again[0].Message.Attempt)
	if b.LastError != nil {
		lastErr, err := b.LastError(b.ctx, again[0].ID)
		require.NoError(t, err)
		require.Equal(t, "downstream 503", lastErr)
	} else {
		t.Log("no LastError hook: the nak's error is not read back")
	}

	// A nak without delay makes the job available at once.
	require.NoError(t, b.store.QueueNak(b.ctx, idemstore.QueueNakParams{ID: again[0].ID, Token: again[0].Token, Now: t0.Add(30 * time.Second)}))
	require.Len(t, fetch(t0.Add(30*time.Second)), 1)
}

func checkQueuePublishTx[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	errRollback := errors.New("business write failed")
	err := b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
		require.NoError(t, b.store.QueuePublishTx(ctx, tx, "q", queueMessages("rolled-back")...))
		return errRollback
	})
	require.ErrorIs(t, err, errRollback)
	require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
		return b.store.QueuePublishTx(ctx, tx, "q", queueMessages("committed")...)
	}))
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 10, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	require.Equal(t, []string{"committed"}, jobEventIDs(jobs))

	require.ErrorContains(t, b.store.QueuePublish(b.ctx, "q", idem.Message{}), "empty event id")
	require.ErrorContains(t, b.store.QueuePublish(b.ctx, "", queueMessages("e")...), "queue name is empty")
}

func checkQueueAckTx[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e1")...))
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	j := jobs[0]

	// The ack rolls back with the handler.
	errHandler := errors.New("handler failed")
	err = b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
		require.NoError(t, b.store.QueueAckTx(ctx, tx, j.ID, j.Token))
		return errHandler
	})
	require.ErrorIs(t, err, errHandler)
	st, err := b.store.QueueStats(b.ctx, "q")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Backlog)

	// The rolled-back ack left the job leased: it comes again once the lease is over.
	again, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: time.Now().Add(2 * time.Minute)})
	require.NoError(t, err)
	require.Len(t, again, 1, "a rolled-back ack leaves the job to come again")
	j = again[0]

	require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
		return b.store.QueueAckTx(ctx, tx, j.ID, j.Token)
	}))
	// A committed ack is final whenever the store removes the row (in the transaction, or just
	// after it as idemsqlite does): no fetch takes the job again, not even after its lease.
	gone, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Empty(t, gone, "an acked job is never fetched again")
	st, err = b.store.QueueStats(b.ctx, "q")
	require.NoError(t, err)
	require.EqualValues(t, 0, st.Backlog)
}

// checkQueueAckTxAtomic: the acks of one transaction commit with its other writes, or none of
// them does. Stores may move an ack's delete (to the commit, as idempg sends it with the COMMIT;
// after it, as idemsqlite deletes it), but when one of several acks in a transaction finds its
// lease lost, the transaction fails with idem.ErrLeaseLost naming that job, no job is acked and
// the transaction's other writes (here a publish) do not commit; when every lease holds, every
// ack and the publish commit together.
func checkQueueAckTxAtomic[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	ackAll := func(jobs []idemstore.QueueJob, effect string) error {
		return b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
			if err := b.store.QueuePublishTx(ctx, tx, effect, queueMessages("effect")...); err != nil {
				return err
			}
			for _, j := range jobs {
				if err := b.store.QueueAckTx(ctx, tx, j.ID, j.Token); err != nil {
					return err
				}
			}
			return nil
		})
	}
	backlog := func(queue string) int64 {
		st, err := b.store.QueueStats(b.ctx, queue)
		require.NoError(t, err)
		return st.Backlog
	}

	require.NoError(t, b.store.QueuePublish(b.ctx, "lost", queueMessages("l1", "l2", "l3")...))
	t0 := time.Now()
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "lost", Max: 3, Lease: time.Second, Now: t0})
	require.NoError(t, err)
	require.Len(t, jobs, 3)
	// Another worker takes the second job once its lease is over (a clock an hour on).
	taken, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "lost", Max: 1, Lease: time.Hour, Now: t0.Add(time.Hour)})
	require.NoError(t, err)
	require.Len(t, taken, 1)
	stale := slices.IndexFunc(jobs, func(j idemstore.QueueJob) bool { return j.ID == taken[0].ID })
	require.GreaterOrEqual(t, stale, 0)
	err = ackAll(jobs, "lost-effect")
	require.ErrorIs(t, err, idem.ErrLeaseLost)
	require.ErrorContains(t, err, fmt.Sprintf("job %d", jobs[stale].ID))
	require.EqualValues(t, 3, backlog("lost"), "no ack of a failed transaction commits")
	require.Zero(t, backlog("lost-effect"), "the failed transaction's other writes do not commit")
	require.NoError(t, b.store.QueueAck(b.ctx, taken[0].ID, taken[0].Token), "the new holder still owns its job")

	require.NoError(t, b.store.QueuePublish(b.ctx, "held", queueMessages("h1", "h2", "h3")...))
	jobs, err = b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "held", Max: 3, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, jobs, 3)
	require.NoError(t, ackAll(jobs, "held-effect"))
	require.Zero(t, backlog("held"), "every ack commits")
	require.EqualValues(t, 1, backlog("held-effect"), "with the transaction's other writes")
}

// checkQueuePublishKeepsBytes publishes one message alone, several in one call and many in one
// call (stores insert a lot in one statement, or in chunks: arrays, JSON, multi-row VALUES), with
// texts that need quoting or escaping, nil, empty and binary payloads, headers and an occurrence
// time: a fetch gives every field back as published, on every path.
func checkQueuePublishKeepsBytes[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	occurred := time.UnixMicro(1_700_000_000_123_456)
	in := []idem.Message{
		{EventID: `evt-"quoted"\`, Tenant: "acme", Type: "pay", Payload: []byte(`{"n":1}`), OccurredAt: occurred},
		{EventID: "évt-ünïcode-✓", Tenant: "a'cme", Type: "t,ype", Headers: map[string]string{"X-Trace": `a"b`, "K": "ü"}},
		{EventID: "evt-empty", Payload: []byte{}},
		{EventID: "evt-bin", Tenant: "acme", Type: "bin", Payload: []byte{0, 1, 0xff, '"', '\\', ','}},
	}
	raw := []idem.Message{
		{EventID: "evt\xff\xfe", Tenant: "acme", Type: "pay", Payload: []byte(`{"n":2}`)},
		{EventID: "evt-nul", Tenant: "ac\x00me", Type: "t\xffpe"},
	}
	// Many repeats the set in one call (new event ids each time), past the row counts a store
	// may split a large publish into, so that every one of its statements sees every field.
	for _, tt := range []struct {
		name   string
		batch  int
		copies int
	}{{"OneByOne", 1, 1}, {"InOneCall", 0, 1}, {"Many", 0, 12}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := openQueue(t, f, QueueConfig{})
			set := in
			if b.RawIdentities {
				set = append(slices.Clone(set), raw...)
			}
			var in []idem.Message
			for c := range tt.copies {
				for _, m := range set {
					if c > 0 {
						m.EventID += fmt.Sprintf("-%d", c)
					}
					in = append(in, m)
				}
			}
			if tt.batch == 0 {
				tt.batch = len(in)
			}
			for i := 0; i < len(in); i += tt.batch {
				require.NoError(t, b.store.QueuePublish(b.ctx, "q", in[i:i+tt.batch]...))
			}
			jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: len(in) + 1, Lease: time.Minute, Now: time.Now()})
			require.NoError(t, err)
			require.Len(t, jobs, len(in))
			for i, j := range jobs {
				got, want := j.Message, in[i]
				require.Equal(t, want.EventID, got.EventID)
				require.Equal(t, want.Tenant, got.Tenant, want.EventID)
				require.Equal(t, want.Type, got.Type, want.EventID)
				require.Equal(t, len(want.Payload), len(got.Payload), want.EventID) // nil and empty may read back alike
				if len(want.Payload) > 0 {
					require.Equal(t, want.Payload, got.Payload, want.EventID)
				}
				require.Equal(t, want.Headers, got.Headers, want.EventID)
				require.True(t, want.OccurredAt.Equal(got.OccurredAt), "%s: occurred %v, want %v", want.EventID, got.OccurredAt, want.OccurredAt)
			}
		})
	}
}

// TestQueueIDsNotReused guards the fencing token: a new job never gets the id of an acked one,
// so an old (id, token) pair cannot match it.
func checkQueueIDsNotReused[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	b := openQueue(t, f, QueueConfig{})
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e1")...))
	jobs, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	require.NoError(t, b.store.QueueAck(b.ctx, jobs[0].ID, jobs[0].Token))
	require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e2")...))
	next, err := b.store.QueueFetch(b.ctx, idemstore.QueueFetchParams{Queue: "q", Max: 1, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	require.Greater(t, next[0].ID, jobs[0].ID)
	require.ErrorIs(t, b.store.QueueAck(b.ctx, jobs[0].ID, jobs[0].Token), idem.ErrLeaseLost)
}

func checkQueueWait[TTx any](t *testing.T, f QueueFactory[TTx]) {
	t.Parallel()
	// A poll interval far longer than the test: only a wake-up can end a wait early.
	b := openQueue(t, f, QueueConfig{PollInterval: time.Hour})

	wait := func(max time.Duration) <-chan error {
		done := make(chan error, 1)
		go func() { done <- b.store.QueueWait(b.ctx, "q", max) }()
		time.Sleep(20 * time.Millisecond) // let it start waiting
		return done
	}

	t.Run("max", func(t *testing.T) {
		if b.SpuriousWakes {
			t.Skip("the store's QueueWait may wake spuriously (QueueBundle.SpuriousWakes)")
		}
		start := time.Now()
		require.NoError(t, b.store.QueueWait(b.ctx, "q", 30*time.Millisecond))
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	})

	t.Run("context", func(t *testing.T) {
		if b.SpuriousWakes {
			t.Skip("the store's QueueWait may wake spuriously (QueueBundle.SpuriousWakes)")
		}
		ctx, cancel := context.WithTimeout(b.ctx, 20*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, b.store.QueueWait(ctx, "q", time.Hour), context.DeadlineExceeded)
	})

	t.Run("publish wakes", func(t *testing.T) {
		done := wait(time.Hour)
		require.NoError(t, b.store.QueuePublish(b.ctx, "q", queueMessages("e1")...))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("QueueWait was not woken by QueuePublish")
		}
	})

	t.Run("publish in InTx wakes after commit", func(t *testing.T) {
		done := wait(time.Hour)
		require.NoError(t, b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
			require.NoError(t, b.store.QueuePublishTx(ctx, tx, "q", queueMessages("e2")...))
			if !b.SpuriousWakes {
				select {
				case <-done:
					t.Error("QueueWait woke before commit")
				case <-time.After(50 * time.Millisecond):
				}
			}
			return nil
		}))
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("QueueWait was not woken after commit")
		}
	})

	t.Run("rolled back publish does not wake", func(t *testing.T) {
		if b.SpuriousWakes {
			t.Skip("the store's QueueWait may wake spuriously (QueueBundle.SpuriousWakes)")
		}
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- b.store.QueueWait(b.ctx, "q", 300*time.Millisecond) }()
		time.Sleep(20 * time.Millisecond)
		_ = b.store.InTx(b.ctx, func(ctx context.Context, tx TTx) error {
			require.NoError(t, b.store.QueuePublishTx(ctx, tx, "q", queueMessages("e3")...))
			return errors.New("roll back")
		})
		require.NoError(t, <-done)
		require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	})

	t.Run("publish in caller's own tx wakes", func(t *testing.T) {
		if b.BeginTx == nil {
			t.Skip("no BeginTx hook: the check cannot begin a transaction outside the store")
		}
		done := wait(time.Hour)
		tx, commit, err := b.BeginTx(b.ctx)
		require.NoError(t, err)
		require.NoError(t, b.store.QueuePublishTx(b.ctx, tx, "q", queueMessages("e4")...))
		require.NoError(t, commit())
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("QueueWait was not woken")
		}
	})
}
