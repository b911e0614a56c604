package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkey"
)

// ExerciseIdempotencyKeys checks a store's idempotency keys (idemkey.Store): the table's
// conditional statements directly, then the Idempotency-Key middleware end to end, through a
// real HTTP client and server, with the suite's non-idempotent ledger as the effect. The
// store built by factory must implement idemkey.Store[TTx].
func ExerciseIdempotencyKeys[TTx any](t *testing.T, factory Factory[TTx]) {
	t.Helper()
	run := func(name string, fn func(h *keyHarness[TTx])) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := factory(t)
			store, ok := b.Store.(idemkey.Store[TTx])
			require.True(t, ok, "%T does not implement idemkey.Store", b.Store)
			fn(&keyHarness[TTx]{t: t, b: b, store: store, ctx: context.Background()})
		})
	}
	keyStoreChecks(run)
	keyHTTPChecks(run)
}

// keyHarness is one check's store, and the middleware and server it builds.
type keyHarness[TTx any] struct {
	t     *testing.T
	b     Bundle[TTx]
	store idemkey.Store[TTx]
	ctx   context.Context
	mw    *idemkey.Middleware[TTx]
	srv   *httptest.Server
	// mode is what the next handler run does after its write (taken by one run): modePanic,
	// modeFail or modeHold.
	mode atomic.Int32
	// hold ends a modeHold run; entered receives one value per handler run, after its write.
	hold    chan struct{}
	entered chan struct{}

	obsMu sync.Mutex
	obs   []idemkey.Observation
}

// What the next handler run does after its write.
const (
	modeNone int32 = iota
	modePanic
	modeFail
	modeHold
)

// keyRecord is an in-flight record of key for principal "alice" on route "POST /orders/{id}",
// fingerprinted like a POST of body to /orders/1.
func keyRecord(key, body string, now time.Time) idemkey.Record {
	r := httptest.NewRequest(http.MethodPost, "/orders/1", strings.NewReader(body))
	fp, _ := idemkey.DefaultFingerprint(r, []byte(body))
	return idemkey.Record{
		ID: idemkey.NewKeyID("alice", orderRoute, key), Principal: "alice", Route: orderRoute, Key: key,
		Fingerprint: fp, Status: idemkey.StatusInFlight, Token: 1,
		LockedUntil: now.Add(time.Minute), CreatedAt: now, ExpiresAt: now.Add(time.Hour),
	}
}

// orderRoute is the pattern the checks' server registers its handler under.
const orderRoute = "POST /orders/{id}"

func (h *keyHarness[TTx]) inTx(fn func(ctx context.Context, tx TTx) error) {
	h.t.Helper()
	require.NoError(h.t, h.store.InTx(h.ctx, fn))
}

func (h *keyHarness[TTx]) insert(r idemkey.Record) bool {
	h.t.Helper()
	var ok bool
	h.inTx(func(ctx context.Context, tx TTx) error {
		var err error
		ok, err = h.store.InsertIdempotencyKeyTx(ctx, tx, r)
		return err
	})
	return ok
}

func (h *keyHarness[TTx]) get(id idemkey.KeyID) (idemkey.Record, error) {
	var r idemkey.Record
	err := h.store.InTx(h.ctx, func(ctx context.Context, tx TTx) error {
		var err error
		r, err = h.store.GetIdempotencyKeyTx(ctx, tx, id)
		return err
	})
	return r, err
}

func keyStoreChecks[TTx any](run func(string, func(*keyHarness[TTx]))) {
	run("KeyStoreRoundTrip", func(h *keyHarness[TTx]) {
		now := time.Now().UTC().Truncate(time.Microsecond)
		r := keyRecord("k1", `{"amount":5}`, now)
		require.True(h.t, h.insert(r))
		require.False(h.t, h.insert(r), "a second insert of one id inserts nothing")
		got, err := h.get(r.ID)
		require.NoError(h.t, err)
		requireRecord(h.t, r, got)

		done := r
		done.Token, done.Status = 2, idemkey.StatusCompleted
		done.ResponseStatus, done.ResponseHeader, done.ResponseBody = 201, []byte(`{"Content-Type":["application/json"]}`), []byte("{\"id\":1}\n\x00\xff")
		stale := done
		stale.Token = 3 // expects token 2, which the row does not have
		h.inTx(func(ctx context.Context, tx TTx) error {
			ok, err := h.store.UpdateIdempotencyKeyTx(ctx, tx, stale)
			require.NoError(h.t, err)
			require.False(h.t, ok, "an update with a stale token changes nothing")
			ok, err = h.store.UpdateIdempotencyKeyTx(ctx, tx, done)
			require.NoError(h.t, err)
			require.True(h.t, ok)
			ok, err = h.store.UpdateIdempotencyKeyTx(ctx, tx, done)
			require.NoError(h.t, err)
			require.False(h.t, ok, "the same update twice: the token moved on")
			return nil
		})
		got, err = h.get(r.ID)
		require.NoError(h.t, err)
		requireRecord(h.t, done, got)

		h.inTx(func(ctx context.Context, tx TTx) error {
			ok, err := h.store.DeleteIdempotencyKeyTx(ctx, tx, r.ID, 1)
			require.NoError(h.t, err)
			require.False(h.t, ok, "a delete with a stale token deletes nothing")
			ok, err = h.store.DeleteIdempotencyKeyTx(ctx, tx, r.ID, 2)
			require.NoError(h.t, err)
			require.True(h.t, ok)
			return nil
		})
		_, err = h.get(r.ID)
		require.ErrorIs(h.t, err, idem.ErrNotFound)
	})

	run("KeyStoreRollbackLeavesNothing", func(h *keyHarness[TTx]) {
		r := keyRecord("k-rb", "{}", time.Now())
		boom := errors.New("boom")
		err := h.store.InTx(h.ctx, func(ctx context.Context, tx TTx) error {
			ok, err := h.store.InsertIdempotencyKeyTx(ctx, tx, r)
			require.NoError(h.t, err)
			require.True(h.t, ok)
			return boom
		})
		require.ErrorIs(h.t, err, boom)
		_, err = h.get(r.ID)
		require.ErrorIs(h.t, err, idem.ErrNotFound)
	})

	run("KeyStoreGarbageCollection", func(h *keyHarness[TTx]) {
		now := time.Now().UTC()
		for i := range 5 {
			r := keyRecord(fmt.Sprintf("old-%d", i), "{}", now.Add(-2*time.Hour))
			r.ExpiresAt = now.Add(-time.Hour)
			require.True(h.t, h.insert(r))
		}
		live := keyRecord("live", "{}", now)
		require.True(h.t, h.insert(live))
		n, err := h.store.DeleteExpiredIdempotencyKeys(h.ctx, now, 2)
		require.NoError(h.t, err)
		require.Equal(h.t, 2, n, "one batch deletes at most its limit")
		mw := h.middleware(idemkey.Config{Now: func() time.Time { return now }})
		n, err = mw.CollectGarbage(h.ctx, 2)
		require.NoError(h.t, err)
		require.Equal(h.t, 3, n, "the collector loops over batches until none is left")
		_, err = h.get(live.ID)
		require.NoError(h.t, err, "a key within its retention stays")
		for i := range 5 {
			_, err := h.get(idemkey.NewKeyID("alice", orderRoute, fmt.Sprintf("old-%d", i)))
			require.ErrorIs(h.t, err, idem.ErrNotFound)
		}
	})
}

// middleware builds the middleware over the check's store: principal from the X-User header,
// quiet logger, cfg's other fields as given.
func (h *keyHarness[TTx]) middleware(cfg idemkey.Config) *idemkey.Middleware[TTx] {
	h.t.Helper()
	if cfg.Principal == nil {
		cfg.Principal = func(r *http.Request) (string, error) {
			if u := r.Header.Get("X-User"); u != "" {
				return u, nil
			}
			return "", errors.New("no user")
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Observe == nil {
		cfg.Observe = func(_ context.Context, o idemkey.Observation) {
			h.obsMu.Lock()
			h.obs = append(h.obs, o)
			h.obsMu.Unlock()
		}
	}
	mw, err := idemkey.New(h.store, cfg)
	require.NoError(h.t, err)
	h.mw = mw
	return mw
}

// orderRequest is the body of the checks' POST /orders/{id}.
type orderRequest struct {
	Amount int64 `json:"amount"`
	// Status overrides the handler's 201.
	Status int `json:"status,omitempty"`
}

// serve starts a server whose POST /orders/{id} credits wallet w1 with the amount, recording
// the idempotency key as the ledger's event id, and answers 201 with the new order. plain
// builds it as a plain http.Handler under Wrap (the transaction from idemkey.Tx) instead of a
// HandlerFunc under Handle; wrap, when set, wraps the guarded handler.
func (h *keyHarness[TTx]) serve(cfg idemkey.Config, plain bool, wrap func(http.Handler) http.Handler) {
	h.t.Helper()
	require.NoError(h.t, h.b.CreateWallet(h.ctx, "w1"))
	h.hold, h.entered = make(chan struct{}), make(chan struct{}, 64)
	mw := h.middleware(cfg)
	order := func(w http.ResponseWriter, r *http.Request, tx TTx) error {
		var req orderRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return nil
		}
		key := r.Header.Get(idemkey.HeaderIdempotencyKey)
		wallet := r.Header.Get("X-Wallet") // not fingerprinted: a header
		if wallet == "" {
			wallet = "w1"
		}
		n, err := h.b.Credit(r.Context(), tx, key, wallet, req.Amount)
		if err != nil {
			return err
		}
		if err := idem.ExpectRows(n, 1); err != nil {
			return err
		}
		h.entered <- struct{}{}
		switch h.mode.Swap(modeNone) {
		case modePanic:
			panic("handler crashed after its write")
		case modeFail:
			return errors.New("handler failed after its write")
		case modeHold:
			select {
			case <-h.hold:
			case <-r.Context().Done():
			}
		}
		status := http.StatusCreated
		if req.Status != 0 {
			status = req.Status
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+r.PathValue("id"))
		w.Header().Set("X-Request-Only", "not kept")
		w.WriteHeader(status)
		return json.NewEncoder(w).Encode(map[string]any{"order": r.PathValue("id"), "key": key, "amount": req.Amount})
	}
	var handler http.Handler
	if plain {
		handler = mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tx, ok := idemkey.Tx[TTx](r.Context())
			if !ok {
				http.Error(w, "no transaction", http.StatusInternalServerError)
				return
			}
			if err := order(w, r, tx); err != nil {
				http.Error(w, "failed", http.StatusInternalServerError)
			}
		}))
	} else {
		handler = mw.Handle(order)
	}
	if wrap != nil {
		handler = wrap(handler)
	}
	mux := http.NewServeMux()
	mux.Handle(orderRoute, handler)
	h.srv = httptest.NewUnstartedServer(mux)
	h.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panics are deliberate
	h.srv.Start()
	h.t.Cleanup(h.srv.Close)
}

// keyResponse is what a check reads back.
type keyResponse struct {
	status int
	header http.Header
	body   string
}

// post sends POST path with key (none when empty) as user alice; err is the transport's.
func (h *keyHarness[TTx]) post(ctx context.Context, path, key string, req orderRequest) (keyResponse, error) {
	body, _ := json.Marshal(req)
	return h.postRaw(ctx, path, "alice", key, body, nil)
}

func (h *keyHarness[TTx]) postRaw(ctx context.Context, path, user, key string, body []byte, header http.Header) (keyResponse, error) {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		return keyResponse{}, err
	}
	for k, v := range header {
		r.Header[k] = v
	}
	r.Header.Set("X-User", user)
	if key != "" {
		r.Header.Set(idemkey.HeaderIdempotencyKey, key)
	}
	resp, err := h.srv.Client().Do(r)
	if err != nil {
		return keyResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return keyResponse{}, err
	}
	return keyResponse{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

func (h *keyHarness[TTx]) mustPost(path, key string, req orderRequest) keyResponse {
	h.t.Helper()
	resp, err := h.post(h.ctx, path, key, req)
	require.NoError(h.t, err)
	return resp
}

func (h *keyHarness[TTx]) ledger(key string) int64 {
	h.t.Helper()
	n, err := h.b.LedgerRows(h.ctx, key)
	require.NoError(h.t, err)
	return n
}

// requireProblem checks a problem+json answer: status, and a detail containing detail.
func requireProblem(t *testing.T, resp keyResponse, status int, detail string) {
	t.Helper()
	require.Equal(t, status, resp.status, resp.body)
	require.Equal(t, idemkey.ContentTypeProblem, resp.header.Get("Content-Type"))
	var p idemkey.Problem
	require.NoError(t, json.Unmarshal([]byte(resp.body), &p), resp.body)
	require.Equal(t, "about:blank", p.Type)
	require.Equal(t, status, p.Status)
	require.Equal(t, http.StatusText(status), p.Title)
	require.Contains(t, p.Detail, detail)
	require.Empty(t, resp.header.Get(idemkey.ReplayHeaderDefault))
}

// requireFresh checks the handler's own 201 for key, not a replay.
func requireFresh(t *testing.T, resp keyResponse, key string) {
	t.Helper()
	require.Equal(t, http.StatusCreated, resp.status, resp.body)
	require.Empty(t, resp.header.Get(idemkey.ReplayHeaderDefault))
	require.Equal(t, "not kept", resp.header.Get("X-Request-Only"), "the first answer carries every header the handler set")
	require.Contains(t, resp.body, `"key":"`+key+`"`)
}

// requireReplay checks a replay of first: same status, body and kept headers, marked.
func requireReplay(t *testing.T, resp, first keyResponse) {
	t.Helper()
	require.Equal(t, first.status, resp.status, resp.body)
	require.Equal(t, "true", resp.header.Get(idemkey.ReplayHeaderDefault))
	require.Equal(t, first.body, resp.body)
	require.Equal(t, first.header.Get("Content-Type"), resp.header.Get("Content-Type"))
	require.Equal(t, first.header.Get("Location"), resp.header.Get("Location"))
	require.Empty(t, resp.header.Get("X-Request-Only"), "only the chosen headers are stored")
}

// requireRecord compares records, times at the microsecond every store keeps.
func requireRecord(t *testing.T, want, got idemkey.Record) {
	t.Helper()
	for _, p := range []*idemkey.Record{&want, &got} {
		p.LockedUntil = p.LockedUntil.UTC().Truncate(time.Microsecond)
		p.CreatedAt = p.CreatedAt.UTC().Truncate(time.Microsecond)
		p.ExpiresAt = p.ExpiresAt.UTC().Truncate(time.Microsecond)
		if len(p.ResponseHeader) == 0 {
			p.ResponseHeader = nil
		}
		if len(p.ResponseBody) == 0 {
			p.ResponseBody = nil
		}
	}
	require.Equal(t, want, got)
}

// requireOutcomes waits for the middleware to have observed len(want) requests (it observes
// after the answer is written, so a client may be faster) and checks their outcomes and
// statuses in order.
func (h *keyHarness[TTx]) requireOutcomes(want ...string) {
	h.t.Helper()
	var got []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.obsMu.Lock()
		got = got[:0]
		for _, o := range h.obs {
			got = append(got, fmt.Sprintf("%s %d", o.Outcome, o.Status))
			require.Positive(h.t, o.Duration)
		}
		h.obsMu.Unlock()
		if len(got) >= len(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(h.t, want, got)
}
