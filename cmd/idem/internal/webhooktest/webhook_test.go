// Package webhooktest_test runs the webhook ingress (idemwebhook) with a real HTTP client against
// the real stores: SQLite always, PostgreSQL with IDEM_POSTGRES_URL, MySQL with IDEM_MYSQL_URL.
// It lives in the command's module so that the core module never requires a store.
package webhooktest_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemwebhook"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/storetest"
)

func pgBundle(tb testing.TB) storetest.Bundle[pgx.Tx] { _, b := testdb.Postgres(tb); return b }

func sqliteBundle(tb testing.TB) storetest.Bundle[*sql.Tx] { _, b := testdb.SQLite(tb); return b }

func mysqlBundle(tb testing.TB) storetest.Bundle[*sql.Tx] { _, b := testdb.MySQL(tb); return b }

func TestWebhookSQLite(t *testing.T) {
	t.Parallel()
	exercise(t, sqliteBundle)
}

func TestWebhookPostgres(t *testing.T) {
	t.Parallel()
	exercise(t, pgBundle)
}

func TestWebhookMySQL(t *testing.T) {
	t.Parallel()
	exercise(t, mysqlBundle)
}

// credit is the body every scheme delivers: credit amount to wallet, or fail as do says.
type credit struct {
	ID     string `json:"id,omitempty"` // Stripe-style bodies carry the event id
	Wallet string `json:"wallet"`
	Amount int64  `json:"amount"`
	Do     string `json:"do,omitempty"`
}

func (c credit) body() []byte {
	b, _ := json.Marshal(c)
	return b
}

// scheme is one provider's signature scheme as the tests drive it.
type scheme struct {
	name string
	// verifier verifies with the good keys, for tenant "acme".
	verifier func(t *testing.T, url string) idemwebhook.Verifier
	// request signs body for event id with the good key (wrong: with a key the verifier does not
	// hold) at time at, for the endpoint url.
	request func(t *testing.T, url, id string, body []byte, wrong bool, at time.Time) *http.Request
	// stale says whether the scheme signs a time; GitHub does not.
	stale bool
	// stopStatus answers a delivery refused for good.
	stopStatus int
}

var (
	goodKey  = []byte("test_secret_acme_0123456789abcdefghij")
	wrongKey = []byte("test_secret_mallory_0123456789abcdef")
)

func newRequest(t *testing.T, url string, body []byte, headers map[string]string) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	require.NoError(t, err)
	r.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	return r
}

func key(wrong bool) []byte {
	if wrong {
		return wrongKey
	}
	return goodKey
}

func schemes() []scheme {
	return []scheme{
		{
			name: "qstash", stale: true, stopStatus: idemwebhook.QStashStopStatus,
			verifier: func(t *testing.T, url string) idemwebhook.Verifier {
				v, err := idemwebhook.NewQStash(idemwebhook.QStashConfig{URL: url, Secrets: []idemwebhook.Secret{{Tenant: "acme", Key: goodKey}}})
				require.NoError(t, err)
				return v
			},
			request: func(t *testing.T, url, id string, body []byte, wrong bool, at time.Time) *http.Request {
				c := idemwebhook.QStashClaims{Issuer: idemwebhook.QStashIssuer, Subject: url, IssuedAt: at.Unix(), NotBefore: at.Unix(),
					Expires: at.Add(5 * time.Minute).Unix(), ID: "jwt_" + id, Body: idemwebhook.QStashBodyClaim(body)}
				return newRequest(t, url, body, map[string]string{idemwebhook.HeaderQStashSignature: idemwebhook.SignQStash(key(wrong), c),
					idemwebhook.HeaderQStashMessageID: id, idemwebhook.HeaderQStashRetried: "0"})
			},
		},
		{
			name: "stripe", stale: true, stopStatus: http.StatusBadRequest,
			verifier: func(t *testing.T, _ string) idemwebhook.Verifier {
				v, err := idemwebhook.NewStripe(idemwebhook.StripeConfig{Secrets: []idemwebhook.Secret{{Tenant: "acme", Key: goodKey}}})
				require.NoError(t, err)
				return v
			},
			request: func(t *testing.T, url, id string, body []byte, wrong bool, at time.Time) *http.Request {
				return newRequest(t, url, body, map[string]string{idemwebhook.HeaderStripeSignature: idemwebhook.SignStripe(key(wrong), at, body)})
			},
		},
		{
			name: "github", stale: false, stopStatus: http.StatusBadRequest,
			verifier: func(t *testing.T, _ string) idemwebhook.Verifier {
				v, err := idemwebhook.NewGitHub(idemwebhook.GitHubConfig{Secrets: []idemwebhook.Secret{{Tenant: "acme", Key: goodKey}}})
				require.NoError(t, err)
				return v
			},
			request: func(t *testing.T, url, id string, body []byte, wrong bool, _ time.Time) *http.Request {
				return newRequest(t, url, body, map[string]string{idemwebhook.HeaderGitHubSignature: idemwebhook.SignGitHub(key(wrong), body),
					idemwebhook.HeaderGitHubDelivery: id, idemwebhook.HeaderGitHubEvent: "credit"})
			},
		},
		{
			name: "idem", stale: true, stopStatus: http.StatusUnprocessableEntity,
			verifier: func(t *testing.T, _ string) idemwebhook.Verifier {
				ring, err := idemauth.NewKeyring(idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: goodKey})
				require.NoError(t, err)
				av, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{})
				require.NoError(t, err)
				v, err := idemwebhook.NewIdem(av)
				require.NoError(t, err)
				return v
			},
			request: func(t *testing.T, url, id string, body []byte, wrong bool, at time.Time) *http.Request {
				msg := idem.Message{EventID: id, Tenant: "acme", Type: "credit", Payload: body}
				sig, err := idemauth.Sign(idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: key(wrong)}, msg, at)
				require.NoError(t, err)
				return newRequest(t, url, body, map[string]string{idemauth.HeaderSignature: sig, idemhttp.HeaderEventID: id,
					idemhttp.HeaderTenant: "acme", idemhttp.HeaderType: "credit"})
			},
		},
	}
}

// env is one ingress over one fresh store, served over real HTTP.
type env[TTx any] struct {
	b   storetest.Bundle[TTx]
	url string
	srv *httptest.Server
}

// handler credits the wallet in the claim's transaction, or fails as the body says, after its
// write (so a rollback is visible).
func handler[TTx any](b storetest.Bundle[TTx]) idem.Handler[TTx] {
	return func(ctx context.Context, tx TTx, msg idem.Message) error {
		var c credit
		if err := json.Unmarshal(msg.Payload, &c); err != nil {
			return idem.Permanent(err)
		}
		n, err := b.Credit(ctx, tx, msg.EventID, c.Wallet, c.Amount)
		if err != nil {
			return err
		}
		switch c.Do {
		case "transient":
			return idem.Transient(errors.New("ledger: downstream timeout"))
		case "later":
			return idem.RetryAfter(errors.New("ledger: rate limited"), 7*time.Second)
		}
		return idem.ExpectRows(n, 1) // a missing wallet is permanent
	}
}

func newEnv[TTx any](t *testing.T, factory storetest.Factory[TTx], s scheme) *env[TTx] {
	t.Helper()
	b := factory(t)
	require.NoError(t, b.CreateWallet(context.Background(), "w1"))
	e := &env[TTx]{b: b}
	var h http.Handler
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	t.Cleanup(e.srv.Close)
	e.url = e.srv.URL + "/hooks/" + s.name
	c, err := idem.NewConsumer(b.Store, idem.ConsumerConfig[TTx]{Name: "wallet@v1", Handler: handler(b)})
	require.NoError(t, err)
	ing, err := idemwebhook.New(c, idemwebhook.Config{Verifier: s.verifier(t, e.url), DeadLetters: b.Store})
	require.NoError(t, err)
	h = ing
	return e
}

type answer struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, r *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(r)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// state is what the database holds for one event.
type state struct {
	ledger, balance, claims int64
	deadLetters             []idem.DeadLetter
}

func (e *env[TTx]) state(t *testing.T, id string) state {
	t.Helper()
	ctx := context.Background()
	var s state
	var err error
	s.ledger, err = e.b.LedgerRows(ctx, id)
	require.NoError(t, err)
	s.balance, err = e.b.Balance(ctx, "w1")
	require.NoError(t, err)
	s.claims, err = e.b.ClaimRows(ctx, idem.Key{Tenant: "acme", Consumer: "wallet@v1", EventID: id})
	require.NoError(t, err)
	s.deadLetters, err = e.b.Store.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Consumer: "wallet@v1"})
	require.NoError(t, err)
	return s
}

func exercise[TTx any](t *testing.T, factory storetest.Factory[TTx]) {
	for _, s := range schemes() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			t.Run("signatures", func(t *testing.T) { signatures(t, factory, s) })
			t.Run("outcomes", func(t *testing.T) { outcomes(t, factory, s) })
			t.Run("concurrent", func(t *testing.T) { concurrent(t, factory, s) })
		})
	}
	t.Run("idemhttp sink to ingress", func(t *testing.T) { sinkToIngress(t, factory) })
}

// signatures: valid, tampered, stale and wrong-key deliveries of every scheme.
func signatures[TTx any](t *testing.T, factory storetest.Factory[TTx], s scheme) {
	now := time.Now()
	type tc struct {
		name     string
		req      func(url, id string, c credit) *http.Request
		status   int
		applied  bool
		dlReason idem.Reason
	}
	cases := []tc{
		{name: "valid", req: func(url, id string, c credit) *http.Request { return s.request(t, url, id, c.body(), false, now) }, status: 200, applied: true},
		{name: "tampered body", req: func(url, id string, c credit) *http.Request {
			r := s.request(t, url, id, c.body(), false, now)
			c.Amount *= 100
			body := c.body()
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
			return r
		}, status: 401, dlReason: idem.ReasonUnauthenticated},
		{name: "wrong key", req: func(url, id string, c credit) *http.Request { return s.request(t, url, id, c.body(), true, now) }, status: 401, dlReason: idem.ReasonUnauthenticated},
	}
	if s.stale {
		cases = append(cases, tc{name: "stale", req: func(url, id string, c credit) *http.Request {
			return s.request(t, url, id, c.body(), false, now.Add(-20*time.Minute))
		}, status: 401, dlReason: idem.ReasonUnauthenticated})
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, factory, s)
			id := fmt.Sprintf("%s-sig-%d", s.name, i)
			a := send(t, c.req(e.url, id, credit{ID: id, Wallet: "w1", Amount: 5}))
			require.Equal(t, c.status, a.status, a.body)
			st := e.state(t, id)
			if c.applied {
				require.Equal(t, state{ledger: 1, balance: 5, claims: 1, deadLetters: []idem.DeadLetter{}}, withEmptyDL(st))
				return
			}
			require.Equal(t, "application/problem+json", a.header.Get("Content-Type"))
			require.Zero(t, st.ledger)
			require.Zero(t, st.balance)
			require.Zero(t, st.claims)
			require.Empty(t, st.deadLetters, "unauthenticated input is never stored: anyone can send it")
			var p idemwebhook.Problem
			require.NoError(t, json.Unmarshal([]byte(a.body), &p))
			require.Equal(t, string(c.dlReason), p.Reason)
			require.Equal(t, id, p.EventID, "the claimed event id, bounded")
			require.Equal(t, s.name, p.Provider)
		})
	}
	if !s.stale {
		// GitHub signs no time: a captured delivery sent again later is recognised by its
		// delivery id and applies nothing.
		t.Run("captured and resent later", func(t *testing.T) {
			e := newEnv(t, factory, s)
			c := credit{Wallet: "w1", Amount: 5}
			require.Equal(t, 200, send(t, s.request(t, e.url, "gh-old", c.body(), false, now)).status)
			a := send(t, s.request(t, e.url, "gh-old", c.body(), false, now.Add(-24*time.Hour)))
			require.Equal(t, 200, a.status)
			require.Contains(t, a.body, `"outcome":"duplicate"`)
			require.Equal(t, int64(5), e.state(t, "gh-old").balance)
		})
	}
}

func withEmptyDL(s state) state {
	if s.deadLetters == nil {
		s.deadLetters = []idem.DeadLetter{}
	}
	return s
}

// outcomes: a duplicate after success, a transient failure, a hint, and a permanent failure.
func outcomes[TTx any](t *testing.T, factory storetest.Factory[TTx], s scheme) {
	e := newEnv(t, factory, s)
	now := time.Now()
	deliver := func(id string, c credit) answer {
		c.ID = id
		return send(t, s.request(t, e.url, id, c.body(), false, now))
	}

	// Processed, then a duplicate after success: 2xx with nothing applied.
	a := deliver(s.name+"-ok", credit{Wallet: "w1", Amount: 5})
	require.Equal(t, 200, a.status, a.body)
	require.JSONEq(t, fmt.Sprintf(`{"event_id":%q,"outcome":"processed"}`, s.name+"-ok"), a.body)
	a = deliver(s.name+"-ok", credit{Wallet: "w1", Amount: 5})
	require.Equal(t, 200, a.status, a.body)
	require.JSONEq(t, fmt.Sprintf(`{"event_id":%q,"outcome":"duplicate"}`, s.name+"-ok"), a.body)
	st := e.state(t, s.name+"-ok")
	require.Equal(t, int64(1), st.ledger)
	require.Equal(t, int64(5), st.balance)

	// Transient: 503 with Retry-After, the handler's write rolled back, no claim; the retry applies it once.
	id := s.name + "-transient"
	a = deliver(id, credit{Wallet: "w1", Amount: 7, Do: "transient"})
	require.Equal(t, 503, a.status, a.body)
	n, err := strconv.Atoi(a.header.Get("Retry-After"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1)
	st = e.state(t, id)
	require.Zero(t, st.ledger)
	require.Zero(t, st.claims)
	require.Empty(t, st.deadLetters)

	// A hint from the handler becomes Retry-After.
	a = deliver(s.name+"-later", credit{Wallet: "w1", Amount: 7, Do: "later"})
	require.Equal(t, 503, a.status, a.body)
	require.Equal(t, "7", a.header.Get("Retry-After"))

	// Permanent (the wallet does not exist): dead letter under the verified tenant, the stop status.
	id = s.name + "-permanent"
	a = deliver(id, credit{Wallet: "w-missing", Amount: 7})
	require.Equal(t, s.stopStatus, a.status, a.body)
	if s.name == "qstash" {
		require.Equal(t, "true", a.header.Get(idemwebhook.HeaderQStashNonRetryable))
	}
	var p idemwebhook.Problem
	require.NoError(t, json.Unmarshal([]byte(a.body), &p))
	require.Equal(t, string(idem.ReasonPermanentError), p.Reason)
	require.Equal(t, id, p.EventID)
	st = e.state(t, id)
	require.Zero(t, st.ledger)
	require.Len(t, st.deadLetters, 1)
	dl := st.deadLetters[0]
	require.Equal(t, idem.ReasonPermanentError, dl.Reason)
	require.Equal(t, "acme", dl.Message.Tenant)
	require.Equal(t, id, dl.Message.EventID)
	require.Contains(t, dl.Error, "fewer rows than expected")
	require.Equal(t, int64(5), e.state(t, s.name+"-ok").balance, "nothing else applied")
}

// concurrent: 32 deliveries of one event id at once give one effect and 32 answers 2xx.
func concurrent[TTx any](t *testing.T, factory storetest.Factory[TTx], s scheme) {
	e := newEnv(t, factory, s)
	id := s.name + "-burst"
	body := credit{ID: id, Wallet: "w1", Amount: 3}.body()
	const n = 32
	reqs := make([]*http.Request, n)
	for i := range reqs {
		reqs[i] = s.request(t, e.url, id, body, false, time.Now())
	}
	var wg sync.WaitGroup
	statuses := make([]int, n)
	outcomes := make([]string, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := http.DefaultClient.Do(reqs[i])
			if err != nil {
				statuses[i] = -1
				return
			}
			defer resp.Body.Close()
			var a idemwebhook.Answer
			_ = json.NewDecoder(resp.Body).Decode(&a)
			statuses[i], outcomes[i] = resp.StatusCode, a.Outcome
		}()
	}
	close(start)
	wg.Wait()
	processed := 0
	for i := range n {
		require.Equal(t, 200, statuses[i], "delivery %d", i)
		if outcomes[i] == "processed" {
			processed++
		} else {
			require.Equal(t, "duplicate", outcomes[i])
		}
	}
	require.Equal(t, 1, processed)
	st := e.state(t, id)
	require.Equal(t, int64(1), st.ledger)
	require.Equal(t, int64(3), st.balance)
	require.Equal(t, int64(1), st.claims)
	require.Empty(t, st.deadLetters)
}

// sinkToIngress: an outbox event signed with idemauth and POSTed by the idemhttp sink (as the
// relay does) is applied once, however often the relay publishes it.
func sinkToIngress[TTx any](t *testing.T, factory storetest.Factory[TTx]) {
	s := schemes()[3]
	require.Equal(t, "idem", s.name)
	e := newEnv(t, factory, s)
	sink, err := idemhttp.NewSink(idemhttp.SinkConfig{URL: func(string) (string, error) { return e.url, nil }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	msg := idem.Message{EventID: "relay-1", Type: "credit", Payload: credit{Wallet: "w1", Amount: 11}.body(), OccurredAt: time.Now().Add(-time.Minute)}
	require.NoError(t, idemauth.SignMessage(idemauth.Key{ID: "acme-1", Tenant: "acme", Secret: goodKey}, &msg, time.Now()))
	ctx := context.Background()
	require.NoError(t, sink.Publish(ctx, "credits", msg))
	require.NoError(t, sink.Publish(ctx, "credits", msg), "a republish is a duplicate, answered 2xx")
	st := e.state(t, "relay-1")
	require.Equal(t, int64(1), st.ledger)
	require.Equal(t, int64(11), st.balance)

	forged := msg.Clone()
	forged.Payload = credit{Wallet: "w1", Amount: 1100}.body()
	forged.EventID = "relay-2"
	err = sink.Publish(ctx, "credits", forged)
	require.Error(t, err)
	require.Equal(t, idem.ClassPermanent, idem.Classify(err), "the relay dead-letters what the ingress refused")
	require.True(t, strings.Contains(err.Error(), "401"), err.Error())
	require.Equal(t, int64(11), e.state(t, "relay-2").balance)
}

// TestMain names the service variables whose absence made tests skip, and fails a passing run
// that leaked goroutines (a server or a pool left open).
func TestMain(m *testing.M) { testenv.Main(m) }
