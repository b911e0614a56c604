package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// clock is a moved clock for the consumer's Now.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock        { c := &clock{}; c.ns.Store(t.UnixNano()); return c }
func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// fixedRand returns v (bounded by n) and records the bound it was asked for.
type fixedRand struct {
	v     int64
	asked atomic.Int64
}

func (r *fixedRand) Int64N(n int64) int64 { r.asked.Store(n); return min(r.v, n-1) }

// gcRecorder is a recorder that is also an idem.MaintenanceObserver.
type gcRecorder struct {
	recorder
	gcMu sync.Mutex
	gcs  []gcReport
}

type gcReport struct {
	consumer string
	deleted  int
	err      error
}

func (r *gcRecorder) ClaimsCollected(consumer string, deleted int, err error) {
	r.gcMu.Lock()
	defer r.gcMu.Unlock()
	r.gcs = append(r.gcs, gcReport{consumer, deleted, err})
}

func (r *gcRecorder) reports() []gcReport {
	r.gcMu.Lock()
	defer r.gcMu.Unlock()
	return append([]gcReport(nil), r.gcs...)
}

func TestRunCollectsExpiredClaims(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name      string
		batch     int
		wantCalls int // DeleteExpiredClaims calls of the first collection
	}{
		{name: "default batch", batch: 0, wantCalls: 1},
		{name: "batches of two", batch: 2, wantCalls: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := newMemStore()
			clk := newClock(t0)
			rec := &gcRecorder{}
			var logs bytes.Buffer
			c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
				cfg.Now = clk.now
				cfg.Failure.Rand = &fixedRand{}
				cfg.Observe.Observer = rec
				cfg.Observe.Logger = slog.New(slog.NewJSONHandler(&syncWriter{w: &logs}, nil))
				cfg.Claims.Maintenance = idem.MaintenanceConfig{Interval: 20 * time.Millisecond, Batch: tc.batch}
			})
			retention := c.Config().Claims.Retention
			// Five claims of this consumer made at t0, through the consumer's own path.
			for _, id := range []string{"e1", "e2", "e3", "e4", "e5"} {
				err := c.Process(context.Background(), idem.Message{EventID: id, Tenant: "acme", Payload: []byte(`{}`)}).Err
				require.NoError(t, err)
			}
			// Another consumer's old claims and this consumer's fresh ones are not this
			// collection's to delete.
			for _, id := range []string{"o1", "o2", "o3"} {
				store.addClaim(idem.Key{Tenant: "acme", Consumer: "other@v1", EventID: id}, t0)
			}
			for _, id := range []string{"f1", "f2"} {
				store.addClaim(idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: id}, t0.Add(retention))
			}
			require.Equal(t, 10, store.claimCount())

			// Within retention a collection deletes nothing.
			stop, _, _ := runFor(t, c, newMemSource())
			require.Eventually(t, func() bool { return len(rec.reports()) >= 1 }, 10*time.Second, 5*time.Millisecond)
			require.NoError(t, stop())
			require.Equal(t, gcReport{"ledger@v1", 0, nil}, rec.reports()[0])
			require.Equal(t, 10, store.claimCount())

			// Past retention the consumer's old claims go, in batches.
			clk.advance(retention + time.Minute)
			calls := store.gcStats()
			rec.gcMu.Lock()
			rec.gcs = nil
			rec.gcMu.Unlock()
			stop, _, _ = runFor(t, c, newMemSource())
			require.Eventually(t, func() bool { return len(rec.reports()) >= 1 }, 10*time.Second, 5*time.Millisecond)
			require.NoError(t, stop())
			require.Equal(t, gcReport{"ledger@v1", 5, nil}, rec.reports()[0])
			require.GreaterOrEqual(t, store.gcStats()-calls, tc.wantCalls)
			require.Equal(t, 5, store.claimCount(), "other consumers' and fresh claims stay")
			require.Contains(t, logs.String(), `"msg":"idem: expired claims collected","consumer":"ledger@v1","deleted":5`)
		})
	}
}

func TestRunMaintenanceJittersTheFirstRun(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	r := &fixedRand{v: int64(time.Hour)} // the first run as late as the interval allows
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Failure.Rand = r
		cfg.Claims.Maintenance = idem.MaintenanceConfig{Interval: time.Hour}
	})
	src := newMemSource(idem.Message{EventID: "e1", Tenant: "acme", Payload: []byte(`{}`)})
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return src.Settled("e1") == "ack" }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, int64(time.Hour), r.asked.Load(), "the first delay is drawn from [0, Interval)")
	require.Zero(t, store.gcStats(), "no collection before the jittered first run")
}

func TestRunMaintenanceDisabled(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Failure.Rand = &fixedRand{}
		cfg.Claims.Maintenance = idem.MaintenanceConfig{Disabled: true, Interval: time.Millisecond}
	})
	src := newMemSource(idem.Message{EventID: "e1", Tenant: "acme", Payload: []byte(`{}`)})
	stop, _, _ := runFor(t, c, src)
	require.Eventually(t, func() bool { return src.Settled("e1") == "ack" }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond) // fifty intervals
	require.NoError(t, stop())
	require.Zero(t, store.gcStats())

	// Manual collection still works.
	n, err := c.CollectGarbage(context.Background(), 0)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 1, store.gcStats())
}

func TestRunMaintenanceFailureIsReportedAndRetried(t *testing.T) {
	t.Parallel()
	store := newMemStore()
	store.setFailGC(errors.New("memstore: disk full"))
	rec := &gcRecorder{}
	var logs bytes.Buffer
	c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
		cfg.Failure.Rand = &fixedRand{}
		cfg.Observe.Observer = rec
		cfg.Observe.Logger = slog.New(slog.NewJSONHandler(&syncWriter{w: &logs}, nil))
		cfg.Claims.Maintenance = idem.MaintenanceConfig{Interval: 10 * time.Millisecond}
	})
	stop, _, _ := runFor(t, c, newMemSource())
	require.Eventually(t, func() bool { return len(rec.reports()) >= 2 }, 10*time.Second, 5*time.Millisecond)
	first := rec.reports()[0]
	require.ErrorContains(t, first.err, "disk full")
	store.setFailGC(nil)
	require.Eventually(t, func() bool {
		rs := rec.reports()
		return rs[len(rs)-1].err == nil
	}, 10*time.Second, 5*time.Millisecond, "the next interval tries again")
	require.NoError(t, stop())
	require.Contains(t, logs.String(), "idem: claim garbage collection failed")
	require.Zero(t, rec.pauses(), "a failed collection does not pause the consumer")
}

func TestMaintenanceConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		m       idem.MaintenanceConfig
		want    idem.MaintenanceConfig
		wantErr string
	}{
		{name: "defaults", want: idem.MaintenanceConfig{Interval: idem.MaintenanceIntervalDefault, Batch: idem.GCBatchDefault}},
		{name: "kept", m: idem.MaintenanceConfig{Interval: time.Minute, Batch: 5}, want: idem.MaintenanceConfig{Interval: time.Minute, Batch: 5}},
		{name: "disabled keeps defaults", m: idem.MaintenanceConfig{Disabled: true}, want: idem.MaintenanceConfig{Disabled: true, Interval: idem.MaintenanceIntervalDefault, Batch: idem.GCBatchDefault}},
		{name: "negative interval", m: idem.MaintenanceConfig{Interval: -time.Second}, wantErr: "Claims.Maintenance.Interval is -1s"},
		{name: "negative batch", m: idem.MaintenanceConfig{Batch: -1}, wantErr: "Claims.Maintenance.Batch is -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := idem.ConsumerConfig[*memTx]{Name: "ledger@v1", Handler: func(context.Context, *memTx, idem.Message) error { return nil }, Claims: idem.ClaimConfig{Maintenance: tc.m}}.WithDefaults()
			err := cfg.Validate()
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.Claims.Maintenance)
		})
	}
}
