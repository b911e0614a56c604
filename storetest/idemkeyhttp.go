package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkey"
)

// sqliteDialect names the store whose one writer makes two transactions never overlap.
const sqliteDialect = "sqlite"

func keyHTTPChecks[TTx any](run func(string, func(*keyHarness[TTx]))) {
	run("KeyRefusals", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		resp := h.mustPost("/orders/1", "", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusBadRequest, "Idempotency-Key header is missing")
		resp = h.mustPost("/orders/1", "not a key", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusBadRequest, "Idempotency-Key header is malformed")
		resp = h.mustPost("/orders/1", `"unterminated`, orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusBadRequest, "no closing quote")
		resp, err := h.postRaw(h.ctx, "/orders/1", "", "k-anon", []byte(`{"amount":5}`), nil)
		require.NoError(h.t, err)
		requireProblem(h.t, resp, http.StatusUnauthorized, "no principal")
		for _, k := range []string{"not a key", "k-anon"} {
			require.Zero(h.t, h.ledger(k))
		}
		h.requireOutcomes("refused 400", "refused 400", "refused 400", "refused 401")
	})

	run("KeyBlankPrincipal401", func(h *keyHarness[TTx]) {
		// A principal func that fails open with "" would put every such caller in one scope.
		h.serve(idemkey.Config{Principal: func(*http.Request) (string, error) { return "", nil }}, false, nil)
		resp := h.mustPost("/orders/1", "k-blank", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusUnauthorized, "no principal")
		require.Zero(h.t, h.ledger("k-blank"))
		_, err := h.get(idemkey.NewKeyID("", orderRoute, "k-blank"))
		require.ErrorIs(h.t, err, idem.ErrNotFound, "nothing was looked up or stored")
		h.requireOutcomes("refused 401")
	})

	for _, plain := range []bool{false, true} {
		name := "KeyReplay"
		if plain {
			name = "KeyReplayPlainHandler"
		}
		run(name, func(h *keyHarness[TTx]) {
			h.serve(idemkey.Config{}, plain, nil)
			first := h.mustPost("/orders/1", "k-replay", orderRequest{Amount: 5})
			requireFresh(h.t, first, "k-replay")
			require.Equal(h.t, "/orders/1", first.header.Get("Location"))
			for range 2 {
				requireReplay(h.t, h.mustPost("/orders/1", "k-replay", orderRequest{Amount: 5}), first)
			}
			// The draft's sf-string form is the same key.
			requireReplay(h.t, h.mustPost("/orders/1", `"k-replay"`, orderRequest{Amount: 5}), first)
			require.EqualValues(h.t, 1, h.ledger("k-replay"))
			bal, err := h.b.Balance(h.ctx, "w1")
			require.NoError(h.t, err)
			require.EqualValues(h.t, 5, bal)
			h.requireOutcomes("processed 201", "replayed 201", "replayed 201", "replayed 201")
		})
	}

	run("KeyReuse422", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		requireFresh(h.t, h.mustPost("/orders/1", "k-reuse", orderRequest{Amount: 5}), "k-reuse")
		resp := h.mustPost("/orders/1", "k-reuse", orderRequest{Amount: 6})
		requireProblem(h.t, resp, http.StatusUnprocessableEntity, "used with another request")
		resp = h.mustPost("/orders/2", "k-reuse", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusUnprocessableEntity, "used with another request")
		require.EqualValues(h.t, 1, h.ledger("k-reuse"))
		h.requireOutcomes("processed 201", "mismatch 422", "mismatch 422")
	})

	run("KeyScopedByPrincipal", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		body := []byte(`{"amount":5}`)
		for _, user := range []string{"alice", "bob"} {
			resp, err := h.postRaw(h.ctx, "/orders/1", user, "k-shared", body, nil)
			require.NoError(h.t, err)
			requireFresh(h.t, resp, "k-shared")
		}
		resp, err := h.postRaw(h.ctx, "/orders/1", "bob", "k-shared", body, nil)
		require.NoError(h.t, err)
		require.Equal(h.t, "true", resp.header.Get(idemkey.ReplayHeaderDefault))
		require.EqualValues(h.t, 2, h.ledger("k-shared"), "one effect per principal")
	})

	run("KeyConcurrent32", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		// The first run holds its transaction open for a moment, so the others arrive while it
		// is in flight (or, on SQLite, wait for its commit and get the replay).
		h.mode.Store(modeHold)
		go func() {
			<-h.entered
			time.Sleep(100 * time.Millisecond)
			close(h.hold)
		}()
		const n = 32
		resps := make([]keyResponse, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				resps[i], errs[i] = h.post(h.ctx, "/orders/1", "k-race", orderRequest{Amount: 7})
			})
		}
		close(start)
		wg.Wait()
		var fresh []keyResponse
		var conflicts, replays int
		for i, resp := range resps {
			require.NoError(h.t, errs[i])
			switch {
			case resp.status == http.StatusConflict:
				requireProblem(h.t, resp, http.StatusConflict, "still being processed")
				require.Equal(h.t, "1", resp.header.Get("Retry-After"))
				conflicts++
			case resp.header.Get(idemkey.ReplayHeaderDefault) == "true":
				replays++
			default:
				requireFresh(h.t, resp, "k-race")
				fresh = append(fresh, resp)
			}
		}
		require.Len(h.t, fresh, 1, "exactly one request runs the handler")
		for _, resp := range resps {
			if resp.header.Get(idemkey.ReplayHeaderDefault) == "true" {
				requireReplay(h.t, resp, fresh[0])
			}
		}
		require.Equal(h.t, n-1, conflicts+replays)
		h.t.Logf("32 concurrent requests with one key: 1 ran, %d got 409, %d got the replay", conflicts, replays)
		require.EqualValues(h.t, 1, h.ledger("k-race"))
		requireReplay(h.t, h.mustPost("/orders/1", "k-race", orderRequest{Amount: 7}), fresh[0])
	})

	run("KeyInFlight409", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		// A request that crashed after taking its key left it in flight; until its lock expires,
		// a retry is answered 409 and runs nothing.
		r := keyRecord("k-flight", `{"amount":5}`, time.Now())
		require.True(h.t, h.insert(r))
		resp := h.mustPost("/orders/1", "k-flight", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusConflict, "still being processed")
		require.Equal(h.t, "1", resp.header.Get("Retry-After"))
		require.Zero(h.t, h.ledger("k-flight"))
		h.requireOutcomes("in_flight 409")

		if h.b.Store.Dialect() == sqliteDialect {
			return // one writer: a second request waits for the first's commit (KeyConcurrent32)
		}
		// A live request in flight: its handler holds after its write.
		h.mode.Store(modeHold)
		done := make(chan keyResponse, 1)
		go func() {
			resp, _ := h.post(h.ctx, "/orders/1", "k-live", orderRequest{Amount: 5})
			done <- resp
		}()
		<-h.entered
		resp = h.mustPost("/orders/1", "k-live", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusConflict, "still being processed")
		close(h.hold)
		first := <-done
		requireFresh(h.t, first, "k-live")
		requireReplay(h.t, h.mustPost("/orders/1", "k-live", orderRequest{Amount: 5}), first)
		require.EqualValues(h.t, 1, h.ledger("k-live"))
	})

	run("KeyAbandonedLockTakenOver", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		r := keyRecord("k-crashed", `{"amount":5}`, time.Now().Add(-2*time.Minute))
		r.LockedUntil = time.Now().Add(-time.Minute)
		require.True(h.t, h.insert(r))
		first := h.mustPost("/orders/1", "k-crashed", orderRequest{Amount: 5})
		requireFresh(h.t, first, "k-crashed")
		requireReplay(h.t, h.mustPost("/orders/1", "k-crashed", orderRequest{Amount: 5}), first)
		require.EqualValues(h.t, 1, h.ledger("k-crashed"))
		got, err := h.get(r.ID)
		require.NoError(h.t, err)
		require.Equal(h.t, idemkey.StatusCompleted, got.Status)
		require.EqualValues(h.t, 3, got.Token, "taken over (2), then completed (3)")
	})

	run("KeyExpiredIsFree", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		// Completed long ago with another body: past its retention the key is new again.
		r := keyRecord("k-old", `{"amount":1}`, time.Now().Add(-48*time.Hour))
		r.Status, r.Token, r.ExpiresAt, r.ResponseStatus = idemkey.StatusCompleted, 2, time.Now().Add(-24*time.Hour), 201
		require.True(h.t, h.insert(r))
		requireFresh(h.t, h.mustPost("/orders/1", "k-old", orderRequest{Amount: 5}), "k-old")
		require.EqualValues(h.t, 1, h.ledger("k-old"))
	})

	run("KeyPanicAfterWriteRollsBack", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		h.mode.Store(modePanic)
		_, err := h.post(h.ctx, "/orders/1", "k-panic", orderRequest{Amount: 5})
		require.Error(h.t, err, "the server drops the connection of a panicking handler")
		require.Zero(h.t, h.ledger("k-panic"), "the write rolled back with the panic")
		// The key was released: the retry runs at once, and the effect happens once.
		first := h.mustPost("/orders/1", "k-panic", orderRequest{Amount: 5})
		requireFresh(h.t, first, "k-panic")
		requireReplay(h.t, h.mustPost("/orders/1", "k-panic", orderRequest{Amount: 5}), first)
		require.EqualValues(h.t, 1, h.ledger("k-panic"))
		h.requireOutcomes("rolled_back 0", "processed 201", "replayed 201")
	})

	run("KeyConnectionLostAfterCommit", func(h *keyHarness[TTx]) {
		// The connection dies after the commit, before the response reaches the client: the
		// retry gets the stored response, and the effect stays single.
		var abort atomic.Bool
		abort.Store(true)
		h.serve(idemkey.Config{}, false, func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if abort.Swap(false) {
					w = abortingWriter{w}
				}
				next.ServeHTTP(w, r)
			})
		})
		_, err := h.post(h.ctx, "/orders/1", "k-lost", orderRequest{Amount: 5})
		require.Error(h.t, err, "the client never sees the first response")
		require.EqualValues(h.t, 1, h.ledger("k-lost"), "the effect committed before the response was written")
		resp := h.mustPost("/orders/1", "k-lost", orderRequest{Amount: 5})
		require.Equal(h.t, http.StatusCreated, resp.status, resp.body)
		require.Equal(h.t, "true", resp.header.Get(idemkey.ReplayHeaderDefault))
		require.Equal(h.t, "/orders/1", resp.header.Get("Location"))
		var body map[string]any
		require.NoError(h.t, json.Unmarshal([]byte(resp.body), &body))
		require.Equal(h.t, map[string]any{"order": "1", "key": "k-lost", "amount": float64(5)}, body)
		require.EqualValues(h.t, 1, h.ledger("k-lost"))
	})

	run("KeyClientHangsUpBeforeCommit", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		h.mode.Store(modeHold) // held until the request's context ends
		ctx, cancel := context.WithCancel(h.ctx)
		errc := make(chan error, 1)
		go func() {
			_, err := h.post(ctx, "/orders/1", "k-hangup", orderRequest{Amount: 5})
			errc <- err
		}()
		<-h.entered
		cancel()
		require.Error(h.t, <-errc)
		// The server notices, rolls back and releases the key; until then a retry may see 409.
		var resp keyResponse
		require.Eventually(h.t, func() bool {
			resp = h.mustPost("/orders/1", "k-hangup", orderRequest{Amount: 5})
			return resp.status != http.StatusConflict
		}, 10*time.Second, 20*time.Millisecond)
		requireFresh(h.t, resp, "k-hangup")
		require.EqualValues(h.t, 1, h.ledger("k-hangup"))
	})

	run("KeyHandlerError500", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		h.mode.Store(modeFail)
		resp := h.mustPost("/orders/1", "k-fail", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusInternalServerError, "nothing was done")
		require.NotContains(h.t, resp.body, "handler failed", "the handler's error text stays on the server")
		require.Zero(h.t, h.ledger("k-fail"))
		requireFresh(h.t, h.mustPost("/orders/1", "k-fail", orderRequest{Amount: 5}), "k-fail")
		require.EqualValues(h.t, 1, h.ledger("k-fail"))
		h.requireOutcomes("rolled_back 500", "processed 201")
	})

	run("Key5xxNotStored", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{}, false, nil)
		for range 2 {
			resp := h.mustPost("/orders/1", "k-503", orderRequest{Amount: 5, Status: http.StatusServiceUnavailable})
			require.Equal(h.t, http.StatusServiceUnavailable, resp.status)
			require.Empty(h.t, resp.header.Get(idemkey.ReplayHeaderDefault), "a 5xx is not stored, so never replayed")
			require.Zero(h.t, h.ledger("k-503"), "a 5xx rolls its transaction back")
		}
		h.requireOutcomes("rolled_back 503", "rolled_back 503")
	})

	run("KeyTransientClientErrorsNotStored", func(h *keyHarness[TTx]) {
		// 408, 425 and 429 tell the client to retry: storing them would answer every retry
		// with the key the same way for the whole retention.
		h.serve(idemkey.Config{}, false, nil)
		var want []string
		for _, status := range []int{http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests} {
			key := fmt.Sprintf("k-%d", status)
			for range 2 {
				resp := h.mustPost("/orders/1", key, orderRequest{Amount: 5, Status: status})
				require.Equal(h.t, status, resp.status, resp.body)
				require.Empty(h.t, resp.header.Get(idemkey.ReplayHeaderDefault), "%d is not stored, so never replayed", status)
				require.Zero(h.t, h.ledger(key), "%d rolls its transaction back", status)
				want = append(want, fmt.Sprintf("rolled_back %d", status))
			}
		}
		h.requireOutcomes(want...)
	})

	run("KeyInvalidStatusNotStored", func(h *keyHarness[TTx]) {
		// net/http panics on a WriteHeader code outside 100-999; stored, such a code would
		// panic every replay for the whole retention (and one below 100 went out as 200). The
		// Commit here would store them: the middleware itself must refuse them.
		h.serve(idemkey.Config{Commit: func(status int) bool { return status < 500 || status > 599 }}, false, nil)
		var want []string
		for _, status := range []int{1000, 42} {
			key := fmt.Sprintf("k-bad-%d", status)
			for range 2 {
				_, err := h.post(h.ctx, "/orders/1", key, orderRequest{Amount: 5, Status: status})
				require.Error(h.t, err, "status %d: the handler panics like under net/http, and the connection drops", status)
				require.Zero(h.t, h.ledger(key), "status %d: the write rolled back", status)
				_, err = h.get(idemkey.NewKeyID("alice", orderRoute, key))
				require.ErrorIs(h.t, err, idem.ErrNotFound, "status %d: the key was released, nothing stored", status)
				want = append(want, "rolled_back 0")
			}
		}
		h.requireOutcomes(want...)
	})

	run("KeyLockLostRollsBack", func(h *keyHarness[TTx]) {
		if h.b.Store.Dialect() == sqliteDialect {
			h.t.Skip("one writer: a second request cannot take a key over while the first's transaction is open")
		}
		// The clock jumps past the first request's lock while its handler runs: a retry takes
		// the key over and completes; the first one's transaction then finds its token gone and
		// rolls back instead of committing a second effect.
		var offset atomic.Int64
		h.serve(idemkey.Config{Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }}, false, nil)
		h.mode.Store(modeHold)
		done := make(chan keyResponse, 1)
		go func() {
			resp, _ := h.post(h.ctx, "/orders/1", "k-overrun", orderRequest{Amount: 5})
			done <- resp
		}()
		<-h.entered
		offset.Store(int64(2 * idemkey.LockTimeoutDefault))
		// Another wallet, so that the second effect does not wait for the first one's row lock.
		require.NoError(h.t, h.b.CreateWallet(h.ctx, "w2"))
		second, err := h.postRaw(h.ctx, "/orders/1", "alice", "k-overrun", []byte(`{"amount":5}`), http.Header{"X-Wallet": {"w2"}})
		require.NoError(h.t, err)
		requireFresh(h.t, second, "k-overrun")
		close(h.hold)
		first := <-done
		requireProblem(h.t, first, http.StatusConflict, "took longer than its lock")
		require.EqualValues(h.t, 1, h.ledger("k-overrun"))
		requireReplay(h.t, h.mustPost("/orders/1", "k-overrun", orderRequest{Amount: 5}), second)
	})

	run("KeyUnguardedMethodsPassThrough", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{Methods: []string{http.MethodPatch}}, false, nil)
		for range 2 {
			resp := h.mustPost("/orders/1", "", orderRequest{Amount: 5})
			require.Equal(h.t, http.StatusCreated, resp.status, resp.body)
		}
		require.EqualValues(h.t, 2, h.ledger(""), "POST is not guarded here: each request runs")
	})

	run("KeyOptional", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{Optional: true}, false, nil)
		require.Equal(h.t, http.StatusCreated, h.mustPost("/orders/1", "", orderRequest{Amount: 5}).status)
		first := h.mustPost("/orders/1", "k-opt", orderRequest{Amount: 5})
		requireFresh(h.t, first, "k-opt")
		requireReplay(h.t, h.mustPost("/orders/1", "k-opt", orderRequest{Amount: 5}), first)
		resp := h.mustPost("/orders/1", "bad key", orderRequest{Amount: 5})
		require.Equal(h.t, http.StatusBadRequest, resp.status, "a malformed key is refused even when keys are optional")
		require.True(h.t, strings.Contains(resp.body, "malformed"))
		require.EqualValues(h.t, 1, h.ledger(""))
		require.EqualValues(h.t, 1, h.ledger("k-opt"))
	})

	run("KeyUnkeyedResponseCapped", func(h *keyHarness[TTx]) {
		// A request that needs no key still holds its response until its transaction commits:
		// the hold is capped by MaxResponseBytes too, so a handler cannot grow it unbounded.
		h.serve(idemkey.Config{Methods: []string{http.MethodPatch}, MaxResponseBytes: 10}, false, nil)
		resp := h.mustPost("/orders/1", "", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusInternalServerError, "too large")
		require.Zero(h.t, h.ledger(""), "a response that cannot be held rolls its effect back")
	})

	run("KeyResponseTooLarge", func(h *keyHarness[TTx]) {
		h.serve(idemkey.Config{MaxResponseBytes: 10}, false, nil)
		resp := h.mustPost("/orders/1", "k-big", orderRequest{Amount: 5})
		requireProblem(h.t, resp, http.StatusInternalServerError, "too large to store")
		require.Zero(h.t, h.ledger("k-big"), "a response that cannot be stored rolls its effect back")
	})
}

// abortingWriter aborts the connection at the first byte of the response, the way a crash or
// a dropped connection between commit and answer does.
type abortingWriter struct{ http.ResponseWriter }

func (abortingWriter) WriteHeader(int) { panic(http.ErrAbortHandler) }

func (abortingWriter) Write([]byte) (int, error) { panic(http.ErrAbortHandler) }
