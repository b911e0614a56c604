package relaytest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
)

// leaseSpy wraps a relay's store and logs its partition lease operations with their timing, so
// that a test can rebuild when each relay owned each partition.
type leaseSpy struct {
	idemstore.OutboxRelayStore
	log *leaseLog
}

// leaseOp is one partition lease operation.
type leaseOp struct {
	owner     string
	partition int
	release   bool
	ok        bool
	// now and ttl are the acquire's parameters: the lease ends at now+ttl.
	now              time.Time
	ttl              time.Duration
	callStart, ended time.Time
}

type leaseLog struct {
	mu  sync.Mutex
	ops []leaseOp
}

func (l *leaseLog) add(op leaseOp) {
	l.mu.Lock()
	l.ops = append(l.ops, op)
	l.mu.Unlock()
}

func partitionOf(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, idemrelay.PartitionLeasePrefix)
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(s)
	return p, err == nil
}

func (s leaseSpy) LeaseAcquire(ctx context.Context, p idemstore.LeaseParams) (int64, bool, error) {
	start := time.Now()
	token, ok, err := s.OutboxRelayStore.LeaseAcquire(ctx, p)
	if part, isPart := partitionOf(p.Name); isPart && err == nil {
		s.log.add(leaseOp{owner: p.Owner, partition: part, ok: ok, now: p.Now, ttl: p.TTL, callStart: start, ended: time.Now()})
	}
	return token, ok, err
}

func (s leaseSpy) LeaseRelease(ctx context.Context, name, owner string) error {
	start := time.Now()
	err := s.OutboxRelayStore.LeaseRelease(ctx, name, owner)
	if part, isPart := partitionOf(name); isPart {
		s.log.add(leaseOp{owner: owner, partition: part, release: true, callStart: start, ended: time.Now()})
	}
	return err
}

// ownership is a span of time in which owner certainly held a partition and no one else could:
// from the return of the acquire that took it to the end of its last renewal (now+ttl) or the
// start of its release, whichever is first.
type ownership struct {
	owner      string
	start, end time.Time
}

// ownerships rebuilds, per partition, the spans of ownership from the log.
func (l *leaseLog) ownerships() map[int][]ownership {
	l.mu.Lock()
	defer l.mu.Unlock()
	type key struct {
		owner string
		part  int
	}
	open := map[key]*ownership{}
	out := map[int][]ownership{}
	closeAt := func(k key, end time.Time) {
		o := open[k]
		if end.After(o.end) {
			end = o.end
		}
		out[k.part] = append(out[k.part], ownership{owner: o.owner, start: o.start, end: end})
		delete(open, k)
	}
	for _, op := range l.ops {
		k := key{op.owner, op.partition}
		o := open[k]
		switch {
		case op.release:
			if o != nil {
				closeAt(k, op.callStart)
			}
		case !op.ok:
			if o != nil {
				closeAt(k, o.end)
			}
		default:
			if o != nil && op.now.After(o.end) {
				closeAt(k, o.end) // the lease lapsed before this renewal: a new span starts
				o = nil
			}
			if o == nil {
				open[k] = &ownership{owner: op.owner, start: op.ended, end: op.now.Add(op.ttl)}
			} else {
				o.end = op.now.Add(op.ttl)
			}
		}
	}
	for k, o := range open {
		closeAt(k, o.end)
	}
	return out
}

// requireNoOverlap checks that no two relays' spans of one partition overlap.
func requireNoOverlap(tb testing.TB, spans map[int][]ownership) {
	tb.Helper()
	for p, list := range spans {
		for i, a := range list {
			for _, b := range list[i+1:] {
				if a.owner == b.owner {
					continue
				}
				overlap := a.start.Before(b.end) && b.start.Before(a.end)
				require.False(tb, overlap, "partition %d owned by %s [%s, %s] and %s [%s, %s] at once",
					p, a.owner, a.start.Format(time.StampMicro), a.end.Format(time.StampMicro),
					b.owner, b.start.Format(time.StampMicro), b.end.Format(time.StampMicro))
			}
		}
	}
}

// requirePublishedWhileOwned checks that every Publish happened inside a span in which its
// relay owned the message's partition.
func requirePublishedWhileOwned(tb testing.TB, got []published, spans map[int][]ownership, partition func(eventID string) int) {
	tb.Helper()
	for _, p := range got {
		part := partition(p.msg.EventID)
		ok := slices.ContainsFunc(spans[part], func(o ownership) bool {
			return o.owner == p.relay && !p.start.Before(o.start) && !p.end.After(o.end)
		})
		require.True(tb, ok, "%s published %s (partition %d) at %s without owning the partition",
			p.relay, p.msg.EventID, part, p.start.Format(time.StampMicro))
	}
}

// leaseWatch takes LeaseList snapshots while relays run and checks each one: at most one live
// lease per partition, and a lease token never shared by two owners (every change of owner
// increments the token).
type leaseWatch struct {
	mu         sync.Mutex
	tokenOwner map[string]string // "<name>#<token>" → owner
	violations []string
	snapshots  int
	stop       chan struct{}
	done       chan struct{}
}

func watchLeases(tb testing.TB, store idemstore.OutboxRelayStore) *leaseWatch {
	w := &leaseWatch{tokenOwner: map[string]string{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			leases, err := store.LeaseList(ctx, idemrelay.PartitionLeasePrefix, time.Now())
			cancel()
			if err != nil {
				continue // the store may be closing at the end of the test
			}
			w.check(leases)
		}
	}()
	tb.Cleanup(w.finish)
	return w
}

func (w *leaseWatch) check(leases []idemstore.Lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.snapshots++
	names := map[string]bool{}
	for _, l := range leases {
		if names[l.Name] {
			w.violations = append(w.violations, "two live leases named "+l.Name)
		}
		names[l.Name] = true
		k := fmt.Sprintf("%s#%d", l.Name, l.Token)
		if prev, ok := w.tokenOwner[k]; ok && prev != l.Owner {
			w.violations = append(w.violations, fmt.Sprintf("%s token %d held by %s and by %s", l.Name, l.Token, prev, l.Owner))
		}
		w.tokenOwner[k] = l.Owner
	}
}

// finish stops the watcher (idempotent) and returns what it found.
func (w *leaseWatch) finish() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *leaseWatch) result() (int, []string) {
	w.finish()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.snapshots, append([]string(nil), w.violations...)
}

// Three relays on PostgreSQL (and on MySQL) share 20 keys × 30 events: every key's events arrive in enqueue
// order, every event is published, and no partition ever has two owners — checked from the
// lease operations each relay made, from LeaseList snapshots, and from when each relay
// published.
// serverKits are the stores with concurrent writers, on which relays in several processes
// share partitions; SQLite's one writer is not among them.
var serverKits = []struct {
	name string
	new  func(tb testing.TB, cfg storeCfg) kit
}{
	{"postgres", newPostgres},
	{"mysql", newMySQL},
}

func TestThreeRelaysShareWorkInOrder(t *testing.T) {
	t.Parallel()
	for _, kk := range serverKits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			threeRelaysShareWorkInOrder(t, kk.new)
		})
	}
}

func threeRelaysShareWorkInOrder(t *testing.T, newKit func(testing.TB, storeCfg) kit) {
	const (
		keys       = 20
		perKey     = 30
		partitions = 16
		ttl        = 600 * time.Millisecond
	)
	k := newKit(t, storeCfg{partitions: partitions, maxConns: 16})
	ctx := ctxT(t, 30*time.Second)
	log := &leaseLog{}
	sink := &recSink{delay: 2 * time.Millisecond}
	watch := watchLeases(t, k.store)

	want := map[string][]string{}
	keyOf := map[string]string{}
	var relays []*running
	startRelay := func(id string) {
		r := newRelay(t, leaseSpy{OutboxRelayStore: k.another(t), log: log}, k.dlq, sink.as(id), func(c *idemrelay.Config) {
			c.ID, c.LeaseTTL, c.BatchSize, c.PollInterval = id, ttl, 25, 50*time.Millisecond
		})
		relays = append(relays, start(t, r))
	}
	// Relays join while events arrive, so partitions move between relays mid-stream.
	for i := range perKey {
		switch i {
		case 0:
			startRelay("r1")
		case 8:
			startRelay("r2")
		case 16:
			startRelay("r3")
		}
		var batch []idem.Outgoing
		for j := range keys {
			key := fmt.Sprintf("key%02d", j)
			id := fmt.Sprintf("%s-%02d", key, i)
			batch = append(batch, ev(id, key, "orders"))
			want[key] = append(want[key], id)
			keyOf[id] = key
		}
		k.enqueue(t, batch...)
		time.Sleep(25 * time.Millisecond)
	}

	eventually(t, 15*time.Second, func() bool { return k.counts(ctx).Published == keys*perKey }, "all %d rows marked published", keys*perKey)
	// The relays settle on fair shares: ceil(16/3) = 6 at most each, every partition owned.
	eventually(t, 10*time.Second, func() bool {
		total := 0
		for _, rr := range relays {
			n := len(rr.r.Partitions())
			if n > 6 || n == 0 {
				return false
			}
			total += n
		}
		return total == partitions
	}, "relays hold fair shares of all partitions")
	for _, rr := range relays {
		rr.stop(t)
	}

	got := sink.all()
	ids := sink.ids()
	require.Len(t, distinct(ids), keys*perKey, "every event published at least once")
	requireKeyOrder(t, ids, want)
	byRelay := map[string]int{}
	for _, p := range got {
		byRelay[p.relay]++
	}
	require.Len(t, byRelay, 3, "every relay published: %v", byRelay)

	spans := log.ownerships()
	requireNoOverlap(t, spans)
	requirePublishedWhileOwned(t, got, spans, func(id string) int {
		return idemstore.OutboxPartition(idem.Outgoing{EventID: id, Key: keyOf[id]}, partitions)
	})
	snaps, violations := watch.result()
	require.Greater(t, snaps, 10)
	require.Empty(t, violations)
	t.Logf("%d publications of %d events by %v; %d ownership spans; %d lease snapshots",
		len(got), keys*perKey, byRelay, countSpans(spans), snaps)
}

func countSpans(spans map[int][]ownership) int {
	n := 0
	for _, s := range spans {
		n += len(s)
	}
	return n
}

// A relay that dies without releasing keeps its partitions only until its leases expire; then
// the survivors take them over and publish their rows.
func TestCrashedRelayPartitionsTakenOver(t *testing.T) {
	t.Parallel()
	for _, kk := range serverKits {
		t.Run(kk.name, func(t *testing.T) {
			t.Parallel()
			crashedRelayPartitionsTakenOver(t, kk.new)
		})
	}
}

func crashedRelayPartitionsTakenOver(t *testing.T, newKit func(testing.TB, storeCfg) kit) {
	const (
		partitions = 16
		ttl        = 600 * time.Millisecond
	)
	k := newKit(t, storeCfg{partitions: partitions, maxConns: 16})
	ctx := ctxT(t, 30*time.Second)
	log := &leaseLog{}
	sink := &recSink{}
	relays := map[string]*running{}
	var r1 *crashStore
	for _, id := range []string{"r1", "r2", "r3"} {
		var store idemstore.OutboxRelayStore = leaseSpy{OutboxRelayStore: k.another(t), log: log}
		if id == "r1" {
			r1 = &crashStore{OutboxRelayStore: store}
			store = r1
		}
		r := newRelay(t, store, k.dlq, sink.as(id), func(c *idemrelay.Config) {
			c.ID, c.LeaseTTL = id, ttl
		})
		relays[id] = start(t, r)
	}
	eventually(t, 10*time.Second, func() bool {
		total := 0
		for _, rr := range relays {
			n := len(rr.r.Partitions())
			if n == 0 || n > 6 {
				return false
			}
			total += n
		}
		return total == partitions
	}, "three relays share the partitions")

	r1.crash()
	relays["r1"].stop(t) // crash: no release
	leases, err := k.store.LeaseList(ctx, idemrelay.PartitionLeasePrefix, time.Now())
	require.NoError(t, err)
	orphan := map[int]time.Time{} // partition → end of r1's lease
	for _, l := range leases {
		if l.Owner == "r1" {
			p, _ := partitionOf(l.Name)
			orphan[p] = l.LeaseUntil
		}
	}
	require.NotEmpty(t, orphan, "r1 still holds leases after its crash")

	// Events whose keys hash into r1's partitions.
	var want []string
	for i := 0; len(want) < 10; i++ {
		key := fmt.Sprintf("orphan%d", i)
		if _, ok := orphan[idemstore.OutboxPartition(idem.Outgoing{Key: key}, partitions)]; ok {
			id := key + "-0"
			k.enqueue(t, ev(id, key, "orders"))
			want = append(want, id)
		}
	}
	eventually(t, 10*time.Second, func() bool { return k.counts(ctx).Pending == 0 }, "survivors publish r1's rows")
	for _, p := range sink.all() {
		if !slices.Contains(want, p.msg.EventID) {
			continue
		}
		require.NotEqual(t, "r1", p.relay)
		part := idemstore.OutboxPartition(idem.Outgoing{Key: strings.TrimSuffix(p.msg.EventID, "-0")}, partitions)
		require.False(t, p.start.Before(orphan[part]), "%s published %s before r1's lease of partition %d expired", p.relay, p.msg.EventID, part)
	}
	require.ElementsMatch(t, want, distinct(filterIDs(sink.ids(), want)))

	// The survivors now split all partitions: ceil(16/2) = 8 at most each.
	eventually(t, 10*time.Second, func() bool {
		n2, n3 := len(relays["r2"].r.Partitions()), len(relays["r3"].r.Partitions())
		return n2 <= 8 && n3 <= 8 && n2+n3 == partitions
	}, "survivors hold all partitions")
	relays["r2"].stop(t)
	relays["r3"].stop(t)
	requireNoOverlap(t, log.ownerships())
}

func filterIDs(ids, keep []string) []string {
	var out []string
	for _, id := range ids {
		if slices.Contains(keep, id) {
			out = append(out, id)
		}
	}
	return out
}
