package idemkey

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// Defaults for Config.
const (
	// RetentionDefault keeps a key 24 hours, as Stripe does: a client retrying later than that
	// with the same key gets its request executed anew.
	RetentionDefault = 24 * time.Hour
	// LockTimeoutDefault bounds how long a request holds its key in flight. The handler's
	// context ends then too, so a request can never commit after another one took its key over.
	LockTimeoutDefault = time.Minute
	// MaxBodyBytesDefault is the largest request body read (and fingerprinted).
	MaxBodyBytesDefault = 1 << 20
	// MaxResponseBytesDefault is the largest response body stored for replay.
	MaxResponseBytesDefault = 1 << 20
	// ReplayHeaderDefault marks a replayed response (Stripe's name).
	ReplayHeaderDefault = "Idempotent-Replayed"
	// GCBatchDefault bounds one delete of CollectGarbage.
	GCBatchDefault = 1000
	// cleanupTimeout bounds the release of a key after a failed request; it runs outside the
	// request's context, which may have ended.
	cleanupTimeout = 10 * time.Second
)

// MethodsDefault are the methods that need a key: the ones HTTP does not make idempotent.
var MethodsDefault = []string{http.MethodPost, http.MethodPatch}

// ReplayHeadersDefault are the response headers stored and replayed with a completed key's
// response besides its status and body.
var ReplayHeadersDefault = []string{"Content-Type", "Content-Language", "Content-Location", "Location", "ETag", "Last-Modified"}

// Config configures a Middleware. Zero fields take the documented defaults; New reports every
// invalid field by name.
type Config struct {
	// Principal names who sends the request (required): the authenticated user, API key or
	// tenant, read from what your authentication middleware left in the request. Keys are
	// scoped by it, so one client can never get another's stored response. Everything else
	// that scopes the caller belongs in it too: a tenant or account chosen per request (by a
	// header such as X-Tenant, which neither the key's scope nor DefaultFingerprint looks at),
	// an impersonated user; combine them, e.g. tenant + "/" + user. Otherwise one key sent for
	// two tenants gets the first tenant's stored response. An error or an empty principal
	// refuses the request with 401. For an API without authentication return a constant,
	// deliberately.
	Principal func(r *http.Request) (string, error)
	// Route names the operation (default: the pattern the standard mux matched, r.Pattern, or
	// the escaped path when there is none). Keys are scoped by it too. With chi, return
	// chi.RouteContext(r.Context()).RoutePattern().
	Route func(r *http.Request) string
	// Methods need a key (default MethodsDefault: POST and PATCH); requests with other methods
	// pass through untouched.
	Methods []string
	// Optional lets a request without a key through, unprotected, instead of answering 400.
	Optional bool
	// Fingerprint computes what a retry must repeat exactly; the same key with another
	// fingerprint is answered 422. Default DefaultFingerprint: method, path, query and body.
	Fingerprint func(r *http.Request, body []byte) (idem.Fingerprint, error)
	// Retention is how long a key and its response are kept (default RetentionDefault).
	Retention time.Duration
	// LockTimeout is how long a request holds its key in flight, and the handler's deadline
	// (default LockTimeoutDefault). A request that crashed holds the key that long: retries
	// meanwhile are answered 409.
	LockTimeout time.Duration
	// MaxBodyBytes is the largest request body read (default MaxBodyBytesDefault); a larger one
	// is answered 413.
	MaxBodyBytes int64
	// MaxResponseBytes is the largest response body stored (default MaxResponseBytesDefault). A
	// larger response cannot be replayed, so its transaction is rolled back and the request
	// answered 500. It also bounds the response of a request that Handle runs without a key,
	// which is held in memory until its transaction commits: a larger one is rolled back and
	// answered 500 as well. (Wrap passes such requests through unbuffered.)
	MaxResponseBytes int
	// ReplayHeaders are stored and replayed besides status and body (default
	// ReplayHeadersDefault).
	ReplayHeaders []string
	// ReplayHeader is set to "true" on a replayed response (default ReplayHeaderDefault).
	ReplayHeader string
	// Commit decides by its status whether a response of the handler commits its transaction
	// and is stored with the key (default DefaultCommit: below 500, except 408, 425 and 429).
	// Otherwise the transaction rolls back, the response goes out as written, and the key is
	// released so that a retry runs again. A status outside 100-999 is never stored, whatever
	// Commit says: WriteHeader panics on it, as net/http's does, and the panic rolls back.
	Commit func(status int) bool
	// Now is the clock (default time.Now). Locks and retention compare times written by
	// different processes, so their clocks should agree to well within LockTimeout.
	Now func() time.Time
	// Logger receives one line per failed request (default slog.Default()).
	Logger *slog.Logger
	// Observe, when set, is called once per request that needs a key, after its answer was
	// written (or, for a handler's panic, on the panic's way out): count outcomes and times
	// with it. It must not block.
	Observe func(ctx context.Context, o Observation)
}

// Observation is what the middleware did with one request that needed a key.
type Observation struct {
	Outcome Outcome
	// Status is the status answered (0 after a panic: net/http aborts the connection).
	Status int
	// Route is the request's route (empty when the request was refused before it was known).
	Route string
	// Duration is the time from the middleware's first look at the request to its answer.
	Duration time.Duration
}

// Outcome names what happened to a request that needed a key; a small, fixed set, fit for a
// metric label.
type Outcome string

// The outcomes of Observation.
const (
	// OutcomeProcessed: the handler ran and its response committed with the key.
	OutcomeProcessed Outcome = "processed"
	// OutcomeReplayed: the key was completed; the stored response was sent again.
	OutcomeReplayed Outcome = "replayed"
	// OutcomeInFlight: 409, another request holds the key.
	OutcomeInFlight Outcome = "in_flight"
	// OutcomeMismatch: 422, the key came with another request.
	OutcomeMismatch Outcome = "mismatch"
	// OutcomeRefused: 400, 401 or 413 (missing or malformed key, no principal, body too large),
	// or 500 for a principal or route out of bounds; nothing was looked up.
	OutcomeRefused Outcome = "refused"
	// OutcomeRolledBack: the handler failed, panicked, answered a status not committed, wrote
	// too much, or lost its lock; nothing it wrote remains.
	OutcomeRolledBack Outcome = "rolled_back"
	// OutcomeUnavailable: 503, the store failed taking the key or committing.
	OutcomeUnavailable Outcome = "unavailable"
)

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Route == nil {
		c.Route = DefaultRoute
	}
	if len(c.Methods) == 0 {
		c.Methods = MethodsDefault
	}
	if c.Fingerprint == nil {
		c.Fingerprint = DefaultFingerprint
	}
	if c.Retention == 0 {
		c.Retention = RetentionDefault
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = LockTimeoutDefault
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = MaxBodyBytesDefault
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = MaxResponseBytesDefault
	}
	if c.ReplayHeaders == nil {
		c.ReplayHeaders = ReplayHeadersDefault
	}
	if c.ReplayHeader == "" {
		c.ReplayHeader = ReplayHeaderDefault
	}
	if c.Commit == nil {
		c.Commit = DefaultCommit
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate reports every invalid field of a config WithDefaults has filled in.
func (c Config) validate() error {
	var errs []error
	if c.Principal == nil {
		errs = append(errs, errors.New("Principal is nil (keys must be scoped by who sends them; return a constant for an API without authentication)"))
	}
	for _, m := range c.Methods {
		if m == "" || strings.ToUpper(m) != m || strings.ContainsAny(m, " \t") {
			errs = append(errs, fmt.Errorf("Methods: %q is not an upper-case method name", m))
		}
	}
	if c.Retention < 0 {
		errs = append(errs, fmt.Errorf("Retention is %v, want > 0", c.Retention))
	}
	if c.LockTimeout < 0 {
		errs = append(errs, fmt.Errorf("LockTimeout is %v, want > 0", c.LockTimeout))
	}
	if c.Retention > 0 && c.LockTimeout > 0 && c.Retention < 2*c.LockTimeout {
		errs = append(errs, fmt.Errorf("Retention (%v) is shorter than twice LockTimeout (%v): a key could expire while its request still runs", c.Retention, c.LockTimeout))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxBodyBytes is %d, want > 0", c.MaxBodyBytes))
	}
	if c.MaxResponseBytes < 0 {
		errs = append(errs, fmt.Errorf("MaxResponseBytes is %d, want > 0", c.MaxResponseBytes))
	}
	for _, h := range c.ReplayHeaders {
		if h == "" || strings.ContainsAny(h, " \t:\r\n") {
			errs = append(errs, fmt.Errorf("ReplayHeaders: %q is not a header name", h))
		}
	}
	if strings.ContainsAny(c.ReplayHeader, " \t:\r\n") {
		errs = append(errs, fmt.Errorf("ReplayHeader %q is not a header name", c.ReplayHeader))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemkey: config: %w", err)
	}
	return nil
}

// DefaultRoute is Config.Route's default: the pattern the standard mux matched (r.Pattern, set
// when the middleware wraps a handler registered on an http.ServeMux), else the escaped path.
func DefaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.EscapedPath()
}

// DefaultCommit is Config.Commit's default: a status below 500 commits and is stored, except
// the ones that tell the client to retry the same request later, which would otherwise be
// replayed to every retry for the whole retention: 408 Request Timeout, 425 Too Early and 429
// Too Many Requests. They roll back, and the key is released. 5xx roll back too.
func DefaultCommit(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// DefaultFingerprint is Config.Fingerprint's default: SHA-256 over the method, the escaped
// path, the raw query and the body, each length-prefixed. Headers are left out: they change
// between a request and its retry (dates, tracing) without changing what is asked for.
func DefaultFingerprint(r *http.Request, body []byte) (idem.Fingerprint, error) {
	h := sha256.New()
	for _, s := range []string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, string(body)} {
		fmt.Fprintf(h, "%d:", len(s))
		h.Write([]byte(s))
	}
	var f idem.Fingerprint
	h.Sum(f[:0])
	return f, nil
}
