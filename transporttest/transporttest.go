// Package transporttest is the conformance suite every idem transport passes against a real
// broker: the same checks of receiving, settling, leases and publishing for JetStream, the
// queue table and the other brokers. A transport package runs it from its tests with Exercise,
// giving a Harness that opens topics, sources and sinks, and declaring in Features what its
// broker guarantees beyond the common contract.
//
// Every check runs as a parallel subtest on its own topic, so the checks share one broker
// safely, and every broker call is bounded: a transport that hangs fails the check instead of
// the test binary's timeout. The whole suite takes a few seconds of wall time.
package transporttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Features declares what a transport's broker guarantees beyond the common contract; the
// checks of an undeclared feature are skipped.
type Features struct {
	// BrokerDedup: publishing the same EventID twice within the broker's dedup window delivers
	// once (JetStream Nats-Msg-Id, SQS FIFO deduplication id).
	BrokerDedup bool
	// DelayedNak: Nak(delay) is honoured by the broker: the message does not come back earlier.
	DelayedNak bool
	// Persistent: a source closed and reopened under the same name resumes where it stopped,
	// delivering exactly the messages it had not acked.
	Persistent bool
	// FencedSettle: two sources opened under the same name share its messages, and a delivery
	// whose lease another one took over can no longer be settled: its Ack, Extend, Nak and Term
	// fail with idem.ErrLeaseLost (see takeover.go).
	FencedSettle bool
	// Takeover: two sources opened under the same name share its messages, and a message whose
	// delivery's lease ran out goes to the other one; implied by FencedSettle. Then a late Nak or
	// Extend of the old delivery must fail with idem.ErrLeaseLost and leave the new owner's
	// lease alone (see takeover.go). Not JetStream: a durable's AckWait belongs to the
	// consumer, so its sources share one lease.
	Takeover bool
	// FanOut: sources opened under different names on one topic each receive every message
	// published after they were opened (subscriptions, consumer groups, durables), and sources
	// of one name share theirs (see fanout.go).
	FanOut bool
}

// Harness opens the broker resources one check needs. Each function registers its own cleanup
// with tb.Cleanup.
type Harness struct {
	// Features declares the broker's extra guarantees.
	Features Features
	// NewTopic returns a fresh, isolated topic (stream subject, queue name) for one check.
	NewTopic func(tb testing.TB) string
	// Source opens a source on topic with the given lease (AckWait). name identifies a durable
	// consumer: reopening with the same name resumes it. The suite may Close the source itself,
	// so the cleanup must tolerate a second Close.
	Source func(tb testing.TB, topic, name string, lease time.Duration) idem.Source
	// Sink opens a sink that publishes to topics made by NewTopic.
	Sink func(tb testing.TB) idem.Sink
	// Refuse, when set, turns m into a message the broker refuses to store on a topic made by
	// NewTopic while it stores the other messages of the same Publish call (JetStream: a payload
	// above the stream's MaxMsgSize). It injects a fault into one message of a batch; the
	// PublishRefused check is skipped without it.
	Refuse func(m idem.Message) idem.Message
}

// SourceNames are the names the checks and the benchmark open sources under. A transport whose
// sources receive only what is published after their name exists (Pub/Sub subscriptions,
// queue-table subscriptions), as in a deployment that creates its subscriptions before producers
// publish, creates these in Harness.NewTopic: some checks publish before they open a source.
var SourceNames = []string{"bench", "cancelled", "closed", "closing", "concurrent", "confirm", "ctx", "dedup", "email", "extend",
	"fenced", "handover", "lease", "ledger", "max", "nakdelay", "naknow", "refused", "resume", "reuse", "roundtrip", "term"}

// Timing of the checks. Leases are short so that lease expiry and delayed naks are observable
// within seconds; slack absorbs scheduling on a loaded two-core machine.
const (
	shortLease = 1 * time.Second
	longLease  = 10 * time.Second
	nakDelay   = 2 * time.Second
	// slack is the extra time allowed for a broker to do what it promised.
	slack = 3 * time.Second
	// grace is how long a call may overrun its context before the suite declares it hung.
	grace = 2 * time.Second
	// callTimeout bounds a single publish or settle.
	callTimeout = 10 * time.Second
)

// check is one conformance check; needs names the feature it requires, if any.
type check struct {
	name  string
	needs string
	run   func(t *testing.T, h Harness)
}

// Exercise runs the conformance checks against h, each as a parallel subtest on its own topic.
func Exercise(t *testing.T, h Harness) {
	t.Helper()
	if h.NewTopic == nil || h.Source == nil || h.Sink == nil {
		t.Fatal("transporttest: Harness needs NewTopic, Source and Sink")
	}
	checks := []check{
		{name: "PublishReceiveAck", run: testPublishReceiveAck},
		{name: "RedeliverAfterLease", run: testRedeliverAfterLease},
		{name: "NakNow", run: testNakNow},
		{name: "NakDelay", needs: feature(h.Features.DelayedNak, "DelayedNak"), run: testNakDelay},
		{name: "ExtendHoldsLease", run: testExtendHoldsLease},
		{name: "TermNeverRedelivers", run: testTermNeverRedelivers},
		{name: "BrokerDedup", needs: feature(h.Features.BrokerDedup, "BrokerDedup"), run: testBrokerDedup},
		{name: "PersistentResume", needs: feature(h.Features.Persistent, "Persistent"), run: testPersistentResume},
		{name: "CloseWhilePrefetching", needs: feature(h.Features.Persistent, "Persistent"), run: testCloseWhilePrefetching},
		{name: "PublishConfirms", run: testPublishConfirms},
		{name: "PublishRefused", needs: feature(h.Refuse != nil, "Refuse (Harness)"), run: testPublishRefused},
		{name: "KeyReuseReachesConsumer", run: testKeyReuseReachesConsumer},
		{name: "ReceiveMax", run: testReceiveMax},
		{name: "ReceiveContext", run: testReceiveContext},
		{name: "ReceiveCancelledGivesBack", run: testReceiveCancelledGivesBack},
		{name: "ReceiveCancelledSteady", run: testReceiveCancelledSteady},
		{name: "ConcurrentReceiveAck", run: testConcurrentReceiveAck},
		{name: "FencedSettle", needs: feature(h.Features.FencedSettle, "FencedSettle"), run: testFencedSettle},
		{name: "LateSettleKeepsTakeover", needs: feature(h.Features.Takeover || h.Features.FencedSettle, "Takeover"), run: testLateSettleKeepsTakeover},
		{name: "FanOut", needs: feature(h.Features.FanOut, "FanOut"), run: testFanOut},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.needs != "" {
				t.Skipf("transport does not declare Features.%s", c.needs)
			}
			c.run(t, h)
		})
	}
}

// feature returns name when the feature is not declared, so the check is skipped.
func feature(declared bool, name string) string {
	if declared {
		return ""
	}
	return name
}

// testPublishReceiveAck: every field survives the trip (trace headers included), the first
// delivery is attempt 1, and an acked message does not come back after its lease.
func testPublishReceiveAck(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "roundtrip", shortLease)
	if got := src.Lease(); got != shortLease {
		t.Errorf("Lease() = %v, want the %v the source was opened with", got, shortLease)
	}
	if src.Name() == "" {
		t.Error("Name() is empty; it identifies the source in logs and dead letters")
	}
	prefix := newPrefix(t)
	occurred := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	sent := []idem.Message{
		{
			EventID: prefix + "-full",
			Tenant:  "tenant-a",
			Type:    "payment.captured",
			Payload: []byte(`{"order":"o-1","amount_cents":1250}`),
			Headers: map[string]string{"Trace-Id": "trace-1", "x-request-id": "req-1",
				// W3C Trace Context, as idemotel writes it: a consumer's span hangs under the
				// producer's only if every transport carries these two unchanged.
				"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
			OccurredAt: occurred,
		},
		{EventID: prefix + "-binary", Type: "blob", Payload: []byte{0, 1, 2, 0x7f, 0x80, 0xfe, 0xff}},
		{EventID: prefix + "-bare", Payload: []byte("x")},
	}
	before := time.Now()
	publish(t, h.Sink(t), topic, sent...)

	got := receiveN(t, src, len(sent), 5*time.Second)
	byID := indexByID(t, got)
	for _, want := range sent {
		d, ok := byID[want.EventID]
		if !ok {
			t.Errorf("event %s was published but not received", want.EventID)
			continue
		}
		checkMessage(t, want, d.Message(), before)
	}
	for _, d := range got {
		ack(t, d)
	}
	// Past the lease, an acked message must stay settled.
	expectNone(t, src, shortLease+time.Second)
}

// checkMessage compares a received message with the one published.
func checkMessage(t *testing.T, want, got idem.Message, publishedAfter time.Time) {
	t.Helper()
	id := want.EventID
	if got.Tenant != want.Tenant {
		t.Errorf("event %s: Tenant = %q, want %q", id, got.Tenant, want.Tenant)
	}
	if got.Type != want.Type {
		t.Errorf("event %s: Type = %q, want %q", id, got.Type, want.Type)
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		t.Errorf("event %s: Payload = %q, want %q", id, got.Payload, want.Payload)
	}
	for k, v := range want.Headers {
		if gv, ok := got.Headers[k]; !ok || gv != v {
			t.Errorf("event %s: header %q = %q (present %v), want %q; all headers %v", id, k, gv, ok, v, got.Headers)
		}
	}
	if !got.OccurredAt.Equal(want.OccurredAt) {
		t.Errorf("event %s: OccurredAt = %v, want %v", id, got.OccurredAt, want.OccurredAt)
	}
	if got.Attempt != 1 {
		t.Errorf("event %s: Attempt = %d on the first delivery, want 1", id, got.Attempt)
	}
	// Brokers stamp with their own clock; a minute allows for skew, not for a missing stamp.
	if got.PublishedAt.Before(publishedAfter.Add(-time.Minute)) || got.PublishedAt.After(time.Now().Add(time.Minute)) {
		t.Errorf("event %s: PublishedAt = %v, want about %v", id, got.PublishedAt, publishedAfter)
	}
}

// testRedeliverAfterLease: a delivery nobody settles comes back after its lease, as attempt 2.
func testRedeliverAfterLease(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "lease", shortLease)
	m := idem.Message{EventID: newPrefix(t) + "-unacked", Payload: []byte("p")}
	publish(t, h.Sink(t), topic, m)

	first := receiveN(t, src, 1, 5*time.Second)
	requireIDs(t, first, m.EventID)
	received := time.Now()

	again := receiveN(t, src, 1, shortLease+slack)
	requireIDs(t, again, m.EventID)
	if elapsed := time.Since(received); elapsed < shortLease*8/10 {
		t.Errorf("event %s came back %v after delivery, before its lease of %v", m.EventID, elapsed, shortLease)
	}
	if got := again[0].Message().Attempt; got != 2 {
		t.Errorf("event %s: Attempt = %d on redelivery, want 2", m.EventID, got)
	}
	ack(t, again[0])
}

// testNakNow: Nak without delay makes the message available again at once, not after the lease.
func testNakNow(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "naknow", longLease)
	m := idem.Message{EventID: newPrefix(t) + "-nak0", Payload: []byte("p")}
	publish(t, h.Sink(t), topic, m)

	ds := receiveN(t, src, 1, 5*time.Second)
	requireIDs(t, ds, m.EventID)
	settle(t, "Nak(0)", m.EventID, func(ctx context.Context) error { return ds[0].Nak(ctx, 0) })

	again := receiveN(t, src, 1, slack)
	requireIDs(t, again, m.EventID)
	if got := again[0].Message().Attempt; got != 2 {
		t.Errorf("event %s: Attempt = %d after Nak, want 2", m.EventID, got)
	}
	ack(t, again[0])
}

// testNakDelay: Nak(delay) keeps the message away for the delay, then brings it back.
func testNakDelay(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "nakdelay", shortLease)
	m := idem.Message{EventID: newPrefix(t) + "-nakdelay", Payload: []byte("p")}
	publish(t, h.Sink(t), topic, m)

	ds := receiveN(t, src, 1, 5*time.Second)
	requireIDs(t, ds, m.EventID)
	naked := time.Now()
	settle(t, "Nak(delay)", m.EventID, func(ctx context.Context) error { return ds[0].Nak(ctx, nakDelay) })

	expectNone(t, src, nakDelay*8/10)
	again := receiveN(t, src, 1, time.Until(naked.Add(nakDelay+shortLease+slack)))
	requireIDs(t, again, m.EventID)
	if elapsed := time.Since(naked); elapsed < nakDelay*8/10 {
		t.Errorf("event %s came back %v after Nak(%v)", m.EventID, elapsed, nakDelay)
	}
	if got := again[0].Message().Attempt; got != 2 {
		t.Errorf("event %s: Attempt = %d after Nak, want 2", m.EventID, got)
	}
	ack(t, again[0])
}

// testExtendHoldsLease: a slow handler extending at a third of the lease keeps its message for
// three leases; meanwhile nobody else receives it, and its ack still succeeds.
func testExtendHoldsLease(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "extend", shortLease)
	m := idem.Message{EventID: newPrefix(t) + "-slow", Payload: []byte("p")}
	publish(t, h.Sink(t), topic, m)

	ds := receiveN(t, src, 1, 5*time.Second)
	requireIDs(t, ds, m.EventID)
	hold := 3 * shortLease
	stop := make(chan struct{})
	extendErrs := make(chan error, 1)
	go func() {
		defer close(extendErrs)
		tick := time.NewTicker(shortLease / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				ctx, cancel := context.WithTimeout(context.Background(), shortLease)
				err := ds[0].Extend(ctx)
				cancel()
				if err != nil {
					extendErrs <- fmt.Errorf("Extend event %s: %w", m.EventID, err)
					return
				}
			}
		}
	}()
	expectNone(t, src, hold)
	close(stop)
	if err := <-extendErrs; err != nil {
		t.Error(err)
	}
	ack(t, ds[0])
}

// testTermNeverRedelivers: a terminated delivery does not come back, even past its lease.
func testTermNeverRedelivers(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "term", shortLease)
	m := idem.Message{EventID: newPrefix(t) + "-term", Payload: []byte("p")}
	publish(t, h.Sink(t), topic, m)

	ds := receiveN(t, src, 1, 5*time.Second)
	requireIDs(t, ds, m.EventID)
	settle(t, "Term", m.EventID, ds[0].Term)
	expectNone(t, src, 2*shortLease+time.Second)
}

// testBrokerDedup: the same EventID published three times (twice alone, once twice in a
// batch) is delivered once.
func testBrokerDedup(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "dedup", longLease)
	sink := h.Sink(t)
	m := idem.Message{EventID: newPrefix(t) + "-dup", Type: "t", Payload: []byte("same")}
	publish(t, sink, topic, m)
	publish(t, sink, topic, m)
	publish(t, sink, topic, m, m)

	got := receiveFor(t, src, 10, 2*time.Second)
	requireIDs(t, got, m.EventID)
	ack(t, got[0])
}

// testPersistentResume: a source that acked half of the messages and closed is replaced by a
// new one with the same name, which receives exactly the other half.
func testPersistentResume(t *testing.T, h Harness) {
	const n = 10
	topic := h.NewTopic(t)
	prefix := newPrefix(t)
	msgs := make([]idem.Message, n)
	for i := range msgs {
		msgs[i] = idem.Message{EventID: fmt.Sprintf("%s-%02d", prefix, i), Payload: []byte{byte(i)}}
	}
	publish(t, h.Sink(t), topic, msgs...)

	first := openSource(t, h, topic, "resume", longLease)
	var acked []idem.Delivery
	deadline := time.Now().Add(5 * time.Second)
	for len(acked) < n/2 && time.Now().Before(deadline) {
		ds, err := receive(t, first, n/2-len(acked), time.Until(deadline))
		if err != nil {
			break
		}
		if len(ds) > n/2-len(acked) {
			t.Fatalf("Receive(max=%d) returned %d deliveries", n/2-len(acked), len(ds))
		}
		for _, d := range ds {
			ack(t, d)
		}
		acked = append(acked, ds...)
	}
	if len(acked) != n/2 {
		t.Fatalf("received %d of %d messages before closing", len(acked), n/2)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	second := openSource(t, h, topic, "resume", longLease)
	rest := receiveN(t, second, n-n/2, 5*time.Second)
	rest = append(rest, receiveFor(t, second, n, time.Second)...)
	seen := make(map[string]bool, n)
	for _, d := range acked {
		seen[d.Message().EventID] = true
	}
	var wantRest []string
	for _, m := range msgs {
		if !seen[m.EventID] {
			wantRest = append(wantRest, m.EventID)
		}
	}
	requireIDs(t, rest, wantRest...)
	for _, d := range rest {
		if a := d.Message().Attempt; a != 1 {
			t.Errorf("event %s: Attempt = %d after resume, want 1 (it was never delivered)", d.Message().EventID, a)
		}
		ack(t, d)
	}
}

// testCloseWhilePrefetching: a source closed while the messages it reads ahead are still
// arriving gives back every message no Receive returned, at once and without spending an
// attempt. Round after round a source of one name is opened, takes a message or two (or
// nothing), and is closed 0 to 3 ms later, when the transport's prefetch is on its way; every
// message must then reach a later source of that name on its first attempt, well within the
// lease. A RabbitMQ source that had read a delivery off the channel but not yet buffered it when
// Close won the race dropped it: the broker requeued it as redelivered, and the next consumer saw
// Attempt 2 for a message no handler had seen, one attempt of its retry budget spent by a
// graceful restart.
func testCloseWhilePrefetching(t *testing.T, h Harness) {
	const n, rounds, max = 60, 20, 2
	topic := h.NewTopic(t)
	msgs, ids := numbered(t, n)
	publish(t, h.Sink(t), topic, msgs...)

	var got []idem.Delivery
	take := func(ds []idem.Delivery, when string) {
		ackFirstAttempts(t, ds, when, "a source closed while prefetching spent an attempt no handler saw")
		got = append(got, ds...)
	}
	for i := range rounds {
		src := openSource(t, h, topic, "closing", longLease) // its cleanup's Close is a second one
		if i%3 != 2 {                                        // every third source closes without a Receive: its prefetch alone is in flight
			ds, err := receive(t, src, max, 5*time.Second)
			if err != nil {
				t.Fatalf("round %d: Receive: %v", i, err)
			}
			take(ds, fmt.Sprintf("in round %d", i))
		}
		time.Sleep(mrand.N(3*time.Millisecond + 1))
		if err := call(t, "Close", callTimeout, func(context.Context) error { return src.Close() }); err != nil {
			t.Fatalf("round %d: Close: %v", i, err)
		}
	}
	// What no Receive returned must come to the next source at once, not after the lease.
	last := openSource(t, h, topic, "closing", longLease)
	rest := receiveN(t, last, n-len(got), longLease/2)
	rest = append(rest, receiveFor(t, last, n, time.Second)...)
	take(rest, "after the closed sources")
	requireIDs(t, got, ids...)
}

// testPublishConfirms: Publish returns once the broker holds the messages (a source sees them
// at once), a batch arrives whole, an empty publish is a no-op, and a publish whose context has
// ended reports an error rather than an unconfirmed success.
func testPublishConfirms(t *testing.T, h Harness) {
	const batch = 100
	topic := h.NewTopic(t)
	sink := h.Sink(t)
	prefix := newPrefix(t)

	one := idem.Message{EventID: prefix + "-one", Payload: []byte("1")}
	publish(t, sink, topic, one)
	src := openSource(t, h, topic, "confirm", longLease)
	ds := receiveN(t, src, 1, time.Second)
	requireIDs(t, ds, one.EventID)
	ack(t, ds[0])

	msgs := make([]idem.Message, batch)
	ids := make([]string, batch)
	for i := range msgs {
		ids[i] = fmt.Sprintf("%s-b%03d", prefix, i)
		msgs[i] = idem.Message{EventID: ids[i], Payload: []byte(ids[i])}
	}
	publish(t, sink, topic, msgs...)
	got := receiveN(t, src, batch, 10*time.Second)
	requireIDs(t, got, ids...)
	for _, d := range got {
		ack(t, d)
	}

	if err := call(t, "Publish()", callTimeout, func(ctx context.Context) error { return sink.Publish(ctx, topic) }); err != nil {
		t.Errorf("Publish with no messages: %v", err)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	err := call(t, "Publish(cancelled)", callTimeout, func(context.Context) error {
		return sink.Publish(ended, topic, idem.Message{EventID: prefix + "-cancelled", Payload: []byte("c")})
	})
	if err == nil {
		t.Error("Publish with a cancelled context returned nil; it cannot have waited for the broker's confirmation")
	}
}

// testPublishRefused: when the broker refuses one message of a batch, Publish reports an error
// naming that event (never nil, which would let the relay mark it published and send the key's
// later rows), the refused message is never delivered, and the sink keeps working. A caller
// that needs order publishes a key's rows in separate calls; this is what it relies on.
func testPublishRefused(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	sink := h.Sink(t)
	prefix := newPrefix(t)
	good := idem.Message{EventID: prefix + "-before", Payload: []byte("a")}
	bad := h.Refuse(idem.Message{EventID: prefix + "-refused", Payload: []byte("b")})
	after := idem.Message{EventID: prefix + "-after", Payload: []byte("c")}

	err := call(t, "Publish(batch with a refused message)", callTimeout, func(ctx context.Context) error {
		return sink.Publish(ctx, topic, good, bad, after)
	})
	if err == nil {
		t.Fatalf("Publish of a batch whose event %s the broker refuses returned nil", bad.EventID)
	}
	if !strings.Contains(err.Error(), bad.EventID) {
		t.Errorf("Publish error %q does not name the refused event %s", err, bad.EventID)
	}
	err = call(t, "Publish(refused)", callTimeout, func(ctx context.Context) error { return sink.Publish(ctx, topic, bad) })
	if err == nil {
		t.Fatalf("Publish of event %s alone, which the broker refuses, returned nil", bad.EventID)
	}

	last := idem.Message{EventID: prefix + "-last", Payload: []byte("d")}
	publish(t, sink, topic, last)
	src := openSource(t, h, topic, "refused", longLease)
	got := receiveFor(t, src, 10, 2*time.Second)
	for _, d := range got {
		if d.Message().EventID == bad.EventID {
			t.Errorf("event %s was refused by the broker (Publish failed) but delivered", bad.EventID)
		}
		ack(t, d)
	}
	if _, ok := indexByID(t, got)[last.EventID]; !ok {
		t.Errorf("event %s, published after the refusal, was not delivered; got %v", last.EventID, eventIDs(got))
	}
}

// testKeyReuseReachesConsumer: a second message with an event id already published but other
// content (another payload, type or tenant) is delivered. Only the consumer can tell a
// redelivery from key reuse (same key, other fingerprint: a key_reuse dead letter) or from
// another tenant's event; a broker whose deduplication drops it hides key reuse for good.
func testKeyReuseReachesConsumer(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "reuse", longLease)
	sink := h.Sink(t)
	id := newPrefix(t) + "-reused"
	sent := []idem.Message{
		{EventID: id, Tenant: "t1", Type: "order.created", Payload: []byte(`{"n":1}`)},
		{EventID: id, Tenant: "t1", Type: "order.created", Payload: []byte(`{"n":2}`)},
		{EventID: id, Tenant: "t1", Type: "order.cancelled", Payload: []byte(`{"n":1}`)},
		{EventID: id, Tenant: "t2", Type: "order.created", Payload: []byte(`{"n":1}`)},
	}
	for _, m := range sent {
		publish(t, sink, topic, m)
	}
	got := receiveN(t, src, len(sent), 5*time.Second)
	got = append(got, receiveFor(t, src, 10, time.Second)...)
	type content struct{ tenant, typ, payload string }
	seen := make(map[content]int)
	for _, d := range got {
		m := d.Message()
		seen[content{m.Tenant, m.Type, string(m.Payload)}]++
		ack(t, d)
	}
	for _, m := range sent {
		if n := seen[content{m.Tenant, m.Type, string(m.Payload)}]; n != 1 {
			t.Errorf("event %s (tenant %s, type %s, payload %s) delivered %d times, want once", id, m.Tenant, m.Type, m.Payload, n)
		}
	}
}

// testReceiveMax: Receive never returns more than max, nor an empty batch without error.
func testReceiveMax(t *testing.T, h Harness) {
	const n, max = 7, 2
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "max", longLease)
	prefix := newPrefix(t)
	msgs := make([]idem.Message, n)
	ids := make([]string, n)
	for i := range msgs {
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
		msgs[i] = idem.Message{EventID: ids[i], Payload: []byte("m")}
	}
	publish(t, h.Sink(t), topic, msgs...)

	var got []idem.Delivery
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		ds, err := receive(t, src, max, time.Until(deadline))
		if err != nil {
			t.Fatalf("Receive after %d of %d: %v", len(got), n, err)
		}
		if len(ds) == 0 || len(ds) > max {
			t.Fatalf("Receive(max=%d) returned %d deliveries and no error", max, len(ds))
		}
		for _, d := range ds {
			ack(t, d)
		}
		got = append(got, ds...)
	}
	requireIDs(t, got, ids...)
}

// testReceiveContext: Receive on an empty topic returns ctx.Err() promptly when its context's
// deadline passes, when it is cancelled, when it was cancelled before the call, and fails rather
// than blocks after Close.
func testReceiveContext(t *testing.T, h Harness) {
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "ctx", longLease)

	cases := []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		want   error
		within time.Duration
	}{
		{
			name: "deadline",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 300*time.Millisecond)
			},
			want:   context.DeadlineExceeded,
			within: 300*time.Millisecond + time.Second,
		},
		{
			name: "cancel",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(300*time.Millisecond, cancel)
				return ctx, cancel
			},
			want:   context.Canceled,
			within: 300*time.Millisecond + time.Second,
		},
		{
			name: "already cancelled",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			want:   context.Canceled,
			within: time.Second,
		},
	}
	for _, tc := range cases {
		ctx, cancel := tc.ctx()
		start := time.Now()
		ds, err := receiveCtx(t, src, ctx, 10)
		elapsed := time.Since(start)
		cancel()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: Receive = %d deliveries, error %v; want %v", tc.name, len(ds), err, tc.want)
		}
		if elapsed > tc.within {
			t.Errorf("%s: Receive returned after %v, want within %v", tc.name, elapsed, tc.within)
		}
	}

	closed := openSource(t, h, topic, "closed", longLease)
	if err := closed.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if ds, err := receive(t, closed, 1, 2*time.Second); err == nil {
		t.Errorf("Receive after Close returned %d deliveries and no error", len(ds))
	}
}

// testReceiveCancelledGivesBack: a Receive whose context ends at any point — before the call,
// while the broker hands messages out, while they are on the wire — leaves nothing leased to
// nobody and spends no attempt: every message it did not return is available again at once (well
// within the lease) and is still on its first attempt. A queue table whose fetch commits as the
// context ends hid every job for a whole lease and counted an attempt no handler saw.
func testReceiveCancelledGivesBack(t *testing.T, h Harness) {
	const n, max, tries = 40, 5, 300
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "cancelled", longLease)
	msgs, ids := numbered(t, n)
	publish(t, h.Sink(t), topic, msgs...)

	var got []idem.Delivery
	checkFirst := func(ds []idem.Delivery, when string) {
		ackFirstAttempts(t, ds, when, "a cancelled Receive spent an attempt no handler saw")
		got = append(got, ds...)
	}
	for i := 0; i < tries && len(got) < n; i++ {
		// Deadlines of 0 to 3 ms (and 0 means already ended) land at every point of a fetch.
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%4)*time.Millisecond+time.Duration(i%7)*100*time.Microsecond)
		ds, err := receiveCtx(t, src, ctx, max)
		cancel()
		if err != nil && len(ds) > 0 {
			t.Errorf("Receive returned %d deliveries and error %v; deliveries come with a nil error only", len(ds), err)
		}
		checkFirst(ds, "while receives were being cancelled")
	}
	// Whatever the cancelled receives did not return must be there now, not after the lease.
	// Half the lease, not slack: a store with one writer (SQLite) gives back the jobs of the
	// fetches still running in turn, which took up to 2 s under -race on a loaded machine.
	rest := receiveN(t, src, n-len(got), longLease/2)
	checkFirst(rest, "after the cancelled receives")
	requireIDs(t, got, ids...)
}

// testReceiveCancelledSteady is ReceiveCancelledGivesBack under a steady backlog: each message
// received is replaced by a new one, so messages are on their way to the source whenever one of
// many Receives with random deadlines of 0 to 3 ms gives up. A source whose read hands its result
// to a Receive that has just returned (a race between the read's send and the Receive's give-up)
// strands those messages for a whole lease; every message must instead reach a later Receive well
// within the lease, on its first attempt.
func testReceiveCancelledSteady(t *testing.T, h Harness) {
	const backlog, total, max, tries = 8, 120, 4, 400
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "cancelled", longLease)
	sink := h.Sink(t)
	prefix := newPrefix(t)
	var ids []string
	publishMore := func(k int) {
		msgs := make([]idem.Message, 0, k)
		for range min(k, total-len(ids)) {
			id := fmt.Sprintf("%s-%03d", prefix, len(ids))
			ids = append(ids, id)
			msgs = append(msgs, idem.Message{EventID: id, Payload: []byte(id)})
		}
		if len(msgs) > 0 {
			publish(t, sink, topic, msgs...)
		}
	}
	publishMore(backlog)

	var got []idem.Delivery
	take := func(ds []idem.Delivery, when string) {
		ackFirstAttempts(t, ds, when, "a cancelled Receive spent an attempt no handler saw")
		got = append(got, ds...)
	}
	for range tries {
		ctx, cancel := context.WithTimeout(context.Background(), mrand.N(3*time.Millisecond+1))
		ds, err := receiveCtx(t, src, ctx, max)
		cancel()
		if err != nil && len(ds) > 0 {
			t.Errorf("Receive returned %d deliveries and error %v; deliveries come with a nil error only", len(ds), err)
		}
		take(ds, "while receives were being cancelled")
		publishMore(len(ds))
	}
	t.Logf("%d of %d published received while receives were being cancelled", len(got), len(ids))
	// Whatever the cancelled receives left must come to a normal Receive well within the lease.
	rest := receiveN(t, src, len(ids)-len(got), longLease/2)
	take(rest, "after the cancelled receives")
	requireIDs(t, got, ids...)
}

// testConcurrentReceiveAck: several goroutines receiving and acking from one source get every
// message exactly once (run with -race to check the source's synchronisation).
func testConcurrentReceiveAck(t *testing.T, h Harness) {
	const n, workers, max = 60, 4, 5
	topic := h.NewTopic(t)
	src := openSource(t, h, topic, "concurrent", longLease)
	msgs, ids := numbered(t, n)
	publish(t, h.Sink(t), topic, msgs...)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		mu   sync.Mutex
		got  []idem.Delivery
		errs []error
		wg   sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				ds, err := src.Receive(ctx, max)
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("Receive: %w", err))
						mu.Unlock()
					}
					return
				}
				for _, d := range ds {
					actx, acancel := context.WithTimeout(context.Background(), callTimeout)
					if err := d.Ack(actx); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Errorf("Ack event %s: %w", d.Message().EventID, err))
						mu.Unlock()
					}
					acancel()
				}
				mu.Lock()
				got = append(got, ds...)
				if len(got) >= n {
					cancel()
				}
				mu.Unlock()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10*time.Second + grace):
		t.Fatal("receivers did not return after their context ended")
	}
	for _, err := range errs {
		t.Error(err)
	}
	requireIDs(t, got, ids...)
	for _, d := range got {
		if a := d.Message().Attempt; a != 1 {
			t.Errorf("event %s: Attempt = %d, want 1 (no delivery was left unacked)", d.Message().EventID, a)
		}
	}
}

// Benchmark measures one transport's throughput: b.N messages are published in batches of 100
// and then received and acked in batches of up to 100. It reports msgs/s and allocations.
func Benchmark(b *testing.B, h Harness) {
	const batch = 100
	topic := h.NewTopic(b)
	sink := h.Sink(b)
	src := openSource(b, h, topic, "bench", 30*time.Second)
	prefix := newPrefix(b)
	payload := bytes.Repeat([]byte("x"), 256)
	msgs := make([]idem.Message, 0, batch)

	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i += batch {
		msgs = msgs[:0]
		for j := i; j < min(i+batch, b.N); j++ {
			msgs = append(msgs, idem.Message{EventID: fmt.Sprintf("%s-%d", prefix, j), Type: "bench", Payload: payload})
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := sink.Publish(ctx, topic, msgs...)
		cancel()
		if err != nil {
			b.Fatalf("Publish: %v", err)
		}
	}
	for received := 0; received < b.N; {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		ds, err := src.Receive(ctx, min(batch, b.N-received))
		if err != nil {
			cancel()
			b.Fatalf("Receive after %d of %d: %v", received, b.N, err)
		}
		for _, d := range ds {
			if err := d.Ack(ctx); err != nil {
				cancel()
				b.Fatalf("Ack: %v", err)
			}
		}
		cancel()
		received += len(ds)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// openSource opens a source through the harness and closes it when the test ends.
func openSource(tb testing.TB, h Harness, topic, name string, lease time.Duration) idem.Source {
	tb.Helper()
	src := h.Source(tb, topic, name, lease)
	if src == nil {
		tb.Fatalf("Harness.Source(%s, %s) returned nil", topic, name)
	}
	tb.Cleanup(func() { _ = src.Close() })
	return src
}

// numbered returns n messages under a fresh prefix, each carrying its event id as payload, and
// their event ids.
func numbered(tb testing.TB, n int) ([]idem.Message, []string) {
	tb.Helper()
	prefix := newPrefix(tb)
	msgs := make([]idem.Message, n)
	ids := make([]string, n)
	for i := range msgs {
		ids[i] = fmt.Sprintf("%s-%02d", prefix, i)
		msgs[i] = idem.Message{EventID: ids[i], Payload: []byte(ids[i])}
	}
	return msgs, ids
}

// newPrefix returns a random event-id prefix, so ids never collide across checks or runs.
func newPrefix(tb testing.TB) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("random prefix: %v", err)
	}
	return "evt-" + hex.EncodeToString(b[:])
}

// call runs fn with a context bounded by d and fails the test if fn overruns it by more than
// grace, so that a hanging transport fails one check instead of the whole binary.
func call(tb testing.TB, what string, d time.Duration, fn func(ctx context.Context) error) error {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return callCtx(tb, what, ctx, d, fn)
}

// callCtx is call with the caller's context; limit is how long the context can last at most.
func callCtx(tb testing.TB, what string, ctx context.Context, limit time.Duration, fn func(ctx context.Context) error) error {
	tb.Helper()
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit + grace):
		tb.Fatalf("%s did not return within %v of its context's end", what, grace)
		return nil
	}
}

// publish publishes msgs to topic and fails the test on error.
func publish(tb testing.TB, sink idem.Sink, topic string, msgs ...idem.Message) {
	tb.Helper()
	err := call(tb, "Publish", callTimeout, func(ctx context.Context) error { return sink.Publish(ctx, topic, msgs...) })
	if err != nil {
		tb.Fatalf("Publish %d messages to %s: %v", len(msgs), topic, err)
	}
}

// receive calls Receive once with a context of d.
func receive(tb testing.TB, src idem.Source, max int, d time.Duration) ([]idem.Delivery, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return receiveCtx(tb, src, ctx, max)
}

// receiveCtx calls Receive once with ctx (which must end within a few seconds) and checks that it
// returns at most max deliveries.
func receiveCtx(tb testing.TB, src idem.Source, ctx context.Context, max int) ([]idem.Delivery, error) {
	tb.Helper()
	limit := callTimeout
	if dl, ok := ctx.Deadline(); ok {
		limit = time.Until(dl)
	}
	var ds []idem.Delivery
	err := callCtx(tb, "Receive", ctx, limit, func(ctx context.Context) error {
		var err error
		ds, err = src.Receive(ctx, max)
		return err
	})
	if len(ds) > max {
		tb.Errorf("Receive(max=%d) returned %d deliveries", max, len(ds))
	}
	if err == nil && len(ds) == 0 {
		tb.Errorf("Receive returned no deliveries and no error; it must wait for one or return ctx.Err()")
	}
	return ds, err
}

// receiveN receives until it has n deliveries or d passes; it fails the test on any error other
// than the deadline, and returns what it got (the caller checks which).
func receiveN(tb testing.TB, src idem.Source, n int, d time.Duration) []idem.Delivery {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var got []idem.Delivery
	for len(got) < n {
		ds, err := receiveCtx(tb, src, ctx, n-len(got))
		got = append(got, ds...)
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				tb.Fatalf("Receive after %d of %d: %v", len(got), n, err)
			}
			break
		}
	}
	return got
}

// receiveFor receives everything that arrives within d.
func receiveFor(tb testing.TB, src idem.Source, max int, d time.Duration) []idem.Delivery {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var got []idem.Delivery
	for {
		ds, err := receiveCtx(tb, src, ctx, max)
		got = append(got, ds...)
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				tb.Fatalf("Receive after %d: %v", len(got), err)
			}
			return got
		}
	}
}

// expectNone fails the test if anything is delivered within d.
func expectNone(tb testing.TB, src idem.Source, d time.Duration) {
	tb.Helper()
	if got := receiveFor(tb, src, 10, d); len(got) > 0 {
		tb.Errorf("received %v within %v; want nothing", eventIDs(got), d)
	}
}

// requireIDs fails the test unless ds holds each of ids exactly once and nothing else.
func requireIDs(tb testing.TB, ds []idem.Delivery, ids ...string) {
	tb.Helper()
	got := eventIDs(ds)
	slices.Sort(got)
	want := slices.Clone(ids)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		tb.Fatalf("received events %v, want each of %v exactly once", got, want)
	}
}

// indexByID maps deliveries by event id, failing on a duplicate.
func indexByID(tb testing.TB, ds []idem.Delivery) map[string]idem.Delivery {
	tb.Helper()
	m := make(map[string]idem.Delivery, len(ds))
	for _, d := range ds {
		id := d.Message().EventID
		if _, dup := m[id]; dup {
			tb.Errorf("event %s delivered twice in one pass", id)
		}
		m[id] = d
	}
	return m
}

// eventIDs lists the event ids of ds in order.
func eventIDs(ds []idem.Delivery) []string {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.Message().EventID
	}
	return ids
}

// ackFirstAttempts acks each of ds, failing the test (with why) for any not on its first
// attempt; when says where in the check they were received.
func ackFirstAttempts(tb testing.TB, ds []idem.Delivery, when, why string) {
	tb.Helper()
	for _, d := range ds {
		if a := d.Message().Attempt; a != 1 {
			tb.Errorf("event %s: Attempt = %d %s, want 1: %s", d.Message().EventID, a, when, why)
		}
		ack(tb, d)
	}
}

// ack acks d and fails the test on error.
func ack(tb testing.TB, d idem.Delivery) {
	tb.Helper()
	settle(tb, "Ack", d.Message().EventID, d.Ack)
}

// settle runs one settle call (Ack, Nak, Term) bounded by callTimeout.
func settle(tb testing.TB, what, id string, fn func(ctx context.Context) error) {
	tb.Helper()
	if err := call(tb, what, callTimeout, fn); err != nil {
		tb.Fatalf("%s event %s: %v", what, id, err)
	}
}
