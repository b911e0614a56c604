package idemredis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handoff"
)

// expiryIdle is the idle time at which every consumer claims a pending entry; a delivery with
// lease L is given idle time expiryIdle−L when received or extended (see receiveScript).
const expiryIdle = LeaseMax

// releaseIdle is the idle time a released entry is given: past expiryIdle, so the next claim
// of any consumer of the group takes it at once.
const releaseIdle = 2 * expiryIdle

// callMargin is how long a blocking read may overrun its block time before it is abandoned.
const callMargin = 5 * time.Second

// Source receives from a Redis stream through a consumer group. A delivery's lease is its
// pending entry's idle time: Extend resets it, and once it passes the lease any consumer of the
// group claims the entry (XAUTOCLAIM). Every settle is fenced on the server: it acts only while
// this consumer owns the entry with the delivery count it was received with, so a worker whose
// lease was taken over cannot ack, extend or nak it (it gets an error wrapping
// idem.ErrLeaseLost). It is safe for concurrent use.
type Source struct {
	rdb     redis.UniversalClient
	cfg     SourceConfig
	name    string
	stream  string
	retry   string
	delayed string
	cursor  string

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup // reads running detached from a Receive that returned
}

var _ idem.Source = (*Source)(nil)

// NewSource creates the consumer group cfg.Group on the stream and on the group's retry stream
// (creating them if missing) and returns a source reading them. It does not own rdb: closing
// the source leaves the client open.
func NewSource(ctx context.Context, rdb redis.UniversalClient, cfg SourceConfig) (*Source, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("idemredis: %w", err)
	}
	if cfg.Consumer == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("idemredis: consumer name: %w", err)
		}
		cfg.Consumer = "idem-" + hex.EncodeToString(b[:])
	}
	stream := cfg.Prefix + cfg.Stream
	s := &Source{
		rdb:     rdb,
		cfg:     cfg,
		name:    stream + "/" + cfg.Group,
		stream:  stream,
		retry:   stream + "/retry/" + cfg.Group,
		delayed: stream + "/delayed/" + cfg.Group,
		cursor:  stream + "/cursor/" + cfg.Group,
	}
	if err := s.createGroups(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// createGroups creates the group on both streams; an existing group keeps its position.
func (s *Source) createGroups(ctx context.Context) error {
	for _, k := range []string{s.stream, s.retry} {
		start := s.cfg.Start
		if k == s.retry {
			start = StartOldest
		}
		err := s.rdb.XGroupCreateMkStream(ctx, k, s.cfg.Group, start).Err()
		if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
			return fmt.Errorf("idemredis: create group %s on %s: %w", s.cfg.Group, k, err)
		}
	}
	return nil
}

// Name identifies the source as "<stream key>/<group>".
func (s *Source) Name() string { return s.name }

// Lease is the pending entry idle time after which another consumer may take a delivery over.
func (s *Source) Lease() time.Duration { return s.cfg.Lease }

// Consumer is this source's consumer name inside its group.
func (s *Source) Consumer() string { return s.cfg.Consumer }

// Close stops the source: Receive fails afterwards, reads in flight finish and give back what
// they got, and the consumer leaves the group if it holds no entry. Deliveries not settled stay
// pending and are claimed by another consumer once their lease passes.
func (s *Source) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.calls.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), callMargin)
	defer cancel()
	// A stream deleted meanwhile has no group to leave; the error tells nothing to act on.
	_ = closeScript.Run(ctx, s.rdb, []string{s.stream, s.retry}, s.cfg.Group, s.cfg.Consumer).Err()
	return nil
}

// received is what one read returned, or its error.
type received struct {
	ds  []*Delivery
	err error
}

// Receive returns up to max deliveries: first entries whose lease expired and naks whose delay
// passed, then new entries, waiting for them until ctx ends. The reads run detached from ctx:
// when ctx ends first, Receive returns ctx.Err() at once and whatever the read still got is
// given back (its lease released, its delivery count restored), so a cancelled Receive neither
// hides entries for a lease nor spends an attempt.
func (s *Source) Receive(ctx context.Context, limit int) ([]idem.Delivery, error) {
	if limit < 1 {
		return nil, fmt.Errorf("idemredis: receive from %s: max is %d, want at least 1", s.name, limit)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		block := s.cfg.Poll
		if dl, ok := ctx.Deadline(); ok {
			block = min(block, max(time.Until(dl), time.Millisecond))
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, fmt.Errorf("idemredis: receive from %s: source closed", s.name)
		}
		s.calls.Add(1)
		s.mu.Unlock()
		h := handoff.New[received]()
		go func() {
			defer s.calls.Done()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), block+callMargin)
			defer cancel()
			ds, err := s.read(rctx, limit, block)
			if !h.Put(received{ds, err}) {
				s.giveBack(ds)
			}
		}()
		select {
		case r := <-h.Done():
			if r.err != nil {
				return nil, r.err
			}
			if len(r.ds) > 0 {
				out := make([]idem.Delivery, len(r.ds))
				for i, d := range r.ds {
					out[i] = d
				}
				return out, nil
			}
		case <-ctx.Done():
			// The read may have handed its result over just before: give that back too.
			if r, ok := h.Abandon(); ok {
				s.giveBack(r.ds)
			}
			return nil, ctx.Err()
		}
	}
}

// read receives claimable and new entries, and when there are none waits up to block for a
// new entry in either stream, then tries once more.
func (s *Source) read(ctx context.Context, limit int, block time.Duration) ([]*Delivery, error) {
	ds, last, err := s.receive(ctx, limit)
	if isNoGroup(err) {
		// The stream was deleted (and its groups with it): recreate them and go on.
		if err = s.createGroups(ctx); err == nil {
			ds, last, err = s.receive(ctx, limit)
		}
	}
	if err != nil || len(ds) > 0 {
		return ds, err
	}
	// XREAD consumes nothing: it only wakes up when an entry newer than the last one arrives.
	err = s.rdb.XRead(ctx, &redis.XReadArgs{
		Streams: []string{s.stream, s.retry, last[0], last[1]},
		Count:   1,
		Block:   block,
	}).Err()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("idemredis: wait on %s: %w", s.name, err)
	}
	ds, _, err = s.receive(ctx, limit)
	return ds, err
}

// receive runs receiveScript and decodes its reply.
func (s *Source) receive(ctx context.Context, limit int) ([]*Delivery, [2]string, error) {
	last := [2]string{"$", "$"}
	keys := []string{s.stream, s.retry, s.delayed, s.cursor}
	reply, err := receiveScript.Run(ctx, s.rdb, keys, s.cfg.Group, s.cfg.Consumer,
		expiryIdle.Milliseconds(), (expiryIdle - s.cfg.Lease).Milliseconds(), limit).Slice()
	if err != nil {
		return nil, last, fmt.Errorf("idemredis: receive from %s: %w", s.name, err)
	}
	if len(reply) != 2 {
		return nil, last, fmt.Errorf("idemredis: receive from %s: unexpected reply %v", s.name, reply)
	}
	entries, _ := reply[0].([]any)
	if ids, _ := reply[1].([]any); len(ids) == 2 {
		last[0], _ = ids[0].(string)
		last[1], _ = ids[1].(string)
	}
	ds := make([]*Delivery, 0, len(entries))
	for _, r := range entries {
		e, ok := r.([]any)
		if !ok || len(e) != 4 {
			s.giveBack(ds)
			return nil, last, fmt.Errorf("idemredis: receive from %s: unexpected entry %v", s.name, r)
		}
		idx, _ := e[0].(int64)
		id, _ := e[1].(string)
		flat, _ := e[2].([]any)
		count, _ := e[3].(int64)
		fields := make(map[string]string, len(flat)/2)
		for j := 0; j+1 < len(flat); j += 2 {
			k, _ := flat[j].(string)
			v, _ := flat[j+1].(string)
			fields[k] = v
		}
		key, retry := s.stream, false
		if idx == 2 {
			key, retry = s.retry, true
		}
		ds = append(ds, s.delivery(key, retry, id, flat, fields, count))
	}
	return ds, last, nil
}

// delivery decodes one entry; a message that does not decode is still delivered, with an
// empty EventID and the reason in HeaderDecodeError, so the consumer dead-letters it.
func (s *Source) delivery(key string, retry bool, id string, flat []any, fields map[string]string, count int64) *Delivery {
	m, err := DecodeFields(id, fields, count, retry)
	if err != nil {
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[HeaderDecodeError] = err.Error()
		m.EventID = ""
	}
	if s.cfg.Tenant != "" {
		if m.Tenant != "" && m.Tenant != s.cfg.Tenant {
			if m.Headers == nil {
				m.Headers = map[string]string{}
			}
			m.Headers[FieldTenant] = m.Tenant
		}
		m.Tenant = s.cfg.Tenant
	}
	return &Delivery{src: s, key: key, retry: retry, id: id, count: count, fields: flat, msg: m}
}

// giveBack releases deliveries no caller saw, restoring their delivery counts, so the next
// claim hands them out at once as the same attempt.
func (s *Source) giveBack(ds []*Delivery) {
	if len(ds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), callMargin)
	defer cancel()
	for _, d := range ds {
		// A failure leaves the entry pending: it comes back after its lease, which is safe.
		_, _ = d.settle(ctx, "release", releaseIdle.Milliseconds(), d.count-1, int64(d.msg.Attempt))
	}
}

// isNoGroup reports whether err is Redis saying the stream or its group does not exist.
func isNoGroup(err error) bool {
	return err != nil && strings.Contains(err.Error(), "NOGROUP")
}

// Delivery is one entry received through a Source.
type Delivery struct {
	src    *Source
	key    string
	retry  bool
	id     string
	count  int64
	fields []any // the entry's fields as read, re-added by a Nak should the entry be trimmed
	msg    idem.Message
}

var _ idem.Delivery = (*Delivery)(nil)

// Message returns the decoded message; its Attempt counts deliveries in the group, across naks.
func (d *Delivery) Message() idem.Message { return d.msg }

// ID is the stream entry's id.
func (d *Delivery) ID() string { return d.id }

// Ack acknowledges the entry in the group.
func (d *Delivery) Ack(ctx context.Context) error { return d.do(ctx, "ack", 0, 0, 0) }

// Term acknowledges the entry too: the consumer wrote it to idem's dead-letter table, so the
// group must never deliver it again.
func (d *Delivery) Term(ctx context.Context) error { return d.do(ctx, "ack", 0, 0, 0) }

// Extend resets the entry's idle time, pushing its lease out by the source's lease.
func (d *Delivery) Extend(ctx context.Context) error {
	return d.do(ctx, "extend", (expiryIdle - d.src.cfg.Lease).Milliseconds(), 0, 0)
}

// Nak asks for redelivery after delay. Without delay the entry is released in place and the
// next claim takes it; with one it is acknowledged and a copy waits in the group's delayed set
// until the source moves it to the group's retry stream, carrying the next attempt. An entry
// trimmed from its stream while held is re-added from the delivery's copy of its fields, so a
// Nak that succeeds always brings the message back.
func (d *Delivery) Nak(ctx context.Context, delay time.Duration) error {
	next := int64(d.msg.Attempt) + 1
	if delay <= 0 {
		return d.do(ctx, "release", releaseIdle.Milliseconds(), d.count, next)
	}
	ms := max(delay.Milliseconds(), 1)
	return d.do(ctx, "delay", ms, 0, next)
}

// do runs one settle and turns a refused fence into idem.ErrLeaseLost.
func (d *Delivery) do(ctx context.Context, op string, arg1, arg2, attempt int64) error {
	ok, err := d.settle(ctx, op, arg1, arg2, attempt)
	if err != nil {
		return fmt.Errorf("idemredis: %s on %s: %w", op, d.src.name, err)
	}
	if !ok {
		return fmt.Errorf("idemredis: %s on %s: %w: entry %s is no longer pending with this consumer (its lease passed and another consumer took it over, or it was settled)",
			op, d.src.name, idem.ErrLeaseLost, d.id)
	}
	return nil
}

// settle runs settleScript for this entry; ok is false when the fence refused. attempt is the
// attempt of the copy release and delay re-add when the entry was trimmed (delay always
// re-adds); only those two ops send the entry's fields along.
func (d *Delivery) settle(ctx context.Context, op string, arg1, arg2, attempt int64) (bool, error) {
	del := "0"
	if d.retry {
		del = "1"
	}
	args := []any{d.src.cfg.Group, d.src.cfg.Consumer, d.id, strconv.FormatInt(d.count, 10), op,
		arg1, arg2, del, attempt}
	if op == "release" || op == "delay" {
		args = append(args, d.fields...)
	}
	n, err := settleScript.Run(ctx, d.src.rdb, []string{d.key, d.src.delayed}, args...).Int()
	return n == 1, err
}

// Backlog counts what the group still has to settle: entries of the stream not yet delivered
// to it (its lag) or delivered and pending, entries of its retry stream, and naks waiting out
// their delay. It feeds queue-backlog metrics and tells when a drain is done. The lag comes from
// XINFO GROUPS, which reports it from Redis 7 on, and not after entries were deleted from the
// middle of the stream (then Backlog fails rather than guess).
func (s *Source) Backlog(ctx context.Context) (int64, error) {
	groups, err := s.rdb.XInfoGroups(ctx, s.stream).Result()
	if err != nil {
		return 0, fmt.Errorf("idemredis: backlog of %s: %w", s.name, err)
	}
	var n int64
	found := false
	for _, g := range groups {
		if g.Name == s.cfg.Group {
			if g.Lag < 0 {
				return 0, fmt.Errorf("idemredis: backlog of %s: Redis cannot tell the group's lag (entries were deleted from the middle of the stream)", s.name)
			}
			n, found = g.Lag+g.Pending, true
		}
	}
	if !found {
		return 0, fmt.Errorf("idemredis: backlog of %s: no such group", s.name)
	}
	pipe := s.rdb.Pipeline()
	retry := pipe.XLen(ctx, s.retry)
	delayed := pipe.ZCard(ctx, s.delayed)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("idemredis: backlog of %s: %w", s.name, err)
	}
	return n + retry.Val() + delayed.Val(), nil
}
