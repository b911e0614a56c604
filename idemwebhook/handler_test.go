package idemwebhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/retry"
)

// TestMain fails a passing run that leaked goroutines (a handler left waiting).
func TestMain(m *testing.M) { testenv.Main(m) }

// effectHandler applies or fails as the payload's "do" says: the cases of the handler tests.
func effectHandler(_ context.Context, tx *fakeTx, msg idem.Message) error {
	var p struct{ Do string }
	_ = json.Unmarshal(msg.Payload, &p)
	switch p.Do {
	case "transient":
		return errors.New("ledger: connection reset by the database")
	case "hint":
		return idem.RetryAfter(errors.New("ledger: rate limited"), 42*time.Second)
	case "longhint":
		return idem.RetryAfter(errors.New("ledger: down for maintenance"), 2*time.Hour)
	case "permanent":
		return idem.Permanent(errors.New(`ledger: constraint "amount_positive" failed, password=hunter2`))
	case "invalid":
		return fmt.Errorf("%w: amount missing", idem.ErrInvalidPayload)
	case "panic":
		panic("ledger: nil map")
	}
	tx.apply(msg.Tenant + "/" + msg.EventID)
	return nil
}

type testBundle struct {
	store *fakeStore
	h     *Handler
	logs  *bytes.Buffer
}

func setup(t *testing.T, v Verifier, mutate func(*idem.ConsumerConfig[*fakeTx], *Config)) testBundle {
	t.Helper()
	store := newFakeStore()
	logs := new(bytes.Buffer)
	cc := idem.ConsumerConfig[*fakeTx]{Name: "ledger@v1", Handler: effectHandler, Observe: idem.ObserveConfig{Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}}
	cfg := Config{Verifier: v, DeadLetters: store}
	if mutate != nil {
		mutate(&cc, &cfg)
	}
	c, err := idem.NewConsumer[*fakeTx](store, cc)
	require.NoError(t, err)
	h, err := New(c, cfg)
	require.NoError(t, err)
	return testBundle{store: store, h: h, logs: logs}
}

func githubVerifier(t *testing.T) *GitHub {
	t.Helper()
	v, err := NewGitHub(GitHubConfig{Secrets: []Secret{{Tenant: "acme", Key: keyAcme}}})
	require.NoError(t, err)
	return v
}

// ghRequest is a GitHub delivery of body with delivery id, signed with key.
func ghRequest(body, id string, key []byte) *http.Request {
	return post(body, map[string]string{HeaderGitHubSignature: SignGitHub(key, []byte(body)), HeaderGitHubDelivery: id,
		HeaderGitHubEvent: "payment", "Content-Type": "application/json", "Cookie": "session=secret"})
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func decodeProblem(t *testing.T, w *httptest.ResponseRecorder) Problem {
	t.Helper()
	require.Equal(t, ContentTypeProblem, w.Header().Get("Content-Type"))
	var p Problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), w.Body.String())
	require.Equal(t, w.Code, p.Status)
	require.Equal(t, "about:blank", p.Type)
	title := http.StatusText(w.Code)
	if title == "" {
		title = "Status " + strconv.Itoa(w.Code)
	}
	require.Equal(t, title, p.Title)
	return p
}

func TestHandlerOutcomes(t *testing.T) {
	cases := []struct {
		name       string
		req        func() *http.Request
		status     int
		effects    int
		claims     int
		dlReason   idem.Reason
		reason     string // the problem's reason when nothing was dead-lettered (default "retry")
		retryAfter string // "" means: absent; "*" means: present, >= 1
	}{
		{name: "processed", req: func() *http.Request { return ghRequest(`{"do":"ok"}`, "d-1", keyAcme) }, status: 200, effects: 1, claims: 1},
		{name: "transient: 503, Retry-After, no claim", req: func() *http.Request { return ghRequest(`{"do":"transient"}`, "d-1", keyAcme) }, status: 503, retryAfter: "*"},
		{name: "hint honoured", req: func() *http.Request { return ghRequest(`{"do":"hint"}`, "d-1", keyAcme) }, status: 503, retryAfter: "42"},
		{name: "hint beyond the budget", req: func() *http.Request { return ghRequest(`{"do":"longhint"}`, "d-1", keyAcme) }, status: 400, dlReason: idem.ReasonRetriesExhausted},
		{name: "permanent", req: func() *http.Request { return ghRequest(`{"do":"permanent"}`, "d-1", keyAcme) }, status: 400, dlReason: idem.ReasonPermanentError},
		{name: "invalid payload", req: func() *http.Request { return ghRequest(`{"do":"invalid"}`, "d-1", keyAcme) }, status: 400, dlReason: idem.ReasonInvalidPayload},
		{name: "handler panic", req: func() *http.Request { return ghRequest(`{"do":"panic"}`, "d-1", keyAcme) }, status: 400, dlReason: idem.ReasonHandlerPanic},
		{name: "bad signature", req: func() *http.Request { return ghRequest(`{"do":"ok"}`, "d-1", keyOther) }, status: 401, reason: "unauthenticated"},
		{name: "no delivery id", req: func() *http.Request { return ghRequest(`{"do":"ok"}`, "", keyAcme) }, status: 400, dlReason: idem.ReasonInvalidPayload},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, githubVerifier(t), nil)
			w := serve(b.h, tc.req())
			require.Equal(t, tc.status, w.Code, w.Body.String())
			effects, claims, dls := b.store.snapshot()
			require.Len(t, effects, tc.effects)
			require.Equal(t, tc.claims, claims)
			switch tc.retryAfter {
			case "":
				require.Empty(t, w.Header().Get("Retry-After"))
			case "*":
				n, err := strconv.Atoi(w.Header().Get("Retry-After"))
				require.NoError(t, err)
				require.GreaterOrEqual(t, n, 1)
			default:
				require.Equal(t, tc.retryAfter, w.Header().Get("Retry-After"))
			}
			if tc.status == 200 {
				require.Empty(t, dls)
				var a Answer
				require.NoError(t, json.Unmarshal(w.Body.Bytes(), &a))
				require.Equal(t, Answer{EventID: "d-1", Outcome: "processed"}, a)
				return
			}
			p := decodeProblem(t, w)
			require.Equal(t, "github", p.Provider)
			require.NotContains(t, w.Body.String(), "hunter2", "no handler error text in the answer")
			require.NotContains(t, w.Body.String(), "amount_positive")
			if tc.dlReason == "" {
				require.Empty(t, dls, "a retried or unauthenticated delivery is not dead-lettered")
				want := cmp.Or(tc.reason, "retry")
				require.Equal(t, want, p.Reason)
				return
			}
			require.Len(t, dls, 1)
			dl := dls[0]
			require.Equal(t, tc.dlReason, dl.Reason)
			require.Equal(t, string(tc.dlReason), p.Reason)
			require.Equal(t, "ledger@v1", dl.Consumer)
			require.Equal(t, "webhook:github", dl.Source)
			require.Equal(t, "github", dl.Message.Header(HeaderProvider))
			require.Empty(t, dl.Message.Header("Cookie"), "only the provider's headers are kept")
			require.NotContains(t, dl.Error, "hunter2", "the dead letter's error is redacted")
			require.False(t, dl.Fingerprint.IsZero())
			if tc.dlReason == idem.ReasonUnauthenticated {
				require.Equal(t, "signature verification failed: "+ErrBadSignature.Error(), p.Detail, "the reason, not how many secrets there are")
				require.Contains(t, dl.Error, "webhook secrets", "the dead letter keeps the verifier's detail")
				require.Empty(t, dl.Message.Tenant, "unauthenticated input has no tenant")
				require.Contains(t, w.Header().Get("WWW-Authenticate"), `realm="github"`)
			} else {
				require.Equal(t, "acme", dl.Message.Tenant)
			}
		})
	}
}

func TestHandlerDuplicateAndKeyReuse(t *testing.T) {
	b := setup(t, githubVerifier(t), nil)
	require.Equal(t, 200, serve(b.h, ghRequest(`{"do":"ok","n":1}`, "d-1", keyAcme)).Code)

	w := serve(b.h, ghRequest(`{"do":"ok","n":1}`, "d-1", keyAcme))
	require.Equal(t, 200, w.Code)
	var a Answer
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &a))
	require.Equal(t, Answer{EventID: "d-1", Outcome: "duplicate"}, a)

	w = serve(b.h, ghRequest(`{"do":"ok","n":2}`, "d-1", keyAcme))
	require.Equal(t, 400, w.Code)
	require.Equal(t, string(idem.ReasonKeyReuse), decodeProblem(t, w).Reason)
	effects, claims, dls := b.store.snapshot()
	require.Equal(t, []string{"acme/d-1"}, effects, "applied once")
	require.Equal(t, 1, claims)
	require.Len(t, dls, 1)
	require.Equal(t, idem.ReasonKeyReuse, dls[0].Reason)
}

func TestHandlerUnauthenticatedBoundsClaims(t *testing.T) {
	b := setup(t, githubVerifier(t), nil)
	hostile := strings.Repeat("é", 100) + "\x00\n\u2028" + strings.Repeat("x", 500)
	r := ghRequest(`{"tenant":"globex"}`, "d-1", keyOther)
	r.Header.Set(HeaderGitHubDelivery, hostile)
	w := serve(b.h, r)
	require.Equal(t, 401, w.Code)
	_, claims, dls := b.store.snapshot()
	require.Zero(t, claims)
	require.Empty(t, dls, "unauthenticated input is not stored")
	id := decodeProblem(t, w).EventID
	require.LessOrEqual(t, len(id), 128)
	require.NotContains(t, id, "\x00")
	require.NotContains(t, id, "\u2028")
	require.NotContains(t, b.logs.String(), "\u2028", "nor logged unbounded")
	require.NoError(t, checkEventID(id, "the bounded claim"))
}

func TestHandlerBodyLimit(t *testing.T) {
	b := setup(t, githubVerifier(t), func(_ *idem.ConsumerConfig[*fakeTx], c *Config) { c.MaxBodyBytes = 64 })
	body := `{"do":"ok","pad":"` + strings.Repeat("x", 100) + `"}`
	for _, chunked := range []bool{false, true} {
		r := ghRequest(body, "d-big", keyAcme)
		if chunked {
			r.ContentLength = -1 // no length announced: the reader stops at the limit
		}
		w := serve(b.h, r)
		require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
		require.Equal(t, string(idem.ReasonInvalidPayload), decodeProblem(t, w).Reason)
	}
	effects, claims, dls := b.store.snapshot()
	require.Empty(t, effects)
	require.Zero(t, claims)
	require.Empty(t, dls, "an unverified request is not stored: anyone can send one")
	require.Contains(t, b.logs.String(), "exceeds 64 bytes")
	require.Contains(t, b.logs.String(), "d-big", "the claimed id, from the headers")
}

func TestHandlerMethod(t *testing.T) {
	b := setup(t, githubVerifier(t), nil)
	w := serve(b.h, httptest.NewRequest(http.MethodGet, "/hook", nil))
	require.Equal(t, http.StatusMethodNotAllowed, w.Code)
	require.Equal(t, http.MethodPost, w.Header().Get("Allow"))
	decodeProblem(t, w)
	_, _, dls := b.store.snapshot()
	require.Empty(t, dls, "not a delivery")
}

func TestHandlerDeadLetterWriteFails(t *testing.T) {
	b := setup(t, githubVerifier(t), nil)
	b.store.dlErr = errors.New("disk full")
	w := serve(b.h, ghRequest(`{"do":"permanent"}`, "d-1", keyAcme))
	require.Equal(t, http.StatusServiceUnavailable, w.Code, "the provider keeps what could not be recorded")
	require.NotEmpty(t, w.Header().Get("Retry-After"))
	require.Empty(t, w.Header().Get("WWW-Authenticate"))
	decodeProblem(t, w)
	// An unauthenticated delivery writes nothing, so a store that is down changes nothing for it.
	w = serve(b.h, ghRequest(`{"do":"ok"}`, "d-1", keyOther))
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Contains(t, b.logs.String(), "dead letter not written")
	require.Contains(t, b.logs.String(), "disk full")
}

func TestHandlerRequestEnded(t *testing.T) {
	obs := &recordingObserver{}
	b := setup(t, githubVerifier(t), func(cc *idem.ConsumerConfig[*fakeTx], _ *Config) {
		cc.Failure.UnknownIsPermanent = true // a cancellation must not pass for a permanent failure
		cc.Observe.Observer = obs
		cc.Handler = func(ctx context.Context, tx *fakeTx, msg idem.Message) error {
			<-ctx.Done()
			return ctx.Err()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	r := ghRequest(`{"do":"ok"}`, "d-1", keyAcme).WithContext(ctx)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serve(b.h, r) }()
	cancel()
	w := <-done
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	effects, claims, dls := b.store.snapshot()
	require.Empty(t, effects)
	require.Zero(t, claims)
	require.Empty(t, dls, "no verdict on an event whose request ended")
	require.Len(t, obs.events, 1)
	require.Equal(t, idem.OutcomeAbandoned, obs.events[0].Outcome)
}

func TestHandlerPanicPause(t *testing.T) {
	b := setup(t, githubVerifier(t), func(cc *idem.ConsumerConfig[*fakeTx], _ *Config) { cc.Failure.OnPanic = idem.PanicPause })
	w := serve(b.h, ghRequest(`{"do":"panic"}`, "d-1", keyAcme))
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	_, claims, dls := b.store.snapshot()
	require.Zero(t, claims)
	require.Empty(t, dls, "a paused consumer leaves the event with the provider")
}

func TestHandlerAttemptBudget(t *testing.T) {
	v, err := NewQStash(QStashConfig{Secrets: []Secret{{Tenant: "acme", Key: keyAcme}}, URL: qstashURL})
	require.NoError(t, err)
	b := setup(t, v, func(cc *idem.ConsumerConfig[*fakeTx], _ *Config) { cc.Failure.Retry = retry.Policy{MaxAttempts: 3} })
	send := func(retried int) *httptest.ResponseRecorder {
		body := `{"do":"transient"}`
		return serve(b.h, post(body, map[string]string{HeaderQStashSignature: SignQStash(keyAcme, qstashClaims(body, time.Now())),
			HeaderQStashMessageID: "msg_1", HeaderQStashRetried: strconv.Itoa(retried)}))
	}
	require.Equal(t, 503, send(1).Code, "second attempt of three")
	w := send(2)
	require.Equal(t, QStashStopStatus, w.Code, "the third attempt spends the budget")
	require.Equal(t, "true", w.Header().Get(HeaderQStashNonRetryable))
	require.Equal(t, string(idem.ReasonRetriesExhausted), decodeProblem(t, w).Reason)
	_, _, dls := b.store.snapshot()
	require.Len(t, dls, 1)
	require.Equal(t, 3, dls[0].Attempts)
}

// recordingObserver keeps the events the ingress reports.
type recordingObserver struct{ events []idem.Observation }

func (o *recordingObserver) Observe(e idem.Observation) { o.events = append(o.events, e) }
func (o *recordingObserver) Paused(string)              {}

func TestHandlerObserves(t *testing.T) {
	obs := &recordingObserver{}
	b := setup(t, githubVerifier(t), func(cc *idem.ConsumerConfig[*fakeTx], _ *Config) { cc.Observe.Observer = obs })
	serve(b.h, ghRequest(`{"do":"ok"}`, "d-1", keyAcme))
	serve(b.h, ghRequest(`{"do":"ok"}`, "d-1", keyAcme))
	serve(b.h, ghRequest(`{"do":"transient"}`, "d-2", keyAcme))
	serve(b.h, ghRequest(`{"do":"ok"}`, "d-3", keyOther))
	var got []string
	for _, e := range obs.events {
		require.Equal(t, "webhook:github", e.Queue)
		got = append(got, fmt.Sprintf("%s %s %s", e.EventID, e.Outcome, e.Reason))
	}
	require.Equal(t, []string{"d-1 processed ", "d-1 duplicate ", "d-2 retried ", "d-3 failed unauthenticated"}, got)
}

func TestNewConfigErrors(t *testing.T) {
	store := newFakeStore()
	c, err := idem.NewConsumer[*fakeTx](store, idem.ConsumerConfig[*fakeTx]{Name: "ledger@v1", Handler: effectHandler, Input: idem.InputConfig{MaxPayloadBytes: 1000}})
	require.NoError(t, err)
	gh := githubVerifier(t)
	cases := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"empty", Config{}, []string{"idemwebhook: config", "Verifier is nil", "DeadLetters is nil"}},
		{"body over the consumer's limit", Config{Verifier: gh, DeadLetters: store, MaxBodyBytes: 2000}, []string{"MaxBodyBytes (2000) exceeds the consumer's MaxPayloadBytes (1000)"}},
		{"negative", Config{Verifier: gh, DeadLetters: store, MaxBodyBytes: -1, DeadLetterTimeout: -time.Second}, []string{"MaxBodyBytes is -1", "DeadLetterTimeout is -1s"}},
		{"default body over the consumer's limit", Config{Verifier: gh, DeadLetters: store}, []string{"MaxBodyBytes (1048576)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(c, tc.cfg)
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
	_, err = New[*fakeTx](nil, Config{})
	require.ErrorContains(t, err, "consumer is nil")

	got := Config{Verifier: gh}.WithDefaults()
	require.Equal(t, Config{Verifier: gh, MaxBodyBytes: MaxBodyBytesDefault, Source: "webhook:github", DeadLetterTimeout: DeadLetterTimeoutDefault}, got)
}

// TestRawFingerprintMatchesIdem holds rawFingerprint to the core's raw fingerprint, which
// idem.ComputeFingerprint uses for a payload that is not JSON when the consumer declares Raw
// (without it such a payload is invalid_payload): the Replayer recognises a dead letter as
// unedited only if the two agree.
func TestRawFingerprintMatchesIdem(t *testing.T) {
	for _, m := range []idem.Message{
		{Type: "push", Payload: []byte("not json")},
		{Payload: []byte("payload=%7B%7D")},
		{Type: "x"},
	} {
		want, err := idem.ComputeFingerprint(m, idem.FingerprintConfig{Raw: true})
		require.NoError(t, err)
		require.Equal(t, want, rawFingerprint(m))
	}
}
