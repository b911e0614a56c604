package relaytest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
)

// hookRequest is one request the test destination received.
type hookRequest struct {
	at       time.Time
	key      string
	verified error
}

// destination is an HTTP service that applies an effect once per Idempotency-Key, the way the
// relay's HTTP destinations must. respond decides the status of the n-th request (1-based),
// after the effect was applied.
type destination struct {
	secret  []byte
	respond func(n int, w http.ResponseWriter) int

	mu       sync.Mutex
	requests []hookRequest
	applied  map[string]bool
	effects  int
}

func newDestination(tb testing.TB, secret []byte, respond func(n int, w http.ResponseWriter) int) (*destination, *httptest.Server) {
	d := &destination{secret: secret, respond: respond, applied: map[string]bool{}}
	srv := httptest.NewServer(d)
	tb.Cleanup(srv.Close)
	return d, srv
}

func (d *destination) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	verr := idemhttp.Verify(d.secret, r, body, time.Now(), time.Minute)
	key := r.Header.Get(idemhttp.HeaderIdempotencyKey)
	d.mu.Lock()
	d.requests = append(d.requests, hookRequest{at: time.Now(), key: key, verified: verr})
	n := len(d.requests)
	if verr == nil && !d.applied[key] {
		d.applied[key] = true
		d.effects++
	}
	d.mu.Unlock()
	if verr != nil {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	status := http.StatusOK
	if d.respond != nil {
		status = d.respond(n, w)
	}
	w.WriteHeader(status)
}

func (d *destination) snapshot() ([]hookRequest, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]hookRequest(nil), d.requests...), d.effects
}

// newHTTPSink builds an idemhttp sink posting to srv.
func newHTTPSink(tb testing.TB, srv *httptest.Server, secret []byte) idem.Sink {
	tb.Helper()
	s, err := idemhttp.NewSink(idemhttp.SinkConfig{BaseURL: srv.URL + "/hooks", Secret: secret, KeyID: "k1"})
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, s.Close()) })
	return s
}

func TestHTTPSinkThroughRelay(t *testing.T) {
	t.Parallel()
	secret := []byte("shared-secret-of-at-least-32-bytes")
	for _, tc := range []struct {
		name    string
		respond func(n int, w http.ResponseWriter) int
		policy  retry.Policy
		// done says when the outbox row has reached its end state.
		wantState    outboxState
		wantRequests int
		wantDL       idem.Reason
		check        func(t *testing.T, reqs []hookRequest)
	}{
		{
			// The destination applies the effect, then fails with 503: the relay retries with the
			// same key, the destination recognises it, and the effect stays single.
			name: "503 after applying is retried under the same key",
			respond: func(n int, _ http.ResponseWriter) int {
				if n == 1 {
					return http.StatusServiceUnavailable
				}
				return http.StatusOK
			},
			policy:       fastRetry,
			wantState:    outboxState{Attempts: 1, Published: true},
			wantRequests: 2,
			check: func(t *testing.T, reqs []hookRequest) {
				require.Equal(t, "acme:pay-1", reqs[0].key)
				require.Equal(t, reqs[0].key, reqs[1].key, "the retry carries the same Idempotency-Key")
			},
		},
		{
			name: "429 with Retry-After: 2 waits about two seconds",
			respond: func(n int, w http.ResponseWriter) int {
				if n == 1 {
					w.Header().Set("Retry-After", "2")
					return http.StatusTooManyRequests
				}
				return http.StatusOK
			},
			policy:       retry.Policy{MaxAttempts: 5, MaxElapsed: time.Minute, Base: 10 * time.Millisecond, Cap: 20 * time.Millisecond},
			wantState:    outboxState{Attempts: 1, Published: true},
			wantRequests: 2,
			check: func(t *testing.T, reqs []hookRequest) {
				gap := reqs[1].at.Sub(reqs[0].at)
				require.GreaterOrEqual(t, gap, 1800*time.Millisecond, "the hint, not the 20ms backoff cap, sets the delay")
				require.Less(t, gap, 6*time.Second)
			},
		},
		{
			name:         "400 dead-letters without retry",
			respond:      func(int, http.ResponseWriter) int { return http.StatusBadRequest },
			policy:       fastRetry,
			wantState:    outboxState{Attempts: 1, Dead: true},
			wantRequests: 1,
			wantDL:       idem.ReasonPermanentError,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := newSQLite(t, storeCfg{})
			ctx := ctxT(t, 20*time.Second)
			dest, srv := newDestination(t, secret, tc.respond)
			k.enqueue(t, idem.Outgoing{EventID: "pay-1", Tenant: "acme", Topic: "payments", Key: "o1",
				Type: "payment.captured", Payload: []byte(`{"amount":5}`)})
			r := newRelay(t, k.store, k.dlq, newHTTPSink(t, srv, secret), func(c *idemrelay.Config) { c.Retry = tc.policy })
			rr := start(t, r)
			eventually(t, 10*time.Second, func() bool {
				s := k.row(ctx, "pay-1")
				return s.Published || s.Dead
			}, "pay-1 settled")
			time.Sleep(150 * time.Millisecond) // room for a retry that must not happen
			rr.stop(t)

			reqs, effects := dest.snapshot()
			require.Len(t, reqs, tc.wantRequests)
			require.Equal(t, 1, effects, "one logical effect")
			for _, q := range reqs {
				require.NoError(t, q.verified, "every request is signed with the shared secret")
			}
			st := k.row(ctx, "pay-1")
			st.LastError = ""
			require.Equal(t, tc.wantState, st)
			dls, err := k.dlq.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: idemrelay.ConsumerName})
			require.NoError(t, err)
			if tc.wantDL == "" {
				require.Empty(t, dls)
			} else {
				require.Len(t, dls, 1)
				require.Equal(t, tc.wantDL, dls[0].Reason)
				require.Contains(t, dls[0].Error, "status 400")
				require.Contains(t, dls[0].Error, "pay-1")
				require.Equal(t, "outbox:payments", dls[0].Source)
			}
			if tc.check != nil {
				tc.check(t, reqs)
			}
		})
	}
}
