package idemtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

// effectHandler records the message's event id as the effect, and fails as its payload says.
func effectHandler(ctx context.Context, tx *memTx, msg idem.Message) error {
	switch string(msg.Payload) {
	case `"fail"`:
		return errors.New("handler failed")
	case `"permanent"`:
		return idem.Permanent(errors.New("handler refused"))
	}
	tx.effects = append(tx.effects, msg.EventID)
	return nil
}

func newConsumer(t *testing.T, store *memStore, h idem.Handler[*memTx]) *idem.Consumer[*memTx] {
	t.Helper()
	c, err := idem.NewConsumer[*memTx](store, idem.ConsumerConfig[*memTx]{Name: "test@v1", Handler: h})
	require.NoError(t, err)
	return c
}

func TestRollback(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	cases := []struct {
		name         string
		beginErr     error
		commitAnyway bool
		fnErr        error
		wantErr      []error // each must be in the chain; none means nil
		wantRan      bool
	}{
		{name: "success rolls back", wantRan: true},
		{name: "fn error is returned", fnErr: boom, wantErr: []error{boom}, wantRan: true},
		{name: "begin error is returned", beginErr: boom, wantErr: []error{boom}},
		{name: "a store that commits anyway is reported", commitAnyway: true, wantErr: []error{boom}, fnErr: boom, wantRan: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := newMemStore()
			store.beginErr, store.commitAnyway = tc.beginErr, tc.commitAnyway
			ran := false
			err := idemtest.Rollback(context.Background(), store, func(ctx context.Context, tx *memTx) error {
				ran = true
				tx.effects = append(tx.effects, "written")
				require.Equal(t, []string{"written"}, tx.effects, "the write is visible inside")
				return tc.fnErr
			})
			require.Equal(t, tc.wantRan, ran)
			if len(tc.wantErr) == 0 {
				require.NoError(t, err)
			}
			for _, w := range tc.wantErr {
				require.ErrorIs(t, err, w)
			}
			_, effects := store.committed()
			if tc.commitAnyway {
				require.ErrorContains(t, err, "should have rolled back")
				return
			}
			require.Empty(t, effects, "nothing may be committed")
		})
	}
}

func TestProcessRollback(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		msg         func(t *testing.T) idem.Message
		wantOutcome idem.Outcome
		wantErr     error
		wantEffect  bool
	}{
		{name: "processed", msg: func(t *testing.T) idem.Message { return idemtest.Message(t, "payment.captured", "ok") },
			wantOutcome: idem.OutcomeProcessed, wantEffect: true},
		{name: "handler failure", msg: func(t *testing.T) idem.Message { return idemtest.Message(t, "payment.captured", "fail") },
			wantOutcome: idem.OutcomeFailed},
		{name: "invalid identity never reaches the handler", msg: func(t *testing.T) idem.Message {
			return idemtest.Message(t, "payment.captured", "ok", idemtest.WithEventID(""))
		}, wantOutcome: idem.OutcomeFailed, wantErr: idem.ErrInvalidPayload},
		{name: "too old", msg: func(t *testing.T) idem.Message {
			old := time.Now().Add(-30 * 24 * time.Hour)
			m := idemtest.Message(t, "payment.captured", "ok", idemtest.WithOccurredAt(old))
			m.PublishedAt = old
			return m
		}, wantOutcome: idem.OutcomeFailed, wantErr: idem.ErrTooOld},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := newMemStore()
			c := newConsumer(t, store, effectHandler)
			msg := tc.msg(t)
			inspected := false
			res, err := idemtest.ProcessRollback(context.Background(), t, c, store, msg, func(ctx context.Context, tx *memTx, res idem.Result) {
				inspected = true
				if tc.wantEffect {
					require.Equal(t, []string{msg.EventID}, tx.effects, "the effect is visible inside the transaction")
					require.Len(t, tx.claims, 1)
				}
			})
			require.True(t, inspected)
			require.Equal(t, tc.wantOutcome, res.Outcome)
			require.Equal(t, res.Err, err)
			if tc.wantOutcome == idem.OutcomeProcessed {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
			}
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
			}
			claims, effects := store.committed()
			require.Zero(t, claims, "the claim is rolled back")
			require.Empty(t, effects, "the effect is rolled back")
			// Rolled back means nothing happened: the same message processes again.
			if tc.wantEffect {
				res := c.Process(context.Background(), msg)
				err := res.Err
				require.NoError(t, err)
				require.Equal(t, idem.OutcomeProcessed, res.Outcome)
			}
		})
	}
}

// TestProcessTxCommit checks the other half of ProcessTx's contract: a committed transaction
// keeps the claim and the effect, so the next delivery is a duplicate and a reused key is refused.
func TestProcessTxCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newMemStore()
	c := newConsumer(t, store, effectHandler)
	msg := idemtest.Message(t, "payment.captured", "ok")
	require.NoError(t, store.InTx(ctx, func(ctx context.Context, tx *memTx) error {
		err := c.ProcessTx(ctx, tx, msg).Err
		return err
	}))
	claims, effects := store.committed()
	require.Equal(t, 1, claims)
	require.Equal(t, []string{msg.EventID}, effects)

	cases := []struct {
		name    string
		msg     idem.Message
		outcome idem.Outcome
	}{
		{"same message is a duplicate", msg, idem.OutcomeDuplicate},
		{"other content under the key is key reuse", func() idem.Message { m := msg.Clone(); m.Payload = []byte(`"other"`); return m }(), idem.OutcomeKeyReuse},
	}
	for _, tc := range cases {
		res, _ := idemtest.ProcessRollback(ctx, t, c, store, tc.msg, nil)
		require.Equal(t, tc.outcome, res.Outcome, tc.name)
	}
	_, effects = store.committed()
	require.Len(t, effects, 1, "no second effect")
}

// fatalTB records Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestMessage(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name    string
		payload any
		opts    []idemtest.MessageOption
		want    func(t *testing.T, m idem.Message)
	}{
		{name: "nil payload", payload: nil, want: func(t *testing.T, m idem.Message) { require.Nil(t, m.Payload) }},
		{name: "bytes as is", payload: []byte(`{"a":1}`), want: func(t *testing.T, m idem.Message) { require.JSONEq(t, `{"a":1}`, string(m.Payload)) }},
		{name: "string as JSON", payload: "plain", want: func(t *testing.T, m idem.Message) { require.Equal(t, `"plain"`, string(m.Payload)) }},
		{name: "raw JSON as is", payload: json.RawMessage(`[1]`), want: func(t *testing.T, m idem.Message) { require.Equal(t, "[1]", string(m.Payload)) }},
		{name: "struct as JSON", payload: struct {
			Amount int `json:"amount"`
		}{42}, want: func(t *testing.T, m idem.Message) { require.JSONEq(t, `{"amount":42}`, string(m.Payload)) }},
		{name: "options", payload: nil,
			opts: []idemtest.MessageOption{idemtest.WithEventID("e1"), idemtest.WithTenant("acme"), idemtest.WithOccurredAt(at), idemtest.WithHeader("K", "v"), idemtest.WithAttempt(3)},
			want: func(t *testing.T, m idem.Message) {
				require.Equal(t, "e1", m.EventID)
				require.Equal(t, "acme", m.Tenant)
				require.Equal(t, at, m.OccurredAt)
				require.Equal(t, "v", m.Header("K"))
				require.Equal(t, 3, m.Attempt)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := idemtest.Message(t, "order.placed", tc.payload, tc.opts...)
			require.Equal(t, "order.placed", m.Type)
			require.NoError(t, idem.ValidateIdentity(m))
			tc.want(t, m)
			if len(tc.opts) == 0 {
				require.Equal(t, idemtest.TenantDefault, m.Tenant)
				require.Equal(t, 1, m.Attempt)
				require.WithinDuration(t, time.Now(), m.OccurredAt, time.Minute)
				require.True(t, strings.HasPrefix(m.EventID, "evt-"))
			}
		})
	}

	t.Run("unique ids", func(t *testing.T) {
		seen := map[string]bool{}
		for range 1000 {
			id := idemtest.Message(t, "x", nil).EventID
			require.False(t, seen[id], "duplicate id %s", id)
			seen[id] = true
		}
	})
	t.Run("unencodable payload fails the test", func(t *testing.T) {
		f := &fatalTB{TB: t}
		done := make(chan struct{})
		go func() { defer close(done); idemtest.Message(f, "x", make(chan int)) }()
		<-done
		require.Contains(t, f.msg, "encode payload")
	})
}

func TestSink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	boom := errors.New("broker down")
	cases := []struct {
		name    string
		setup   func(s *idemtest.Sink)
		wantErr error
		wantN   int
	}{
		{name: "records", setup: func(*idemtest.Sink) {}, wantN: 2},
		{name: "FailWith records nothing", setup: func(s *idemtest.Sink) { s.FailWith(boom) }, wantErr: boom},
		{name: "closed", setup: func(s *idemtest.Sink) { require.NoError(t, s.Close()) }, wantErr: errors.New("closed")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := idemtest.NewSink()
			tc.setup(s)
			a, b := idemtest.Message(t, "a", "1"), idemtest.Message(t, "b", "2")
			err := s.Publish(ctx, "orders", a, b)
			switch {
			case tc.wantErr == boom:
				require.ErrorIs(t, err, boom)
			case tc.wantErr != nil:
				require.ErrorContains(t, err, tc.wantErr.Error())
			default:
				require.NoError(t, err)
			}
			require.Len(t, s.Published(), tc.wantN)
			if tc.wantN > 0 {
				require.Equal(t, []string{a.EventID, b.EventID}, s.EventIDs("orders"))
				require.Empty(t, s.Topic("other"))
				a.Payload[0] = 'X'
				require.Equal(t, `"1"`, string(s.Topic("orders")[0].Payload), "the sink keeps a copy")
				s.Reset()
				require.Empty(t, s.Published())
			}
		})
	}
}

func TestSourceDrivesRun(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	failedOnce := map[string]bool{}
	handler := func(ctx context.Context, tx *memTx, msg idem.Message) error {
		if string(msg.Payload) == `"flaky"` {
			mu.Lock()
			first := !failedOnce[msg.EventID]
			failedOnce[msg.EventID] = true
			mu.Unlock()
			if first {
				return idem.RetryAfter(errors.New("flaky"), time.Millisecond)
			}
		}
		return effectHandler(ctx, tx, msg)
	}
	cases := []struct {
		payload  string
		want     idemtest.Settlement
		wantNaks int
	}{
		{"ok", idemtest.SettledAck, 0},
		{"permanent", idemtest.SettledTerm, 0},
		{"flaky", idemtest.SettledAck, 1},
	}
	for _, tc := range cases {
		t.Run(tc.payload, func(t *testing.T) {
			t.Parallel()
			store := newMemStore()
			c := newConsumer(t, store, handler)
			msg := idemtest.Message(t, "x", tc.payload)
			src := idemtest.NewSource(idemtest.SourceConfig{}, msg)
			ctx, cancel := context.WithCancel(context.Background())
			runErr := make(chan error, 1)
			go func() { runErr <- c.Run(ctx, src) }()
			wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer wcancel()
			got, err := src.Wait(wctx, msg.EventID)
			require.NoError(t, err)
			cancel()
			require.NoError(t, <-runErr)
			require.Equal(t, []idemtest.Settlement{tc.want}, got)
			require.Equal(t, tc.wantNaks, src.Naks())
		})
	}
}

func TestSourceReportsLimits(t *testing.T) {
	t.Parallel()
	src := idemtest.NewSource(idemtest.SourceConfig{Name: "q", DeliveryLimit: 2, RedeliveryWindow: time.Hour})
	require.Equal(t, "q", src.Name())
	require.Equal(t, time.Minute, src.Lease())
	store := newMemStore()
	c := newConsumer(t, store, effectHandler)
	err := c.Run(context.Background(), src)
	require.ErrorContains(t, err, "delivery limit is 2")

	require.NoError(t, src.Close())
	_, err = src.Receive(context.Background(), 1)
	require.Error(t, err)
}

// failEnqueuer fails every enqueue.
type failEnqueuer struct{ err error }

func (f failEnqueuer) EnqueueTx(context.Context, *memTx, ...idem.Outgoing) error { return f.err }

func TestOutboxRecordsPerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	boom := errors.New("outbox full")
	cases := []struct {
		name    string
		next    idemtest.Enqueuer[*memTx]
		wantErr error
		wantN   int
	}{
		{name: "record only", wantN: 2},
		{name: "failing next records nothing", next: failEnqueuer{boom}, wantErr: boom},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := newMemStore()
			out := &idemtest.Outbox[*memTx]{Next: tc.next}
			// The handler under test enqueues a follow-up event with the effect.
			h := func(ctx context.Context, tx *memTx, msg idem.Message) error {
				return out.EnqueueTx(ctx, tx,
					idem.Outgoing{EventID: msg.EventID + "-shipped", Topic: "shipping", Payload: []byte(`{}`)},
					idem.Outgoing{EventID: msg.EventID + "-mailed", Topic: "mail"})
			}
			c := newConsumer(t, store, h)
			msg := idemtest.Message(t, "order.paid", map[string]int{"amount": 1})
			_, err := idemtest.ProcessRollback(ctx, t, c, store, msg, func(ctx context.Context, tx *memTx, _ idem.Result) {
				got := out.Enqueued(tx)
				require.Len(t, got, tc.wantN)
				if tc.wantN > 0 {
					require.Equal(t, msg.EventID+"-shipped", got[0].EventID)
					require.Equal(t, "mail", got[1].Topic)
				}
			})
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.Empty(t, out.Enqueued(&memTx{}), "another transaction saw nothing")
		})
	}
}
