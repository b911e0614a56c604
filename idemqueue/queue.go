// Package idemqueue is the queue-table transport: a Source and a Sink over the queue table that
// lives in the application's own database (idempg, idemsqlite). It is the embedded default
// broker: nothing to run besides the database, and a producer can enqueue in the same
// transaction as its business write.
//
// A Source with a Subscription receives every message published to its Queue (a topic) in a
// queue of its own, idemstore.SubscriptionQueue(topic, name): fan-out, each subscription with its own
// leases, retries and dead letters, while Sources of one subscription compete for its jobs. A
// Source without one shares the topic's jobs with the other Sources of the topic, as long as
// the topic has no subscription (see docs/queue.md).
//
// Each fetched job carries a fencing token. The consumer acks a job inside the transaction that
// holds its claim (Delivery.AckTx), so a worker that lost its lease to another cannot commit:
// its ack finds a newer token, fails with idem.ErrLeaseLost, and its effect rolls back.
package idemqueue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// Defaults for SourceConfig.
const (
	// LeaseDefault is how long a fetched job stays invisible to other workers; the consumer
	// extends it at a third while the handler runs.
	LeaseDefault = 30 * time.Second
	// MaxWaitDefault bounds one idle wait between fetches; notifications usually end it sooner.
	MaxWaitDefault = time.Second
	// PrefetchDefault is how many jobs a fetch leases ahead of what its Receive asked for, so
	// that a consumer whose workers free one at a time does not pay a fetch per job.
	PrefetchDefault = 64
)

// SourceConfig configures a queue-table Source.
type SourceConfig struct {
	// Queue is the queue name (required); with a Subscription, the topic subscribed to.
	Queue string
	// Subscription, when set, is the consumer's subscription to the topic Queue: the Source
	// registers it (idempotent, at the first Receive or by Subscribe) and receives its own copy
	// of every message published to Queue after it was registered; Sources with the same
	// Subscription compete for those copies. Empty: the Source competes for the jobs of Queue
	// itself. It needs a store with subscriptions (idemstore.QueueSubscriptionStore) and may not
	// contain "#", nor may Queue then.
	Subscription string
	// Lease is the visibility timeout of a fetched job (default LeaseDefault).
	Lease time.Duration
	// MaxWait bounds one idle wait for new jobs (default MaxWaitDefault).
	MaxWait time.Duration
	// Prefetch is how many jobs a fetch leases beyond what Receive asked for (default
	// PrefetchDefault; negative: none). The Source holds them for the next Receives, for at
	// most a third of Lease (the consumer extends a lease at a third, so a job handed out
	// still has two thirds of it); what is not handed out by then, or at Close, is given back
	// as if never fetched (QueueRelease when the store has it). Held jobs are invisible to
	// other Sources meanwhile. While the queue has a backlog (the last fetch found all it
	// asked for), a Receive that leaves fewer than half of Prefetch held starts a fetch of
	// Prefetch more in the background, so that the next Receives do not wait for a fetch: at
	// most one and a half times Prefetch jobs are held.
	Prefetch int
	// Now returns the current time; it is for tests. Without it the store reads its own clock
	// when it takes a lease or records a nak, after whatever it waited for
	// (idemstore.QueueFetchParams.Now); with it, every time the Source gives the store is its.
	Now func() time.Time
}

func (c SourceConfig) withDefaults() SourceConfig {
	if c.Lease == 0 {
		c.Lease = LeaseDefault
	}
	if c.MaxWait == 0 {
		c.MaxWait = MaxWaitDefault
	}
	if c.Prefetch == 0 {
		c.Prefetch = PrefetchDefault
	}
	c.Prefetch = max(c.Prefetch, 0)
	return c
}

func (c SourceConfig) validate() error {
	var errs []error
	if c.Queue == "" {
		errs = append(errs, errors.New("Queue is empty"))
	}
	if c.Lease < 3*time.Millisecond {
		errs = append(errs, fmt.Errorf("Lease is %v, want at least 3ms", c.Lease))
	}
	if c.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("MaxWait is %v, want >= 0", c.MaxWait))
	}
	if c.Queue != "" && c.Subscription != "" {
		if _, err := idemstore.SubscriptionQueue(c.Queue, c.Subscription); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("idemqueue: source config: %w", errors.Join(errs...))
	}
	return nil
}

// Source receives jobs from one queue of the queue table: Queue, or the subscription's queue.
type Source[TTx any] struct {
	store idemstore.QueueTxStore[TTx]
	cfg   SourceConfig
	// queue is the queue fetched from: cfg.Queue, or the subscription's queue.
	queue string
	// subs registers the subscription; nil without one.
	subs idemstore.QueueSubscriptionStore

	subMu      sync.Mutex
	subscribed bool

	// orphan is a fetch whose Receive gave up before it returned, for the next Receive to adopt.
	orphanMu sync.Mutex
	orphan   *inflight

	// ahead holds jobs leased beyond what a Receive asked for (Prefetch), oldest fetch first,
	// until a later Receive takes them or aheadTimer gives them back; aheadGen tells a timer
	// whether the jobs it was set for are still the ones held.
	aheadMu    sync.Mutex
	ahead      []idemstore.QueueJob
	aheadGen   uint64
	aheadTimer *time.Timer
	// refill is the background fetch that tops ahead up (nil when none runs); backlog says the
	// last fetch found all it asked for; closed is set by Close, after which a refill gives its
	// jobs back instead of holding them. Guarded by aheadMu.
	refill  *inflight
	backlog bool
	closed  bool
}

var _ idem.Source = (*Source[any])(nil)

// NewSource returns a Source over store's queue table.
func NewSource[TTx any](store idemstore.QueueTxStore[TTx], cfg SourceConfig) (*Source[TTx], error) {
	if store == nil {
		return nil, errors.New("idemqueue: NewSource: store is nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	src := &Source[TTx]{store: store, cfg: cfg, queue: cfg.Queue}
	if cfg.Subscription != "" {
		subs, ok := store.(idemstore.QueueSubscriptionStore)
		if !ok {
			return nil, fmt.Errorf("idemqueue: NewSource: subscription %q of %s: the store (%T) has no subscriptions (idemstore.QueueSubscriptionStore)", cfg.Subscription, cfg.Queue, store)
		}
		src.subs = subs
		src.queue, _ = idemstore.SubscriptionQueue(cfg.Queue, cfg.Subscription) // validated above
	}
	return src, nil
}

// Name returns "queue:" and the queue fetched from: the subscription's queue
// ("queue:topic#name") when the Source has one, so that a dead letter's replay goes to this
// subscription alone.
func (s *Source[TTx]) Name() string { return "queue:" + s.queue }

// Subscribe registers the Source's subscription, if it has one and has not registered it yet
// (registering is idempotent in the store). Receive does it first; call it before producers
// start when messages published before the first Receive must reach the subscription too.
func (s *Source[TTx]) Subscribe(ctx context.Context) error {
	if s.subs == nil {
		return nil
	}
	s.subMu.Lock()
	defer s.subMu.Unlock()
	if s.subscribed {
		return nil
	}
	if err := s.subs.QueueSubscribe(ctx, s.cfg.Queue, s.cfg.Subscription); err != nil {
		return fmt.Errorf("idemqueue: subscribe %q to %s: %w", s.cfg.Subscription, s.cfg.Queue, err)
	}
	s.subscribed = true
	return nil
}

// Lease returns the configured lease.
func (s *Source[TTx]) Lease() time.Duration { return s.cfg.Lease }

// Close gives back the jobs fetched ahead and not handed out yet, after waiting for a
// background fetch under way. Jobs already received and not acked become visible again when
// their lease ends.
func (s *Source[TTx]) Close() error {
	s.aheadMu.Lock()
	s.closed = true
	f := s.refill
	s.aheadMu.Unlock()
	if f != nil {
		<-f.done // it gives its jobs back itself
	}
	if jobs := s.dropAhead(0); len(jobs) > 0 {
		s.giveBack(context.Background(), jobs)
	}
	return nil
}

// Receive leases up to max available jobs, waiting (LISTEN/NOTIFY on PostgreSQL, polling on
// SQLite) until at least one is there or ctx ends. A Receive that gives up gives back what it
// took: the fetch runs apart from ctx (a fetch cancelled mid-way may still have committed its
// leases), and when ctx ends first Receive returns ctx.Err() at once; the next Receive takes over
// that fetch, or else the jobs it leased are released when it returns, with the attempt it counted
// taken back (QueueRelease, when the store has it; else they are nak'ed, and the attempt stays
// counted).
func (s *Source[TTx]) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		max = 1
	}
	if err := s.Subscribe(ctx); err != nil {
		return nil, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		jobs, err := s.next(ctx, max)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("idemqueue: fetch from %s: %w", s.queue, err)
		}
		if len(jobs) > 0 {
			out := make([]idem.Delivery, len(jobs))
			for i, j := range jobs {
				out[i] = &Delivery[TTx]{src: s, job: j}
			}
			return out, nil
		}
		if err := s.store.QueueWait(ctx, s.queue, s.cfg.MaxWait); err != nil {
			return nil, err
		}
	}
}

// next returns up to max jobs: those fetched ahead first (waiting for a background fetch
// under way when they are too few), and when they are fewer than max, a fetch of the rest plus
// Prefetch more, of which it keeps what is over max for later.
func (s *Source[TTx]) next(ctx context.Context, max int) ([]idemstore.QueueJob, error) {
	jobs := s.takeAhead(max)
	if len(jobs) < max {
		s.aheadMu.Lock()
		f := s.refill
		s.aheadMu.Unlock()
		if f != nil {
			select {
			case <-f.done:
				jobs = append(jobs, s.takeAhead(max-len(jobs))...)
			case <-ctx.Done():
				if len(jobs) > 0 {
					return jobs, nil
				}
				return nil, ctx.Err() // the refill's jobs stay held for the next Receive
			}
		}
	}
	if len(jobs) == max {
		s.startRefill(ctx)
		return jobs, nil
	}
	want := max - len(jobs) + s.cfg.Prefetch
	more, err := s.fetch(ctx, want)
	s.aheadMu.Lock()
	s.backlog = err == nil && len(more) == want
	s.aheadMu.Unlock()
	if err != nil {
		if len(jobs) > 0 {
			return jobs, nil // the fetch is retried by a later Receive
		}
		return nil, err
	}
	jobs = append(jobs, more...)
	if len(jobs) > max {
		s.keepAhead(jobs[max:])
		jobs = jobs[:max]
	}
	return jobs, nil
}

// startRefill starts a fetch of Prefetch jobs in the background, to be held ahead, when the
// queue has a backlog, fewer than half of Prefetch are held and no such fetch runs already.
// The fetch runs apart from ctx (bounded by fetchTimeout); its jobs are held like those of any
// fetch ahead, or given back when the Source was closed meanwhile.
func (s *Source[TTx]) startRefill(ctx context.Context) {
	n := s.cfg.Prefetch
	s.aheadMu.Lock()
	if n == 0 || s.refill != nil || s.closed || !s.backlog || 2*len(s.ahead) >= n {
		s.aheadMu.Unlock()
		return
	}
	f := &inflight{done: make(chan struct{})}
	s.refill = f
	s.aheadMu.Unlock()
	bg := context.WithoutCancel(ctx)
	go func() {
		defer close(f.done)
		fctx, cancel := context.WithTimeout(bg, fetchTimeout)
		jobs, err := s.store.QueueFetch(fctx, s.fetchParams(n))
		cancel()
		s.aheadMu.Lock()
		s.refill = nil
		s.backlog = err == nil && len(jobs) == n
		closed := s.closed
		if err == nil && !closed && len(jobs) > 0 {
			s.holdLocked(jobs)
		}
		s.aheadMu.Unlock()
		if err == nil && closed && len(jobs) > 0 {
			s.giveBack(bg, jobs)
		}
	}()
}

// takeAhead takes up to max of the jobs fetched ahead, oldest first.
func (s *Source[TTx]) takeAhead(max int) []idemstore.QueueJob {
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	n := min(max, len(s.ahead))
	if n == 0 {
		return nil
	}
	jobs := slices.Clone(s.ahead[:n])
	s.ahead = s.ahead[n:]
	if len(s.ahead) == 0 {
		s.ahead = nil
		s.stopAheadTimer()
	}
	return jobs
}

// keepAhead holds jobs for later Receives, for at most a third of the lease of the oldest held.
func (s *Source[TTx]) keepAhead(jobs []idemstore.QueueJob) {
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	s.holdLocked(jobs)
}

// holdLocked is keepAhead with aheadMu held. Jobs added to those already held are given back
// with them, at the held ones' deadline.
func (s *Source[TTx]) holdLocked(jobs []idemstore.QueueJob) {
	s.ahead = append(s.ahead, jobs...)
	if s.aheadTimer != nil {
		return // the jobs held already bound the wait
	}
	s.aheadGen++
	gen := s.aheadGen
	s.aheadTimer = time.AfterFunc(s.cfg.Lease/3, func() {
		if jobs := s.dropAhead(gen); len(jobs) > 0 {
			s.giveBack(context.Background(), jobs)
		}
	})
}

// dropAhead takes every job fetched ahead, when gen is 0 or still the generation held.
func (s *Source[TTx]) dropAhead(gen uint64) []idemstore.QueueJob {
	s.aheadMu.Lock()
	defer s.aheadMu.Unlock()
	if gen != 0 && gen != s.aheadGen {
		return nil
	}
	jobs := s.ahead
	s.ahead = nil
	s.stopAheadTimer()
	return jobs
}

// stopAheadTimer stops the give-back timer of the jobs held ahead; aheadMu is held.
func (s *Source[TTx]) stopAheadTimer() {
	if s.aheadTimer != nil {
		s.aheadTimer.Stop()
		s.aheadTimer = nil
	}
	s.aheadGen++
}

// fetchTimeout bounds a fetch that runs apart from its Receive's context.
const fetchTimeout = time.Minute

// inflight is one store fetch running apart from the Receive that started it. done is closed
// when it returns, after jobs and err are set.
type inflight struct {
	done chan struct{}
	jobs []idemstore.QueueJob
	err  error
}

// fetch leases up to max jobs. The store call does not see ctx: when ctx ends first, fetch
// returns ctx.Err() at once and leaves the fetch to the Source as its orphan; the next Receive
// adopts it (takes its jobs) instead of starting a fetch of its own, and when it returns with
// nobody adopting it, its jobs are given back. So receives that keep giving up (a batch's
// MaxWait, a shutdown) never pile up fetches: at most one runs per receiving goroutine.
func (s *Source[TTx]) fetch(ctx context.Context, max int) ([]idemstore.QueueJob, error) {
	s.orphanMu.Lock()
	f := s.orphan
	s.orphan = nil
	s.orphanMu.Unlock()
	if f == nil {
		f = s.startFetch(ctx, max)
	}
	select {
	case <-f.done:
		if f.err == nil && len(f.jobs) > 0 && ctx.Err() != nil {
			s.giveBack(context.WithoutCancel(ctx), f.jobs)
			return nil, ctx.Err()
		}
		if len(f.jobs) > max { // an adopted fetch for a larger max
			s.giveBack(context.WithoutCancel(ctx), f.jobs[max:])
			return f.jobs[:max], f.err
		}
		return f.jobs, f.err
	case <-ctx.Done():
		s.orphanMu.Lock()
		select {
		case <-f.done: // it returned meanwhile, and saw no orphan: its jobs are ours to give back
			s.orphanMu.Unlock()
			if f.err == nil {
				s.giveBack(context.WithoutCancel(ctx), f.jobs)
			}
		default:
			if s.orphan != nil { // another receive left one first: this one is given back on return
				go func() {
					<-f.done
					if f.err == nil {
						s.giveBack(context.WithoutCancel(ctx), f.jobs)
					}
				}()
			} else {
				s.orphan = f
			}
			s.orphanMu.Unlock()
		}
		return nil, ctx.Err()
	}
}

// startFetch starts a store fetch of up to max jobs apart from ctx. When it returns while it is
// the Source's orphan (nobody adopted it), its jobs are given back.
func (s *Source[TTx]) startFetch(ctx context.Context, max int) *inflight {
	f := &inflight{done: make(chan struct{})}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchTimeout)
	go func() {
		defer cancel()
		f.jobs, f.err = s.store.QueueFetch(fctx, s.fetchParams(max))
		close(f.done)
		s.orphanMu.Lock()
		orphaned := s.orphan == f
		if orphaned {
			s.orphan = nil
		}
		s.orphanMu.Unlock()
		if orphaned && f.err == nil {
			s.giveBack(context.WithoutCancel(ctx), f.jobs)
		}
	}()
	return f
}

// fetchParams asks for up to max jobs, leased from the store's clock unless the caller set one.
func (s *Source[TTx]) fetchParams(max int) idemstore.QueueFetchParams {
	return idemstore.QueueFetchParams{Queue: s.queue, Max: max, Lease: s.cfg.Lease, Now: s.now()}
}

// now is the caller's clock (SourceConfig.Now), or zero: the store's, read when it writes.
func (s *Source[TTx]) now() time.Time {
	if s.cfg.Now == nil {
		return time.Time{}
	}
	return s.cfg.Now()
}

// releaser is a queue store that can give a leased job back as if it had never been fetched.
type releaser interface {
	QueueRelease(ctx context.Context, id, token int64) error
}

// giveBack returns jobs leased for a Receive that ended before returning them. Errors are
// dropped: a job not given back is fetched again when its lease ends.
func (s *Source[TTx]) giveBack(ctx context.Context, jobs []idemstore.QueueJob) {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	rel, ok := s.store.(releaser)
	for _, j := range jobs {
		if ok {
			_ = rel.QueueRelease(ctx, j.ID, j.Token)
			continue
		}
		_ = s.store.QueueNak(ctx, idemstore.QueueNakParams{ID: j.ID, Token: j.Token, Now: s.now()})
	}
}

// Delivery is one leased job.
type Delivery[TTx any] struct {
	src *Source[TTx]
	job idemstore.QueueJob
}

var (
	_ idem.Delivery          = (*Delivery[any])(nil)
	_ idem.TxAcker[struct{}] = (*Delivery[struct{}])(nil)
	_ idem.FirstAttempter    = (*Delivery[any])(nil)
)

// Message returns the job's message; Attempt counts fetches of this job.
func (d *Delivery[TTx]) Message() idem.Message { return d.job.Message }

// FirstAttempt is when the job was first fetched, as the store recorded it (zero when it does
// not): the consumer's retry budget counts from it, across processes and restarts.
func (d *Delivery[TTx]) FirstAttempt() time.Time { return d.job.FirstFetchedAt }

// Job returns the leased row (id and fencing token).
func (d *Delivery[TTx]) Job() idemstore.QueueJob { return d.job }

// Ack deletes the job if this delivery still holds its lease.
func (d *Delivery[TTx]) Ack(ctx context.Context) error {
	return d.wrap("ack", d.src.store.QueueAck(ctx, d.job.ID, d.job.Token))
}

// AckTx deletes the job inside the consumer's transaction, fenced by the lease token.
func (d *Delivery[TTx]) AckTx(ctx context.Context, tx TTx) error {
	return d.wrap("ack", d.src.store.QueueAckTx(ctx, tx, d.job.ID, d.job.Token))
}

// Nak makes the job available again after delay.
func (d *Delivery[TTx]) Nak(ctx context.Context, delay time.Duration) error {
	return d.wrap("nak", d.src.store.QueueNak(ctx, idemstore.QueueNakParams{ID: d.job.ID, Token: d.job.Token, Delay: delay, Now: d.src.now()}))
}

// Extend pushes the lease out by the source's lease time.
func (d *Delivery[TTx]) Extend(ctx context.Context) error {
	return d.wrap("extend", d.src.store.QueueExtend(ctx, d.job.ID, d.job.Token, d.src.cfg.Lease))
}

// Term deletes the job: it is in the dead-letter queue now.
func (d *Delivery[TTx]) Term(ctx context.Context) error {
	return d.wrap("terminate", d.src.store.QueueAck(ctx, d.job.ID, d.job.Token))
}

func (d *Delivery[TTx]) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf(`idemqueue: %s job %d (event "%s"): %w`, op, d.job.ID, idem.BoundID(d.job.Message.EventID), err)
}

// Sink publishes to queues of the queue table, each call in a transaction of its own. To
// publish with a business write, call the store's QueuePublishTx inside your transaction.
type Sink struct {
	store idemstore.QueueStore
}

var _ idem.Sink = (*Sink)(nil)

// NewSink returns a Sink over store's queue table.
func NewSink(store idemstore.QueueStore) *Sink { return &Sink{store: store} }

// Publish inserts msgs into queue topic; once it returns they are committed. A topic with
// subscriptions gets one job per subscription and message; a subscription's own queue
// (idemstore.SubscriptionQueue) reaches that subscription alone.
func (s *Sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	for _, m := range msgs {
		if m.EventID == "" {
			return fmt.Errorf("idemqueue: publish to %s: a message has an empty event id", topic)
		}
	}
	if err := s.store.QueuePublish(ctx, topic, msgs...); err != nil {
		return fmt.Errorf("idemqueue: publish %d messages to %s: %w", len(msgs), topic, err)
	}
	return nil
}

// Close does nothing; the store's owner closes the database.
func (s *Sink) Close() error { return nil }
