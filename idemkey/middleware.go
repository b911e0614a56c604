package idemkey

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

// HandlerFunc is a handler that writes its business change in tx, the transaction that also
// stores its response under the key: both commit together, or neither does. An error rolls tx
// back, releases the key (a retry runs again) and is answered 500 without its text.
type HandlerFunc[TTx any] func(w http.ResponseWriter, r *http.Request, tx TTx) error

// Middleware makes POST and PATCH handlers idempotent under the Idempotency-Key header. Build it
// with New; it is safe for concurrent use.
type Middleware[TTx any] struct {
	store   Store[TTx]
	cfg     Config
	methods map[string]bool
}

// New returns the middleware over store, or an error naming every invalid field of cfg.
func New[TTx any](store Store[TTx], cfg Config) (*Middleware[TTx], error) {
	if store == nil {
		return nil, errors.New("idemkey: New: store is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Middleware[TTx]{store: store, cfg: cfg, methods: make(map[string]bool, len(cfg.Methods))}
	for _, meth := range cfg.Methods {
		m.methods[meth] = true
	}
	return m, nil
}

// Config returns the middleware's configuration with defaults applied.
func (m *Middleware[TTx]) Config() Config { return m.cfg }

// Handle returns h as an http.Handler guarded by the key. Requests whose method needs no key
// (and, with Config.Optional, requests without one) run h in a transaction of their own, with
// the same rules for committing and the same cap on the held response
// (Config.MaxResponseBytes), but nothing stored.
func (m *Middleware[TTx]) Handle(h HandlerFunc[TTx]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, h, func() { m.serveUnkeyed(w, r, h) })
	})
}

// Wrap is the plain net/http middleware, func(http.Handler) http.Handler, for routers that take
// one (the standard mux by wrapping, chi with Use or With). next finds the transaction with
// Tx and writes in it; its response decides the commit (Config.Commit), and a panic rolls back.
// Requests whose method needs no key (and, with Config.Optional, requests without one) go to
// next untouched, with no transaction (Tx reports false).
func (m *Middleware[TTx]) Wrap(next http.Handler) http.Handler {
	h := func(w http.ResponseWriter, r *http.Request, _ TTx) error {
		next.ServeHTTP(w, r)
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, h, func() { next.ServeHTTP(w, r) })
	})
}

// txKey is the context key of the handler's transaction.
type txKey struct{}

// Tx returns the transaction the middleware opened for the request whose context is ctx, the
// one that stores the response: write the request's business change in it.
func Tx[TTx any](ctx context.Context) (TTx, bool) {
	tx, ok := ctx.Value(txKey{}).(TTx)
	return tx, ok
}

// lockOutcome is what taking a key found.
type lockOutcome int

const (
	lockAcquired lockOutcome = iota + 1
	lockInFlight
	lockMismatch
	lockCompleted
)

// lockAttempts bounds how often taking a key starts over when the row changed under it.
const lockAttempts = 3

// serve runs one request that may need a key; unkeyed handles one that does not.
func (m *Middleware[TTx]) serve(w http.ResponseWriter, r *http.Request, h HandlerFunc[TTx], unkeyed func()) {
	if !m.methods[r.Method] {
		unkeyed()
		return
	}
	key, err := ParseKey(r.Header.Values(HeaderIdempotencyKey))
	if errors.Is(err, ErrKeyMissing) && m.cfg.Optional {
		unkeyed()
		return
	}
	start := time.Now()
	ob := Observation{Outcome: OutcomeRefused}
	if m.cfg.Observe != nil {
		// Deferred, so that a handler's panic is observed (as rolled back) on its way out.
		defer func() {
			ob.Duration = time.Since(start)
			m.cfg.Observe(r.Context(), ob)
		}()
	}
	if err != nil {
		ob.Status = writeProblem(w, http.StatusBadRequest, trimPrefix(err), nil)
		return
	}
	principal, err := m.cfg.Principal(r)
	// An empty principal is refused like an error: a principal func that fails open with ""
	// would put all its callers in one scope.
	if err != nil || principal == "" {
		ob.Status = writeProblem(w, http.StatusUnauthorized, "the request has no principal to scope its Idempotency-Key by", nil)
		return
	}
	route := m.cfg.Route(r)
	if len(principal) > MaxPrincipalLen || !bounded(principal) || len(route) > MaxRouteLen || !bounded(route) {
		m.cfg.Logger.ErrorContext(r.Context(), "idemkey: principal or route out of bounds (Config.Principal, Config.Route)",
			"principal_len", len(principal), "route_len", len(route))
		ob.Status = writeProblem(w, http.StatusInternalServerError, "the request could not be scoped", nil)
		return
	}
	ob.Route = route
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			ob.Status = writeProblem(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body exceeds %d bytes", m.cfg.MaxBodyBytes), nil)
			return
		}
		ob.Status = writeProblem(w, http.StatusBadRequest, "the body could not be read", nil)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	fp, err := m.cfg.Fingerprint(r, body)
	if err != nil {
		ob.Status = writeProblem(w, http.StatusBadRequest, "the request could not be fingerprinted", nil)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))

	now := m.cfg.Now()
	want := Record{
		ID: NewKeyID(principal, route, key), Principal: principal, Route: route, Key: key,
		Fingerprint: fp, Status: StatusInFlight, Token: 1,
		LockedUntil: now.Add(m.cfg.LockTimeout), CreatedAt: now, ExpiresAt: now.Add(m.cfg.Retention),
	}
	outcome, rec, err := m.lock(r.Context(), want)
	if err != nil {
		m.log(r.Context(), "idemkey: key not taken", want, err)
		ob.Outcome = OutcomeUnavailable
		ob.Status = writeProblem(w, http.StatusServiceUnavailable, "the key could not be checked; retry with the same key", map[string]string{"Retry-After": "1"})
		return
	}
	switch outcome {
	case lockMismatch:
		ob.Outcome = OutcomeMismatch
		ob.Status = writeProblem(w, http.StatusUnprocessableEntity, "this Idempotency-Key was used with another request (method, path or body differ); use a new key for a new request", nil)
	case lockInFlight:
		ob.Outcome = OutcomeInFlight
		ob.Status = writeProblem(w, http.StatusConflict, "a request with this Idempotency-Key is still being processed; retry later with the same key", map[string]string{"Retry-After": "1"})
	case lockCompleted:
		ob.Outcome, ob.Status = OutcomeReplayed, m.replay(w, rec)
	case lockAcquired:
		m.execute(w, r, h, rec, &ob)
	}
}

// lock takes the key of want, or reports why not: another fingerprint, a request in flight, or
// a completed key (with its record, for the replay).
func (m *Middleware[TTx]) lock(ctx context.Context, want Record) (lockOutcome, Record, error) {
	for range lockAttempts {
		var (
			outcome lockOutcome
			rec     Record
		)
		err := m.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
			outcome = 0
			ok, err := m.store.InsertIdempotencyKeyTx(ctx, tx, want)
			if err != nil {
				return err
			}
			if ok {
				outcome, rec = lockAcquired, want
				return nil
			}
			cur, err := m.store.GetIdempotencyKeyTx(ctx, tx, want.ID)
			if errors.Is(err, idem.ErrNotFound) {
				return nil // collected meanwhile: start over
			}
			if err != nil {
				return err
			}
			now := want.CreatedAt
			var next Record
			switch {
			case !cur.ExpiresAt.After(now):
				// Past its retention: the key is free again, as if collected.
				next = want
			case cur.Fingerprint != want.Fingerprint:
				outcome, rec = lockMismatch, cur
				return nil
			case cur.Status == StatusCompleted:
				outcome, rec = lockCompleted, cur
				return nil
			case cur.LockedUntil.After(now):
				outcome, rec = lockInFlight, cur
				return nil
			default:
				// The request holding the key is gone (crashed, or past its deadline, so its
				// transaction can no longer commit): take over.
				next = cur
				next.LockedUntil, next.ExpiresAt = want.LockedUntil, want.ExpiresAt
			}
			next.Token = cur.Token + 1
			ok, err = m.store.UpdateIdempotencyKeyTx(ctx, tx, next)
			if err != nil || !ok {
				return err // changed meanwhile: start over
			}
			outcome, rec = lockAcquired, next
			return nil
		})
		if err != nil {
			return 0, Record{}, err
		}
		if outcome != 0 {
			return outcome, rec, nil
		}
	}
	return lockInFlight, want, nil
}

// Why a handler's transaction did not commit, besides the handler's own error.
var (
	errNotCommitted = errors.New("idemkey: the response's status is not committed (Config.Commit)")
	errTooLarge     = errors.New("idemkey: the response exceeds Config.MaxResponseBytes")
	errLockLost     = errors.New("idemkey: the key was taken over after its lock expired")
)

// handlerError marks the handler's own error.
type handlerError struct{ err error }

func (e handlerError) Error() string { return e.err.Error() }
func (e handlerError) Unwrap() error { return e.err }

// execute runs h under the key it holds in lk: the handler's writes and the completed key with
// its response commit in one transaction, and only then does the response go out.
func (m *Middleware[TTx]) execute(w http.ResponseWriter, r *http.Request, h HandlerFunc[TTx], lk Record, ob *Observation) {
	// The handler may not outlive its lock: past it, another request may take the key over.
	// The time left is measured on Config.Now's clock, which wrote LockedUntil.
	ctx, cancel := context.WithTimeout(r.Context(), lk.LockedUntil.Sub(m.cfg.Now()))
	defer cancel()
	buf := newBuffer(m.cfg.MaxResponseBytes)
	committed := false
	defer func() {
		if p := recover(); p != nil {
			// A panic of the handler was rolled back by InTx: free the key for the retry. (One
			// while writing a committed response leaves the key completed.) Then let net/http
			// see the panic.
			if !committed {
				m.release(r.Context(), lk)
				ob.Outcome, ob.Status = OutcomeRolledBack, 0
			}
			panic(p)
		}
	}()
	err := m.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		err := h(buf, r.WithContext(context.WithValue(ctx, txKey{}, tx)), tx)
		switch {
		case buf.overflow:
			return errTooLarge // the handler's error, if any, is the failed write
		case err != nil:
			return handlerError{err}
		}
		status := buf.statusCode()
		if !m.cfg.Commit(status) {
			return errNotCommitted
		}
		header, err := json.Marshal(buf.kept(m.cfg.ReplayHeaders))
		if err != nil {
			return err
		}
		done := lk
		done.Token, done.Status = lk.Token+1, StatusCompleted
		done.ResponseStatus, done.ResponseHeader, done.ResponseBody = status, header, buf.body.Bytes()
		ok, err := m.store.UpdateIdempotencyKeyTx(ctx, tx, done)
		switch {
		case err != nil:
			return err
		case !ok:
			return errLockLost
		}
		return nil
	})
	if err == nil {
		committed = true
		ob.Outcome, ob.Status = OutcomeProcessed, buf.statusCode()
		buf.writeTo(w, "")
		return
	}
	if !errors.Is(err, errLockLost) {
		m.release(r.Context(), lk)
	}
	ob.Outcome = OutcomeRolledBack
	switch {
	case errors.Is(err, errNotCommitted):
		ob.Status = buf.statusCode()
		buf.writeTo(w, "")
	case errors.Is(err, errLockLost):
		m.log(r.Context(), "idemkey: rolled back", lk, err)
		ob.Status = writeProblem(w, http.StatusConflict, "the request took longer than its lock and another request with this key took over; retry with the same key", map[string]string{"Retry-After": "1"})
	case errors.Is(err, errTooLarge):
		m.log(r.Context(), "idemkey: rolled back", lk, err)
		ob.Status = writeProblem(w, http.StatusInternalServerError, "the response is too large to store, so nothing was done", nil)
	case errors.As(err, new(handlerError)):
		m.log(r.Context(), "idemkey: handler failed, rolled back", lk, err)
		ob.Status = writeProblem(w, http.StatusInternalServerError, "the request failed and nothing was done; it may be retried with the same key", nil)
	default:
		m.log(r.Context(), "idemkey: not committed", lk, err)
		ob.Outcome = OutcomeUnavailable
		ob.Status = writeProblem(w, http.StatusServiceUnavailable, "the request was not committed; retry with the same key", map[string]string{"Retry-After": "1"})
	}
}

// release deletes the in-flight key lk after its transaction rolled back, so that a retry runs
// at once instead of waiting for the lock to expire. It runs outside the request's context,
// which may have ended; when it fails, the lock simply expires.
func (m *Middleware[TTx]) release(ctx context.Context, lk Record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	err := m.store.InTx(ctx, func(ctx context.Context, tx TTx) error {
		_, err := m.store.DeleteIdempotencyKeyTx(ctx, tx, lk.ID, lk.Token)
		return err
	})
	if err != nil {
		m.log(ctx, "idemkey: key not released; it frees itself when its lock expires", lk, err)
	}
}

// serveUnkeyed runs h for a request that needs no key, in a transaction of its own. Its
// response is held until the transaction commits, as a keyed one is (the client must not see
// an effect that may still roll back), so it is capped by Config.MaxResponseBytes the same way.
func (m *Middleware[TTx]) serveUnkeyed(w http.ResponseWriter, r *http.Request, h HandlerFunc[TTx]) {
	buf := newBuffer(m.cfg.MaxResponseBytes)
	err := m.store.InTx(r.Context(), func(ctx context.Context, tx TTx) error {
		err := h(buf, r.WithContext(context.WithValue(ctx, txKey{}, tx)), tx)
		switch {
		case buf.overflow:
			return errTooLarge // the handler's error, if any, is the failed write
		case err != nil:
			return handlerError{err}
		}
		if !m.cfg.Commit(buf.statusCode()) {
			return errNotCommitted
		}
		return nil
	})
	switch {
	case err == nil, errors.Is(err, errNotCommitted):
		buf.writeTo(w, "")
	case errors.Is(err, errTooLarge):
		m.log(r.Context(), "idemkey: rolled back", Record{}, err)
		_ = writeProblem(w, http.StatusInternalServerError, "the response is too large to hold until its transaction commits, so nothing was done", nil)
	case errors.As(err, new(handlerError)):
		m.log(r.Context(), "idemkey: handler failed, rolled back", Record{}, err)
		_ = writeProblem(w, http.StatusInternalServerError, "the request failed and nothing was done", nil)
	default:
		m.log(r.Context(), "idemkey: not committed", Record{}, err)
		_ = writeProblem(w, http.StatusServiceUnavailable, "the request was not committed", map[string]string{"Retry-After": "1"})
	}
}

// replay writes a completed key's stored response, marked as a replay, and returns its status.
func (m *Middleware[TTx]) replay(w http.ResponseWriter, rec Record) int {
	var header http.Header
	if len(rec.ResponseHeader) > 0 {
		if err := json.Unmarshal(rec.ResponseHeader, &header); err != nil {
			m.log(context.Background(), "idemkey: stored headers unreadable; replayed without them", rec, err)
		}
	}
	b := &buffer{header: header, status: rec.ResponseStatus, limit: -1}
	if b.header == nil {
		b.header = http.Header{}
	}
	b.body.Write(rec.ResponseBody)
	b.writeTo(w, m.cfg.ReplayHeader)
	return b.statusCode()
}

// log writes one line about a failed request; the key is shown by a short id, since keys may be
// chosen by clients and are not meant for logs.
func (m *Middleware[TTx]) log(ctx context.Context, msg string, rec Record, err error) {
	attrs := []any{"error", err.Error()}
	if rec.Route != "" {
		attrs = append(attrs, "route", rec.Route, "key_id", hex.EncodeToString(rec.ID[:6]))
	}
	m.cfg.Logger.WarnContext(ctx, msg, attrs...)
}

// CollectGarbage deletes the keys past their retention, in batches of at most batch rows
// (GCBatchDefault when batch <= 0) so that a backlog never holds long locks, and reports how
// many it deleted. Run it periodically (every hour is plenty); an expired key that is still
// there is treated as free anyway.
func (m *Middleware[TTx]) CollectGarbage(ctx context.Context, batch int) (int, error) {
	if batch <= 0 {
		batch = GCBatchDefault
	}
	before := m.cfg.Now()
	total := 0
	for {
		n, err := m.store.DeleteExpiredIdempotencyKeys(ctx, before, batch)
		total += n
		if err != nil {
			return total, fmt.Errorf("idemkey: garbage collection of keys expired before %s: %w", before.UTC().Format(time.RFC3339), err)
		}
		if n < batch {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// bounded reports whether s is valid UTF-8 without control characters: principals and routes
// are stored and shown to operators.
func bounded(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) {
			return false
		}
	}
	return true
}

// trimPrefix drops the package prefix from a parse error for a problem's detail.
func trimPrefix(err error) string {
	s := err.Error()
	const p = "idemkey: "
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// statusText is the status line text, or "Status N" for a code Go does not know.
func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return t
	}
	return "Status " + strconv.Itoa(code)
}
