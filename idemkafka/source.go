package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem"
)

// Errors a Source and its deliveries return.
var (
	// ErrClosed is returned by Receive, and by a delivery's methods, after Close.
	ErrClosed = errors.New("idemkafka: source closed")
	// ErrRevoked is returned when settling or extending a delivery whose partition a rebalance
	// took away: its offset is no longer this worker's to commit. The new owner delivers the
	// record again, and the consumer's claim makes that harmless. It wraps idem.ErrLeaseLost, so
	// a failed Extend rolls the handler back.
	ErrRevoked = fmt.Errorf("idemkafka: partition revoked: %w", idem.ErrLeaseLost)
	// ErrLeaseExpired is returned when settling or extending a delivery whose lease ran out and
	// whose record was handed out again as the next attempt. It wraps idem.ErrLeaseLost.
	ErrLeaseExpired = fmt.Errorf("idemkafka: lease expired: %w", idem.ErrLeaseLost)
)

// pollMax is how many records one poll of the client returns at most.
const pollMax = 1000

// fetchBackoff is the pause after a poll that returned only errors.
const fetchBackoff = 250 * time.Millisecond

// commitTimeout bounds one offset commit.
const commitTimeout = 10 * time.Second

// topicPartition names one partition.
type topicPartition struct {
	topic     string
	partition int32
}

// state is where a fetched record is in its life.
type state uint8

const (
	stateReady   state = iota // waiting to be delivered (again)
	stateLeased               // with a handler until leaseUntil
	stateSettled              // acked, terminated, or its retry copy is stored
)

// entry is one fetched record that has not yet left its partition's settled prefix.
type entry struct {
	offset     int64
	key        []byte
	msg        idem.Message
	attempt    int
	retryAt    time.Time // not delivered before (a retry copy, or a delayed in-process nak)
	state      state
	token      uint64 // fences the delivery that holds the lease
	leaseUntil time.Time
}

// partition is the Source's view of one assigned partition: the records fetched and not yet
// committed, in offset order.
type partition struct {
	topicPartition
	retry     bool // a retry topic: copies are delivered when due, in any order
	owned     bool // false once revoked, lost or closed: nothing of it may commit any more
	revoking  bool // being revoked: nothing more is delivered, in-flight records may settle
	recs      []*entry
	leased    int   // how many of recs are stateLeased, so a scan can stop after the last one
	next      int64 // offset after the last record fetched, -1 before the first
	settledTo int64 // offset after the settled prefix (what to commit), -1 before the first
	committed int64 // offset last committed by this Source, -1 before the first
}

// Source receives from a Kafka consumer group. It is safe for concurrent use.
//
// Kafka has no per-record acknowledgement: a group commits one offset per partition, meaning
// "everything before it is done". The Source therefore keeps each partition's fetched records
// in order and commits only up to the first record not yet settled (acked, terminated, or nak'ed
// into a retry topic), so a crash redelivers every unsettled record and never skips one.
type Source struct {
	cfg    SourceConfig
	name   string
	cl     *kgo.Client
	window time.Duration

	mu       sync.Mutex
	parts    map[topicPartition]*partition
	order    []*partition // parts in a stable order, scanned round-robin from rr
	rr       int
	buffered int
	token    uint64
	changed  chan struct{} // closed and replaced on every change a waiter may care about
	closed   bool
	crashed  bool // closed without a final commit (tests simulate a crash with it)

	assigned     chan struct{} // closed at the first assignment
	assignedOnce sync.Once

	// commitMu is held across every offset commit and across revoking: a commit begun while
	// a partition was owned finishes before the partition is given up, so no commit lands after
	// the new owner started (which could move its offset backwards).
	commitMu sync.Mutex
	kick     chan struct{}

	ctx    context.Context // ends at Close: stops polling and the committer
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var (
	_ idem.Source             = (*Source)(nil)
	_ idem.RedeliveryWindower = (*Source)(nil)
)

// NewSource starts a kgo client in consumer group cfg.Group on cfg.Topic and its retry topics,
// and returns once the group assigned this member its partitions (possibly none), or fails when
// ctx ends first.
func NewSource(ctx context.Context, cfg SourceConfig) (*Source, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Source{
		cfg:      cfg,
		name:     cfg.Topic + "/" + cfg.Group,
		parts:    make(map[topicPartition]*partition),
		changed:  make(chan struct{}),
		assigned: make(chan struct{}),
		kick:     make(chan struct{}, 1),
	}
	reset := kgo.NewOffset().AtStart()
	if cfg.StartAtEnd {
		reset = kgo.NewOffset().AtEnd()
	}
	topics := append([]string{cfg.Topic}, RetryTopics(cfg.Topic, cfg.Group, cfg.RetryTiers)...)
	opts := append(slices.Clone(cfg.ClientOptions),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(reset),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("idemkafka: source %s: client: %w", s.name, err)
	}
	s.cl = cl
	s.window = readWindow(ctx, cl, topics)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(2)
	go s.poll()
	go s.commitLoop()
	select {
	case <-s.assigned:
		return s, nil
	case <-ctx.Done():
		_ = s.Close()
		return nil, fmt.Errorf("idemkafka: source %s: joining the group: %w", s.name, ctx.Err())
	}
}

// Name is "<topic>/<group>".
func (s *Source) Name() string { return s.name }

// Lease is the time a delivered record stays with its handler (SourceConfig.Lease).
func (s *Source) Lease() time.Duration { return s.cfg.Lease }

// signal wakes everyone waiting for a change. s.mu must be held.
func (s *Source) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// rebuildOrder refreshes the scan order after an assignment change. s.mu must be held.
func (s *Source) rebuildOrder() {
	s.order = s.order[:0]
	for _, p := range s.parts {
		s.order = append(s.order, p)
	}
	slices.SortFunc(s.order, func(a, b *partition) int {
		if a.topic != b.topic {
			if a.topic < b.topic {
				return -1
			}
			return 1
		}
		return int(a.partition - b.partition)
	})
}

// onAssigned starts tracking newly assigned partitions from their committed offset.
func (s *Source) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	s.mu.Lock()
	for topic, ps := range assigned {
		for _, n := range ps {
			k := topicPartition{topic, n}
			if old := s.parts[k]; old != nil {
				old.owned = false
				s.buffered -= len(old.recs)
			}
			s.parts[k] = &partition{topicPartition: k, retry: topic != s.cfg.Topic, owned: true, next: -1, settledTo: -1, committed: -1}
		}
	}
	s.rebuildOrder()
	s.signal()
	s.mu.Unlock()
	s.assignedOnce.Do(func() { close(s.assigned) })
}

// onRevoked gives partitions up: it stops delivering their records, lets those in flight
// settle for up to RevokeWait, commits their settled prefix and forgets them, all before the
// group hands them to another member.
func (s *Source) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	s.release(ctx, revoked, true)
}

// onLost forgets partitions the group already gave away (session expired, fenced): their
// offsets can no longer be committed, and their records come back to the new owner.
func (s *Source) onLost(ctx context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.release(ctx, lost, false)
}

// release is onRevoked (commit true) and onLost (commit false).
func (s *Source) release(ctx context.Context, tps map[string][]int32, commit bool) {
	if len(tps) == 0 {
		return
	}
	s.mu.Lock()
	var ps []*partition
	for topic, ns := range tps {
		for _, n := range ns {
			if p := s.parts[topicPartition{topic, n}]; p != nil {
				p.revoking = true
				ps = append(ps, p)
			}
		}
	}
	wait := commit && !s.closed && s.cfg.RevokeWait > 0
	s.mu.Unlock()
	if wait {
		s.awaitSettled(ps, time.Now().Add(s.cfg.RevokeWait))
	}

	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	final := make(map[string]map[int32]kgo.EpochOffset)
	for _, p := range ps {
		p.owned = false
		if commit && !s.crashed && p.settledTo > p.committed {
			addOffset(final, p, p.settledTo)
		}
		s.buffered -= len(p.recs)
		p.recs = nil
		if s.parts[p.topicPartition] == p {
			delete(s.parts, p.topicPartition)
		}
	}
	s.rebuildOrder()
	s.signal()
	s.mu.Unlock()
	if len(final) > 0 {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
		defer cancel()
		if err := s.commit(cctx, final); err != nil {
			s.cfg.Logger.LogAttrs(cctx, slog.LevelWarn, "idemkafka: commit of revoked partitions failed; their settled records will be redelivered",
				slog.String("queue", s.name), slog.String("error", err.Error()))
		}
	}
}

// awaitSettled waits until no record of ps is with a handler, or until deadline.
func (s *Source) awaitSettled(ps []*partition, deadline time.Time) {
	for {
		s.mu.Lock()
		busy := false
		for _, p := range ps {
			for _, e := range p.recs {
				if e.state == stateLeased {
					busy = true
				}
			}
		}
		ch := s.changed
		s.mu.Unlock()
		if !busy {
			return
		}
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-ch:
			t.Stop()
		case <-t.C:
			return
		case <-s.ctx.Done():
			t.Stop()
			return
		}
	}
}

// addOffset records offset as the commit of p in m.
func addOffset(m map[string]map[int32]kgo.EpochOffset, p *partition, offset int64) {
	if m[p.topic] == nil {
		m[p.topic] = make(map[int32]kgo.EpochOffset)
	}
	m[p.topic][p.partition] = kgo.EpochOffset{Epoch: -1, Offset: offset}
}

// poll fetches records into the partitions' buffers until Close, pausing while MaxBuffered
// records are waiting. Rebalances happen only between polls (BlockRebalanceOnPoll), so a
// fetched record is always added to the assignment it was fetched for.
func (s *Source) poll() {
	defer s.wg.Done()
	for {
		s.mu.Lock()
		for s.buffered >= s.cfg.MaxBuffered && !s.closed {
			ch := s.changed
			s.mu.Unlock()
			select {
			case <-ch:
			case <-s.ctx.Done():
			}
			s.mu.Lock()
		}
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		fs := s.cl.PollRecords(s.ctx, pollMax)
		if fs.IsClientClosed() || s.ctx.Err() != nil {
			s.cl.AllowRebalance()
			return
		}
		failed := false
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			failed = true
			s.cfg.Logger.LogAttrs(s.ctx, slog.LevelWarn, "idemkafka: fetch failed",
				slog.String("queue", s.name), slog.String("topic", topic), slog.Int("partition", int(p)), slog.String("error", err.Error()))
		})
		s.mu.Lock()
		fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
			p := s.parts[topicPartition{ftp.Topic, ftp.Partition}]
			if p == nil || !p.owned {
				return
			}
			for _, r := range ftp.Records {
				if p.next >= 0 && r.Offset < p.next {
					continue // already buffered
				}
				d := DecodeRecord(r)
				if !p.retry {
					// Only this Source writes retry state, and only into its retry topics: on
					// the main topic it is forged (a foreign producer, a mirrored copy). A
					// due time there would hold the record, its key and the partition's
					// commit until then; an attempt or publish time would spend or stretch
					// the budget and horizon of an event that has not been tried.
					d.RetryAt = time.Time{}
					d.Message.Attempt = 1
					d.Message.PublishedAt = r.Timestamp
				}
				if d.Message.EventID == "" && d.Err == nil && s.cfg.EventIDOf != nil && !hasHeader(r, HeaderEventID) {
					d.Message.EventID = s.cfg.EventIDOf(r)
				}
				p.recs = append(p.recs, &entry{offset: r.Offset, key: r.Key, msg: d.Message, attempt: d.Message.Attempt, retryAt: d.RetryAt})
				p.next = r.Offset + 1
				s.buffered++
			}
		})
		s.signal()
		s.mu.Unlock()
		s.cl.AllowRebalance()
		if failed && fs.NumRecords() == 0 {
			// A failing cluster answers at once; do not spin on it.
			select {
			case <-time.After(fetchBackoff):
			case <-s.ctx.Done():
			}
		}
	}
}

// Receive returns up to max deliverable records: a partition's records in offset order, each
// once the earlier records it waits for (SourceConfig.Order) settled, a retry copy only once it
// is due, and a record whose lease ran out again as its next attempt. It blocks until one is
// available or ctx ends.
func (s *Source) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	max = cmpMax(max, 1)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		now := time.Now()
		out, wake := s.collect(now, max)
		ch := s.changed
		s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		var timer <-chan time.Time
		var t *time.Timer
		if !wake.IsZero() {
			t = time.NewTimer(wake.Sub(now))
			timer = t.C
		}
		select {
		case <-ctx.Done():
		case <-ch:
		case <-timer:
		case <-s.ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
	}
}

// cmpMax is max for ints (the builtin is shadowed by Receive's parameter).
func cmpMax(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// collect leases up to max records, scanning partitions round-robin, and returns when the next
// lease runs out or retry copy falls due (zero when none). s.mu must be held.
func (s *Source) collect(now time.Time, max int) ([]idem.Delivery, time.Time) {
	var out []idem.Delivery
	var wake time.Time
	earliest := func(t time.Time) {
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	n := len(s.order)
	for i := 0; i < n && len(out) < max; i++ {
		p := s.order[(s.rr+i)%n]
		if !p.owned || p.revoking {
			continue
		}
		// Keys (or, for OrderPartition, the partition) held by an earlier unsettled record.
		held := make(map[string]bool)
		whole := false
		hold := func(e *entry) {
			held[string(e.key)] = true
			whole = true
		}
		for i, seen := 0, 0; i < len(p.recs) && seen < p.leased; i++ {
			e := p.recs[i]
			if e.state != stateLeased {
				continue
			}
			seen++
			if now.Before(e.leaseUntil) {
				hold(e)
				earliest(e.leaseUntil)
				continue
			}
			// The lease ran out without a verdict: the record goes out again as the next attempt.
			e.state = stateReady
			e.attempt++
			p.leased--
			seen--
		}
		order := s.cfg.Order
		if p.retry {
			order = OrderNone // retry copies are independent: a later one may be due first
		}
		for _, e := range p.recs {
			if len(out) >= max {
				break
			}
			if e.state != stateReady {
				continue
			}
			switch {
			case order == OrderPartition && whole:
				continue
			case order == OrderKey && held[string(e.key)]:
				continue
			}
			if now.Before(e.retryAt) {
				earliest(e.retryAt)
				if order != OrderNone {
					hold(e) // a delayed record holds back what comes after it
				}
				continue
			}
			s.token++
			e.token = s.token
			e.state = stateLeased
			p.leased++
			e.leaseUntil = now.Add(s.cfg.Lease)
			hold(e)
			msg := e.msg
			msg.Attempt = e.attempt
			out = append(out, &delivery{s: s, p: p, e: e, token: e.token, msg: msg})
		}
	}
	s.rr++
	return out, wake
}

// holds reports why d may no longer settle or extend its record, or nil. s.mu must be held.
func (s *Source) holds(d *delivery) error {
	switch {
	case s.closed:
		return ErrClosed
	case !d.p.owned:
		return ErrRevoked
	case d.e.token != d.token || d.e.state != stateLeased:
		return ErrLeaseExpired
	}
	return nil
}

// settle marks d's record settled and advances its partition's committable offset. s.mu must
// be held and d checked with holds.
func (s *Source) settle(d *delivery) {
	d.e.state = stateSettled
	p := d.p
	p.leased--
	i := 0
	for i < len(p.recs) && p.recs[i].state == stateSettled {
		p.settledTo = p.recs[i].offset + 1
		i++
	}
	if i > 0 {
		clear(p.recs[:i])
		p.recs = p.recs[i:]
		s.buffered -= i
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	s.signal()
}

// commitLoop commits settled offsets a CommitInterval after something settled, until Close.
func (s *Source) commitLoop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.kick:
		}
		t := time.NewTimer(s.cfg.CommitInterval)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, commitTimeout)
		if err := s.commitOwned(ctx); err != nil && s.ctx.Err() == nil {
			s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idemkafka: offset commit failed; it is retried with the next one",
				slog.String("queue", s.name), slog.String("error", err.Error()))
		}
		cancel()
	}
}

// commitOwned commits the settled prefix of every owned partition that advanced since its last
// commit. Offsets only move forward: a partition is committed only above what this Source
// committed, and only while it owns the partition (commitMu keeps a revoke from slipping in).
func (s *Source) commitOwned(ctx context.Context) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	if s.crashed {
		s.mu.Unlock()
		return nil
	}
	offs := make(map[string]map[int32]kgo.EpochOffset)
	sent := make(map[*partition]int64)
	for _, p := range s.parts {
		if p.owned && p.settledTo > p.committed {
			addOffset(offs, p, p.settledTo)
			sent[p] = p.settledTo
		}
	}
	s.mu.Unlock()
	if len(sent) == 0 {
		return nil
	}
	if err := s.commit(ctx, offs); err != nil {
		return err
	}
	s.mu.Lock()
	for p, off := range sent {
		p.committed = cmpMax64(p.committed, off)
	}
	s.mu.Unlock()
	return nil
}

// cmpMax64 is max for int64.
func cmpMax64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// commit commits offs synchronously and returns the first error of the request or a partition.
func (s *Source) commit(ctx context.Context, offs map[string]map[int32]kgo.EpochOffset) error {
	var rerr error
	s.cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			rerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil && rerr == nil {
					rerr = fmt.Errorf("partition %s/%d: %w", t.Topic, p.Partition, err)
				}
			}
		}
	})
	if rerr != nil {
		return fmt.Errorf("idemkafka: source %s: commit offsets: %w", s.name, rerr)
	}
	return nil
}

// Close commits the settled offsets, leaves the group and closes the client. Records not settled
// are delivered again to whoever gets their partitions (this Source, reopened, among them).
func (s *Source) Close() error {
	return s.shutdown(false)
}

// shutdown is Close; crash leaves without committing, as a process that died would.
func (s *Source) shutdown(crash bool) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.crashed = crash
	s.signal()
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	var err error
	if !crash {
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		err = s.commitOwned(ctx)
		cancel()
	}
	s.cl.CloseAllowingRebalance()
	s.mu.Lock()
	for _, p := range s.parts {
		p.owned = false
	}
	s.mu.Unlock()
	return err
}

// delivery is one record handed to a handler; token fences it against a later lease.
type delivery struct {
	s     *Source
	p     *partition
	e     *entry
	token uint64
	msg   idem.Message
}

// Message returns the record's message; Attempt counts the retry copies before it and the
// leases that ran out or were given back in this process.
func (d *delivery) Message() idem.Message { return d.msg }

// Ack settles the record: its offset is committed once every record before it settled too.
func (d *delivery) Ack(context.Context) error { return d.finish("ack") }

// Term settles the record as dead-lettered: like Ack, the offset moves past it.
func (d *delivery) Term(context.Context) error { return d.finish("term") }

// finish settles d's record.
func (d *delivery) finish(what string) error {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.holds(d); err != nil {
		return fmt.Errorf("idemkafka: %s on %s/%d offset %d: %w", what, d.p.topic, d.p.partition, d.e.offset, err)
	}
	s.settle(d)
	return nil
}

// Extend pushes the record's lease out by the Source's lease time. It fails once the partition
// was revoked, which tells the consumer to roll the handler back.
func (d *delivery) Extend(context.Context) error {
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.holds(d); err != nil {
		return fmt.Errorf("idemkafka: extend on %s/%d offset %d: %w", d.p.topic, d.p.partition, d.e.offset, err)
	}
	d.e.leaseUntil = time.Now().Add(s.cfg.Lease)
	return nil
}

// Nak asks for the record again after delay. Without delay (or without retry tiers) the record
// goes back in front of its partition in this process, as the next attempt (after the delay,
// if any). With a delay, a copy carrying the next attempt and its due time is produced to the
// retry topic of the delay's tier, and only once Kafka stored it is the original settled.
func (d *delivery) Nak(ctx context.Context, delay time.Duration) error {
	s := d.s
	s.mu.Lock()
	if err := s.holds(d); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("idemkafka: nak on %s/%d offset %d: %w", d.p.topic, d.p.partition, d.e.offset, err)
	}
	if delay <= 0 || len(s.cfg.RetryTiers) == 0 {
		d.e.state = stateReady
		d.p.leased--
		d.e.attempt++
		d.e.retryAt = time.Time{}
		if delay > 0 {
			d.e.retryAt = time.Now().Add(delay)
		}
		s.signal()
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()

	tier := RetryTier(s.cfg.RetryTiers, delay)
	topic := RetryTopic(s.cfg.Topic, s.cfg.Group, tier)
	rec, err := EncodeRecord(topic, d.e.key, d.msg)
	if err != nil {
		return fmt.Errorf("idemkafka: nak: retry copy: %w", err)
	}
	rec.Headers = append(rec.Headers,
		kgo.RecordHeader{Key: HeaderAttempt, Value: fmt.Appendf(nil, "%d", d.msg.Attempt+1)},
		kgo.RecordHeader{Key: HeaderRetryAt, Value: []byte(formatTime(time.Now().Add(delay)))},
	)
	if !d.msg.PublishedAt.IsZero() {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderPublishedAt, Value: []byte(formatTime(d.msg.PublishedAt))})
	}
	if err := s.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("idemkafka: nak: produce retry copy to %s: %w", topic, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.holds(d); err != nil {
		// The copy is stored and the original comes back too: one more delivery, which the
		// consumer's claim recognises.
		return fmt.Errorf("idemkafka: nak: retry copy stored in %s, but on %s/%d offset %d: %w", topic, d.p.topic, d.p.partition, d.e.offset, err)
	}
	s.settle(d)
	return nil
}

// hasHeader reports whether r carries header k.
func hasHeader(r *kgo.Record, k string) bool {
	for _, h := range r.Headers {
		if h.Key == k {
			return true
		}
	}
	return false
}
