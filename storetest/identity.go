package storetest

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// testDeadLettersOfLongestAndHostileIdentities runs messages with the longest valid identities
// and with hostile ones (a 12 KB event id, a 10 KB tenant, NUL bytes, invalid UTF-8, a NUL in a
// header) through Consumer.Run: the longest are claimed and dead-lettered in full, the hostile
// ones become invalid_payload dead letters that the store writes (in their bounded form) and
// lists, and none of them is left to loop in the broker.
func testDeadLettersOfLongestAndHostileIdentities[TTx any](s *suite[TTx]) {
	s.wallet("w1")
	longID := strings.Repeat("i", idem.MaxEventIDBytes-2) + "-1"
	longTenant := strings.Repeat("t", idem.MaxTenantBytes)
	longType := strings.Repeat("y", idem.MaxTypeBytes)
	at := func(m idem.Message) idem.Message { m.OccurredAt = s.at; return m }
	applied := at(idem.Message{EventID: longID, Tenant: longTenant, Type: longType, Payload: []byte(`{"wallet":"w1","amount":1}`)})
	refused := at(idem.Message{EventID: strings.Repeat("i", idem.MaxEventIDBytes-2) + "-2", Tenant: longTenant, Type: longType,
		Payload: []byte(`{"wallet":"nowhere","amount":1}`)}) // a precondition failure: permanent_error
	hostile := []idem.Message{
		at(idem.Message{EventID: strings.Repeat("x", 12<<10), Tenant: "acme", Payload: []byte(`{}`)}),
		at(idem.Message{EventID: "evt-tenant", Tenant: strings.Repeat("t", 10<<10), Payload: []byte(`{}`)}),
		at(idem.Message{EventID: "evt\x00nul", Tenant: "acme", Payload: []byte(`{}`)}),
		at(idem.Message{EventID: "evt-nul-tenant", Tenant: "ac\x00me", Type: "pay\x00", Payload: []byte(`{}`)}),
		at(idem.Message{EventID: "evt\xff\xfe", Tenant: "acme", Payload: []byte(`{}`)}),
		at(idem.Message{EventID: "evt\r\nlevel=ERROR", Tenant: "acme", Payload: []byte(`{}`)}),
		at(idem.Message{EventID: "evt-nul-header", Tenant: "acme", Payload: []byte(`{}`), Headers: map[string]string{"X-Trace": "a\x00b", "X\x00": "v"}}),
	}
	msgs := append([]idem.Message{applied, refused}, hostile...)

	c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) { cfg.Workers = 2 })
	src := &sliceSource{msgs: msgs, settled: map[int]string{}}
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, src) }()
	deadline := time.Now().Add(30 * time.Second)
	for src.settledCount() < len(msgs) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	require.NoError(s.t, <-done)
	require.Equal(s.t, len(msgs), src.settledCount(), "every delivery settled: %v", src.settledMap())
	for i := range msgs {
		want := "term"
		if i == 0 {
			want = "ack"
		}
		require.Equal(s.t, want, src.settledMap()[i], "message %d (event %q)", i, idem.BoundID(msgs[i].EventID))
	}

	require.EqualValues(s.t, 1, s.ledger(longID), "the longest identity is applied")
	require.EqualValues(s.t, 1, s.claims(idem.Key{Tenant: longTenant, Consumer: "ledger@v1", EventID: longID}))

	list, err := s.b.Store.ListDeadLetters(s.ctx, idemstore.DeadLetterFilter{Consumer: "ledger@v1", Limit: 100})
	require.NoError(s.t, err)
	require.Len(s.t, list, 1+len(hostile), "one dead letter per refused message, listed")
	byID := map[string]idem.DeadLetter{}
	for _, dl := range list {
		byID[dl.Message.EventID] = dl
		got, err := s.b.Store.GetDeadLetter(s.ctx, dl.ID)
		require.NoError(s.t, err)
		require.Equal(s.t, dl.Message.EventID, got.Message.EventID)
	}
	full, ok := byID[refused.EventID]
	require.True(s.t, ok, "the longest identity is dead-lettered in full")
	require.Equal(s.t, idem.ReasonPermanentError, full.Reason)
	require.Equal(s.t, longTenant, full.Message.Tenant)
	require.Equal(s.t, longType, full.Message.Type)
	byTenant, err := s.b.Store.ListDeadLetters(s.ctx, idemstore.DeadLetterFilter{Tenant: longTenant})
	require.NoError(s.t, err)
	require.Len(s.t, byTenant, 1, "listed by its tenant")

	for _, m := range hostile {
		dl, ok := byID[idem.BoundID(m.EventID)]
		require.True(s.t, ok, "dead letter of %q stored under its bounded id", idem.BoundID(m.EventID))
		wantReason := idem.ReasonInvalidPayload
		if idem.ValidateIdentity(m) == nil {
			wantReason = idem.ReasonPermanentError // the NUL header: the handler finds no wallet
		}
		require.Equal(s.t, wantReason, dl.Reason, "dead letter of %q", dl.Message.EventID)
		require.Equal(s.t, idem.DeadLetterPending, dl.Status)
		for _, v := range []string{dl.Message.EventID, dl.Message.Tenant, dl.Message.Type} {
			require.LessOrEqual(s.t, len(v), idem.MaxTenantBytes, "stored identities are bounded")
			require.NotContains(s.t, v, "\x00")
		}
		require.Equal(s.t, m.Payload, dl.Message.Payload, "the payload is kept")
	}
	nulHeader := byID["evt-nul-header"]
	require.Equal(s.t, `a\x00b`, nulHeader.Message.Headers["X-Trace"], "a header the store cannot keep is escaped")
}

// sliceSource hands out a fixed list of messages once each and records how each was settled; a
// nak puts the message back after its delay with its attempt counted.
type sliceSource struct {
	mu      sync.Mutex
	msgs    []idem.Message
	next    []int
	started bool
	settled map[int]string
}

func (s *sliceSource) Receive(ctx context.Context, max int) ([]idem.Delivery, error) {
	for {
		s.mu.Lock()
		if !s.started {
			s.started = true
			for i := range s.msgs {
				s.next = append(s.next, i)
			}
		}
		if len(s.next) > 0 {
			n := min(max, len(s.next))
			out := make([]idem.Delivery, n)
			for j, i := range s.next[:n] {
				m := s.msgs[i]
				if m.Attempt < 1 {
					m.Attempt = 1
				}
				out[j] = &sliceDelivery{src: s, i: i, msg: m}
			}
			s.next = s.next[n:]
			s.mu.Unlock()
			return out, nil
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (s *sliceSource) Lease() time.Duration { return 30 * time.Second }
func (s *sliceSource) Name() string         { return "storetest" }
func (s *sliceSource) Close() error         { return nil }

func (s *sliceSource) settle(i int, how string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled[i] = how
}

func (s *sliceSource) settledCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.settled)
}

func (s *sliceSource) settledMap() map[int]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[int]string, len(s.settled))
	for k, v := range s.settled {
		out[k] = v
	}
	return out
}

type sliceDelivery struct {
	src *sliceSource
	i   int
	msg idem.Message
}

func (d *sliceDelivery) Message() idem.Message        { return d.msg }
func (d *sliceDelivery) Ack(context.Context) error    { d.src.settle(d.i, "ack"); return nil }
func (d *sliceDelivery) Term(context.Context) error   { d.src.settle(d.i, "term"); return nil }
func (d *sliceDelivery) Extend(context.Context) error { return nil }

// Nak puts the message back: a dead letter the store refused would show up here as a loop.
func (d *sliceDelivery) Nak(ctx context.Context, delay time.Duration) error {
	d.src.mu.Lock()
	defer d.src.mu.Unlock()
	d.src.msgs[d.i].Attempt = d.msg.Attempt + 1
	d.src.next = append(d.src.next, d.i)
	return nil
}
