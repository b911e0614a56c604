package demo

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemwebhook"
)

// httpTenant is the tenant of the demo's signing key: the ingress takes the tenant from the key
// that verified, never from the request.
const httpTenant = "demo"

// httpBroker is the --http transport: no broker at all. The relay's sink signs each event
// (idemauth) and POSTs it with idemhttp to a webhook ingress (idemwebhook) on a loopback port,
// which runs it through the consumer's path and answers after the commit. The sink behaves
// like a webhook provider: it retries what the ingress answers 503 (or never answers), honouring
// Retry-After, and stops on a 4xx, which the ingress sends only after dead-lettering the event.
// For orders planned to crash, the first 200 is lost on the way back (the connection is cut
// after the commit), so the relay sends the event again and the ingress answers it as a
// duplicate.
type httpBroker struct {
	plan     []payments.Order
	verifier idemwebhook.Verifier
	srv      *http.Server
	url      string
	lost     []atomic.Bool
	crashes  atomic.Int64
	log      *slog.Logger
	// ingress is the idemwebhook.Handler, set by attach once the consumer exists.
	ingress atomic.Pointer[http.Handler]
}

// newHTTPBroker listens on a loopback port and returns the broker whose sink POSTs there; the
// ingress is attached once the consumer is built.
func newHTTPBroker(runID string, plan []payments.Order, log *slog.Logger) (*broker, *httpBroker, error) {
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	key := idemauth.Key{ID: "demo-" + runID, Tenant: httpTenant, Secret: secret}
	ring, err := idemauth.NewKeyring(key)
	if err != nil {
		return nil, nil, err
	}
	// The relay may send an event again after its retry budget's delays: a signature stays
	// valid for a quarter of an hour from its signing, and each send signs afresh anyway.
	av, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{Tolerance: 15 * time.Minute})
	if err != nil {
		return nil, nil, err
	}
	iv, err := idemwebhook.NewIdem(av)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, fmt.Errorf("listen for the webhook ingress: %w", err)
	}
	hb := &httpBroker{plan: plan, verifier: orderHeaderVerifier{iv}, lost: make([]atomic.Bool, len(plan)), log: log}
	hb.url = "http://" + ln.Addr().String() + "/hooks/payments"
	hb.srv = &http.Server{Handler: hb, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	go func() { _ = hb.srv.Serve(ln) }()

	post, err := idemhttp.NewSink(idemhttp.SinkConfig{URL: func(string) (string, error) { return hb.url, nil }})
	if err != nil {
		_ = hb.srv.Close()
		return nil, nil, err
	}
	sink := &providerSink{post: post, key: key, log: log}
	b := &broker{
		topic:  "webhook.payments." + runID,
		source: idleSource{},
		sink:   sink,
		again: func(ctx context.Context, topic string, msgs []idem.Message) (int, int, error) {
			if err := sink.Publish(ctx, topic, msgs...); err != nil {
				return 0, 0, err
			}
			return len(msgs), 0, nil
		},
		backlog: func(context.Context) (int, error) { return 0, nil }, // nothing is held between POSTs
		close: func() {
			ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			_ = hb.srv.Shutdown(ctx)
			_ = post.Close()
		},
	}
	return b, hb, nil
}

// attach installs the ingress.
func (hb *httpBroker) attach(h http.Handler) { hb.ingress.Store(&h) }

// ServeHTTP hands the request to the ingress, cutting the connection after the commit for the
// first 200 of an order planned to crash.
func (hb *httpBroker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := hb.ingress.Load()
	if h == nil {
		http.Error(w, "the ingress is not attached yet", http.StatusServiceUnavailable)
		return
	}
	if o := orderOf(map[string]string{headerOrder: r.Header.Get(headerOrder)}, len(hb.plan)); o >= 0 && hb.plan[o].Crash && !hb.lost[o].Load() {
		w = &losingResponse{ResponseWriter: w, hb: hb, order: o}
	}
	(*h).ServeHTTP(w, r)
}

// losingResponse cuts the connection instead of sending a 200: the effect is committed, the
// provider never hears of it, and sends the event again.
type losingResponse struct {
	http.ResponseWriter
	hb    *httpBroker
	order int
}

func (l *losingResponse) WriteHeader(status int) {
	if status == http.StatusOK && l.hb.lost[l.order].CompareAndSwap(false, true) {
		l.hb.crashes.Add(1)
		panic(http.ErrAbortHandler) // net/http closes the connection without an answer
	}
	l.ResponseWriter.WriteHeader(status)
}

// orderHeaderVerifier is idem's verifier, keeping the demo's order header with each message
// (as it is kept with a broker's), so that the plan's misbehaviour finds its order.
type orderHeaderVerifier struct{ *idemwebhook.Idem }

func (v orderHeaderVerifier) Provider() idemwebhook.Provider {
	p := v.Idem.Provider()
	p.Headers = append(append([]string(nil), p.Headers...), headerOrder)
	return p
}

// providerSink signs each message and POSTs it; a refusal for good (4xx: the ingress
// dead-lettered the event before answering) settles the event at the sender, as a webhook
// provider stops on its stop status, so the relay does not dead-letter it a second time.
// Everything else is returned for the relay to retry.
type providerSink struct {
	post *idemhttp.Sink
	key  idemauth.Key
	log  *slog.Logger
}

func (s *providerSink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	for _, m := range msgs {
		m = m.Clone()
		if err := idemauth.SignMessage(s.key, &m, time.Now()); err != nil {
			return idem.Permanent(fmt.Errorf("sign event %s: %w", m.EventID, err))
		}
		err := s.post.Publish(ctx, topic, m)
		if err != nil && idem.Classify(err) == idem.ClassPermanent {
			s.log.LogAttrs(ctx, slog.LevelDebug, "demo: the ingress refused an event for good (dead-lettered there)",
				slog.String("event_id", m.EventID), slog.String("error", err.Error()))
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *providerSink) Close() error { return nil }

// idleSource is the consumer's source under --http: deliveries arrive through the ingress, so
// it never has any.
type idleSource struct{}

func (idleSource) Receive(ctx context.Context, _ int) ([]idem.Delivery, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (idleSource) Lease() time.Duration { return lease }
func (idleSource) Name() string         { return "webhook" }
func (idleSource) Close() error         { return nil }

// countAttempts numbers the handler calls of each planned order, for flaky: over HTTP every
// push is attempt 1 (a push carries no delivery count), so the plan's "fail the first n
// attempts" counts the calls instead.
func countAttempts[TTx any](plan []payments.Order, h idem.Handler[TTx]) idem.Handler[TTx] {
	calls := make([]atomic.Int32, len(plan))
	return func(ctx context.Context, tx TTx, msg idem.Message) error {
		if i := orderOf(msg.Headers, len(plan)); i >= 0 {
			msg.Attempt = int(calls[i].Add(1))
		}
		return h(ctx, tx, msg)
	}
}

var errHTTPWithBroker = errors.New("--http replaces the broker: leave --broker at sql")
