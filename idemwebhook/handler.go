package idemwebhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtype"
	"github.com/idemkit/idem/retry"
	"github.com/idemkit/idem/wire"
)

// Defaults for Config.
const (
	// MaxBodyBytesDefault is the largest body read when Config.MaxBodyBytes is unset: the
	// consumer's own default payload limit, so every body read can also be processed.
	MaxBodyBytesDefault = idem.MaxPayloadBytesDefault
	// DeadLetterTimeoutDefault bounds the write of a dead letter. It runs outside the request's
	// context, so a provider that hangs up mid-answer does not lose its dead letter.
	DeadLetterTimeoutDefault = 10 * time.Second
)

// HeaderProvider is set on every message the ingress builds (and so on its dead letters): the
// provider's name.
const HeaderProvider = wire.WebhookProvider

// maxKeptHeaderLen bounds each request header value kept with a message.
const maxKeptHeaderLen = 1024

// maxDetailLen bounds the detail of a problem body.
const maxDetailLen = 300

// Config configures a Handler. Zero fields take the documented defaults; New names the field of
// every error.
type Config struct {
	// Verifier checks the provider's signature and names the event (required): NewQStash,
	// NewStripe, NewGitHub, NewIdem, or your own.
	Verifier Verifier
	// DeadLetters stores the deliveries refused for good (required): usually the consumer's own
	// store, so `idem dlq` lists them beside the broker's.
	DeadLetters idemstore.DeadLetterStore
	// MaxBodyBytes is the largest body read (default MaxBodyBytesDefault); a larger one is
	// answered 413, counted and logged as invalid_payload, and not stored (it was never
	// verified). It may not exceed the consumer's MaxPayloadBytes.
	MaxBodyBytes int64
	// Source is recorded with every dead letter as where it came from (default
	// "webhook:<provider>"). A replay names its target queue explicitly (idem dlq replay --topic).
	Source string
	// DeadLetterTimeout bounds one dead-letter write (default DeadLetterTimeoutDefault).
	DeadLetterTimeout time.Duration
	// Logger receives one line per delivery (default: the consumer's Logger).
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with zero fields set to their defaults (Logger stays nil
// until New gives it the consumer's).
func (c Config) WithDefaults() Config {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = MaxBodyBytesDefault
	}
	if c.Source == "" && c.Verifier != nil {
		c.Source = "webhook:" + c.Verifier.Provider().Name
	}
	if c.DeadLetterTimeout == 0 {
		c.DeadLetterTimeout = DeadLetterTimeoutDefault
	}
	return c
}

// validate reports every invalid field of a config that WithDefaults has filled in; maxPayload
// is the consumer's MaxPayloadBytes.
func (c Config) validate(maxPayload int) error {
	var errs []error
	if c.Verifier == nil {
		errs = append(errs, errors.New("Verifier is nil (want NewQStash, NewStripe, NewGitHub, NewIdem or your own)"))
	} else {
		p := c.Verifier.Provider()
		if p.Name == "" {
			errs = append(errs, errors.New("Verifier: Provider().Name is empty"))
		}
		if p.StopStatus < 400 || p.StopStatus > 499 {
			errs = append(errs, fmt.Errorf("Verifier: Provider().StopStatus is %d, want a 4xx", p.StopStatus))
		}
	}
	if c.DeadLetters == nil {
		errs = append(errs, errors.New("DeadLetters is nil (want the consumer's store)"))
	}
	switch {
	case c.MaxBodyBytes < 0:
		errs = append(errs, fmt.Errorf("MaxBodyBytes is %d, want > 0", c.MaxBodyBytes))
	case c.MaxBodyBytes > int64(maxPayload):
		errs = append(errs, fmt.Errorf("MaxBodyBytes (%d) exceeds the consumer's MaxPayloadBytes (%d): a body read in full would still be refused", c.MaxBodyBytes, maxPayload))
	}
	if c.DeadLetterTimeout < 0 {
		errs = append(errs, fmt.Errorf("DeadLetterTimeout is %v, want > 0", c.DeadLetterTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemwebhook: config: %w", err)
	}
	return nil
}

// Handler is the webhook ingress, an http.Handler: it verifies each POST, runs it through the
// consumer's path (claim and handler in one transaction) and answers only after the outcome is
// durable. It is safe for concurrent use.
type Handler struct {
	cfg          Config
	provider     Provider
	consumer     string
	owner        string
	process      func(ctx context.Context, msg idem.Message) idem.Result
	policy       retry.Policy
	rand         retry.Rand
	now          func() time.Time
	redactor     *idemredact.Redactor
	observer     idem.Observer
	pauseOnPanic bool
}

var _ http.Handler = (*Handler)(nil)

// New returns the ingress for consumer. The consumer's retry policy sets Retry-After, its
// redaction masks dead-letter errors, its Observer counts deliveries, and its Logger is the
// default one. The consumer needs no Authenticator: the Verifier is its authenticator.
func New[TTx any](consumer *idem.Consumer[TTx], cfg Config) (*Handler, error) {
	if consumer == nil {
		return nil, errors.New("idemwebhook: New: consumer is nil")
	}
	cc := consumer.Config()
	cfg = cfg.WithDefaults()
	if cfg.Logger == nil {
		cfg.Logger = cc.Observe.Logger
	}
	if err := cfg.validate(cc.Input.MaxPayloadBytes); err != nil {
		return nil, err
	}
	p := cfg.Verifier.Provider()
	p.Headers = append([]string(nil), p.Headers...)
	return &Handler{
		cfg:          cfg,
		provider:     p,
		consumer:     consumer.Name(),
		owner:        cc.Owner,
		process:      consumer.Process,
		policy:       cc.Failure.Retry,
		rand:         cc.Failure.Rand,
		now:          cc.Now,
		redactor:     idemredact.New(cc.Failure.Redact),
		observer:     cc.Observe.Observer,
		pauseOnPanic: cc.Failure.OnPanic == idem.PanicPause,
	}, nil
}

// delivery is what the handler knows about one request while it settles it.
type delivery struct {
	start time.Time
	msg   idem.Message
	ev    idem.Observation
}

// ServeHTTP settles one delivery:
//
//	200  processed (committed) or duplicate (applied before)
//	503  transient failure, with Retry-After; nothing was claimed
//	401  signature missing, malformed, stale or from an unknown key, or no valid tenant; not stored
//	413  body over MaxBodyBytes (refused before it could be verified); not stored
//	4xx  (the provider's StopStatus) refused for good: invalid_payload, permanent_error,
//	     key_reuse, too_old, handler_panic or retries_exhausted, dead-lettered
//	405  not a POST
//
// Error bodies are application/problem+json. A dead letter that cannot be written turns any
// refusal into a 503, so the provider keeps the delivery and nothing is lost.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d := &delivery{start: h.now()}
	d.ev = idem.Observation{Consumer: h.consumer, Owner: h.owner, Queue: h.cfg.Source, Attempt: 1}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeProblem(w, Problem{Status: http.StatusMethodNotAllowed, Detail: "webhook deliveries are POSTed", Provider: h.provider.Name}, nil)
		return
	}

	body, err := h.readBody(w, r)
	if err != nil {
		var tooBig *http.MaxBytesError
		if !errors.As(err, &tooBig) {
			h.log(r.Context(), slog.LevelWarn, "idemwebhook: body not read", d, "", err)
			writeProblem(w, Problem{Status: http.StatusBadRequest, Detail: "the body could not be read", Provider: h.provider.Name}, nil)
			return
		}
		// Verify sees no body: it can only name the event the request claims, and nothing about
		// the request is verified, so it is refused like a bad signature: counted, not stored.
		claimed, _ := h.cfg.Verifier.Verify(r, nil)
		derr := fmt.Errorf("%w: body exceeds %d bytes (Config.MaxBodyBytes)", idem.ErrInvalidPayload, h.cfg.MaxBodyBytes)
		h.refuseUnverified(w, r, d, boundID(claimed.EventID), idem.ReasonInvalidPayload, derr, http.StatusRequestEntityTooLarge,
			"idemwebhook: body over the limit refused before verification; nothing was stored",
			fmt.Sprintf("the body exceeds the limit of this endpoint (%d bytes); nothing was stored", h.cfg.MaxBodyBytes))
		return
	}

	v, err := h.cfg.Verifier.Verify(r, body)
	genuine := err == nil || errors.Is(err, idem.ErrInvalidPayload) && !errors.Is(err, idem.ErrUnauthenticated)
	if genuine {
		if terr := checkTenant(v.Tenant); terr != nil {
			// A verifier (a custom one) that names no usable tenant has not said whose
			// delivery this is: nothing downstream may run under a guessed one.
			genuine, err = false, terr
		}
	}
	if !genuine {
		if !errors.Is(err, idem.ErrUnauthenticated) {
			err = fmt.Errorf("%w: %w", idem.ErrUnauthenticated, err)
		}
		w.Header().Set("WWW-Authenticate", fmt.Sprintf("Signature realm=%q", h.provider.Name))
		h.refuseUnverified(w, r, d, boundID(v.EventID), idem.ReasonUnauthenticated, err, http.StatusUnauthorized,
			"idemwebhook: signature refused; nothing was stored", unauthenticatedDetail(err))
		return
	}
	if err != nil {
		// Genuine, but not an event: it belongs to the verified tenant.
		d.msg = h.message(r, body, boundID(v.EventID), v.Tenant, v.Type, v.Attempt, false)
		h.refuse(w, r, d, idem.ReasonInvalidPayload, err, h.provider.StopStatus, h.provider.StopHeaders, bounded(err.Error()))
		return
	}
	if err := checkEventID(v.EventID, "the verified event id"); err != nil {
		d.msg = h.message(r, body, boundID(v.EventID), v.Tenant, v.Type, v.Attempt, false)
		h.refuse(w, r, d, idem.ReasonInvalidPayload, err, h.provider.StopStatus, h.provider.StopHeaders, bounded(err.Error()))
		return
	}

	d.msg = h.message(r, body, v.EventID, v.Tenant, v.Type, v.Attempt, v.Replay)
	d.msg.OccurredAt = v.OccurredAt
	res := h.process(r.Context(), d.msg)
	err = res.Err
	h.settle(w, r, d, res, err)
}

// settle answers the consumer's verdict on a verified delivery.
func (h *Handler) settle(w http.ResponseWriter, r *http.Request, d *delivery, res idem.Result, err error) {
	ctx := r.Context()
	d.ev.Tenant = d.msg.Tenant
	if err == nil {
		d.ev.Outcome = res.Outcome
		if res.Outcome == idem.OutcomeIgnored {
			d.ev.Reason = res.Reason
		}
		h.observe(d)
		h.log(ctx, slog.LevelDebug, "idemwebhook: delivery settled", d, "", nil)
		writeJSON(w, "application/json", http.StatusOK, Answer{EventID: d.msg.EventID, Outcome: string(res.Outcome)})
		return
	}
	d.ev.Class = res.Class
	if ctx.Err() != nil {
		// The provider hung up and the transaction rolled back with the request's context: no
		// verdict on the event (it may fail only because of the cancellation), and the provider
		// sends it again.
		d.ev.Outcome = idem.OutcomeAbandoned
		h.observe(d)
		h.log(ctx, slog.LevelWarn, "idemwebhook: request ended before the delivery settled", d, "", err)
		h.retryLater(w, d, h.policy.Backoff(d.msg.Attempt, h.rand), "the request ended before the delivery settled; send it again")
		return
	}
	fp := res.Fingerprint
	switch {
	case res.Outcome == idem.OutcomeKeyReuse:
		h.refuseFP(w, r, d, idem.ReasonKeyReuse, err, fp, h.provider.StopStatus, h.provider.StopHeaders,
			"the event id was used before for other content; nothing was applied and the delivery was dead-lettered")
		return
	case res.Class == idem.ClassPermanent && res.Reason == idem.ReasonHandlerPanic && h.pauseOnPanic:
		// The consumer pauses on a handler bug rather than drain events into the dead-letter
		// queue; over HTTP the provider keeps the event and sends it again.
		h.log(ctx, slog.LevelError, "idemwebhook: handler panic; leaving the delivery with the provider (OnPanic is PanicPause)", d, "", err)
	case res.Class == idem.ClassPermanent:
		reason := res.Reason
		if reason == "" {
			reason = idem.ReasonPermanentError
		}
		status, headers := h.provider.StopStatus, h.provider.StopHeaders
		if reason == idem.ReasonUnauthenticated {
			status, headers = http.StatusUnauthorized, nil
		}
		h.refuseFP(w, r, d, reason, err, fp, status, headers,
			fmt.Sprintf("the event was refused for good (%s) and dead-lettered; sending it again changes nothing", reason))
		return
	}

	hint, _ := idem.RetryHint(err)
	verdict := h.policy.Decide(retry.Input{Attempt: d.msg.Attempt, FirstAt: d.start, Now: h.now(), Hint: hint}, h.rand)
	if !verdict.Retry {
		h.refuseFP(w, r, d, idem.ReasonRetriesExhausted, err, fp, h.provider.StopStatus, h.provider.StopHeaders,
			"the retry budget is spent; the event was dead-lettered")
		return
	}
	d.ev.Outcome, d.ev.Delay = idem.OutcomeRetried, verdict.Delay
	h.observe(d)
	h.log(ctx, slog.LevelInfo, "idemwebhook: transient failure; asking the provider to retry", d, "", err)
	h.retryLater(w, d, verdict.Delay, "a transient failure; nothing was applied, send it again")
}

// retryLater answers 503 with Retry-After in whole seconds (at least 1).
func (h *Handler) retryLater(w http.ResponseWriter, d *delivery, delay time.Duration, detail string) {
	secs := int64((delay + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	writeProblem(w, Problem{Status: http.StatusServiceUnavailable, Detail: detail, Reason: "retry", EventID: d.msg.EventID, Provider: h.provider.Name}, nil)
}

// refuseUnverified answers a delivery refused before anything in it was verified (a signature
// that did not verify, a body too large to verify): status, counted (outcome failed, the reason,
// no tenant) and logged with text and its claimed event id, never its body, and never stored.
// Anyone can send such a request, so storing each would let anyone fill the dead-letter store;
// the provider keeps a genuine delivery it sees refused and sends it again (after a key is fixed,
// or to a larger limit), so nothing is lost.
func (h *Handler) refuseUnverified(w http.ResponseWriter, r *http.Request, d *delivery, claimedID string, reason idem.Reason, err error, status int, text, detail string) {
	d.msg = idem.Message{EventID: claimedID, Attempt: 1}
	d.ev.Outcome, d.ev.Reason, d.ev.Class = idem.OutcomeFailed, reason, idem.ClassPermanent
	h.observe(d)
	h.log(r.Context(), slog.LevelWarn, text, d, reason, fmt.Errorf("idemwebhook: %s: %w (claimed event %q)", h.provider.Name, err, claimedID))
	writeProblem(w, Problem{Status: status, Detail: detail, Reason: string(reason), EventID: claimedID, Provider: h.provider.Name}, nil)
}

// checkTenant refuses the tenant of a verified delivery that is empty or not a valid identity.
func checkTenant(tenant string) error {
	if tenant == "" {
		return fmt.Errorf("%w: %w: the verifier named no tenant for the delivery", idem.ErrUnauthenticated, ErrNoTenant)
	}
	if err := idemtype.ValidateField(idemtype.FieldTenant, tenant); err != nil {
		return fmt.Errorf("%w: %w: the verifier's tenant: %w", idem.ErrUnauthenticated, ErrNoTenant, err)
	}
	return nil
}

// refuse dead-letters a delivery rejected before the consumer saw it (its fingerprint is over
// the raw body, as the consumer's runtime does for such rejections) and answers status.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, d *delivery, reason idem.Reason, err error, status int, headers map[string]string, detail string) {
	// The consumer adds the event id to its own errors; these never went through it.
	err = fmt.Errorf("idemwebhook: %s: %w (event %q)", h.provider.Name, err, d.msg.EventID)
	d.ev.Class = idem.ClassPermanent
	h.refuseFP(w, r, d, reason, err, rawFingerprint(d.msg), status, headers, detail)
}

// refuseFP writes the dead letter and answers status, or 503 when the dead letter could not be
// written: the provider then keeps the delivery.
func (h *Handler) refuseFP(w http.ResponseWriter, r *http.Request, d *delivery, reason idem.Reason, err error, fp idem.Fingerprint, status int, headers map[string]string, detail string) {
	if fp.IsZero() {
		fp = rawFingerprint(d.msg)
	}
	now := h.now()
	dl := idem.DeadLetter{
		Consumer:    h.consumer,
		Message:     d.msg,
		Fingerprint: fp,
		Reason:      reason,
		Error:       h.redactor.Text(err.Error()),
		Attempts:    d.msg.Attempt,
		FirstFailed: now,
		LastFailed:  now,
		Status:      idem.DeadLetterPending,
		Source:      h.cfg.Source,
		Owner:       h.owner,
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.DeadLetterTimeout)
	defer cancel()
	d.ev.Tenant = d.msg.Tenant
	if _, werr := h.cfg.DeadLetters.InsertDeadLetter(ctx, dl); werr != nil {
		delay := h.policy.Backoff(d.msg.Attempt, h.rand)
		d.ev.Outcome, d.ev.Class, d.ev.Delay = idem.OutcomeRetried, idem.ClassTransient, delay
		h.observe(d)
		h.log(r.Context(), slog.LevelError, "idemwebhook: dead letter not written; asking the provider to retry", d, reason,
			fmt.Errorf("write dead letter (%s: %v): %w", reason, h.redactor.Text(err.Error()), werr))
		w.Header().Del("WWW-Authenticate")
		h.retryLater(w, d, delay, "the delivery could not be recorded; send it again")
		return
	}
	d.ev.Outcome, d.ev.Reason = idem.OutcomeDeadLettered, reason
	if d.ev.Class == idem.ClassUnknown {
		d.ev.Class = idem.ClassPermanent
	}
	h.observe(d)
	h.log(r.Context(), slog.LevelWarn, "idemwebhook: delivery dead-lettered", d, reason, err)
	writeProblem(w, Problem{Status: status, Detail: detail, Reason: string(reason), EventID: d.msg.EventID, Provider: h.provider.Name}, headers)
}

// readBody reads the whole body, at most MaxBodyBytes; a larger one fails with
// *http.MaxBytesError before it is read in full when Content-Length announces it.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.ContentLength > h.cfg.MaxBodyBytes {
		return nil, &http.MaxBytesError{Limit: h.cfg.MaxBodyBytes}
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
}

// message builds the idem.Message of a delivery: the kept request headers (bounded) and the
// provider's name, the body as payload. The Idem-Replay-* headers are kept only when replay is
// true (a replay signature covering them verified): the core reads them (the original event time
// decides a too_old dead letter, Idem-Replay-Of marks a dead letter recovered), so unsigned ones
// must not reach it.
func (h *Handler) message(r *http.Request, body []byte, eventID, tenant, typ string, attempt int, replay bool) idem.Message {
	headers := map[string]string{HeaderProvider: h.provider.Name}
	for _, name := range h.provider.Headers {
		v := r.Header.Get(name)
		if v == "" || !replay && strings.HasPrefix(http.CanonicalHeaderKey(name), wire.ReplayPrefix) {
			continue
		}
		if len(v) > maxKeptHeaderLen {
			v = v[:maxKeptHeaderLen]
		}
		headers[http.CanonicalHeaderKey(name)] = strings.ToValidUTF8(v, "\uFFFD")
	}
	return idem.Message{
		EventID: eventID,
		Tenant:  tenant,
		Type:    typ,
		Payload: body,
		Headers: headers,
		Attempt: max(attempt, 1),
	}
}

// observe reports the settled delivery to the consumer's Observer.
func (h *Handler) observe(d *delivery) {
	if h.observer == nil {
		return
	}
	d.ev.EventID, d.ev.Attempt = d.msg.EventID, d.msg.Attempt
	d.ev.Duration = h.now().Sub(d.start)
	h.observer.Observe(d.ev)
}

// log writes one line with idem's stable fields.
func (h *Handler) log(ctx context.Context, level slog.Level, text string, d *delivery, reason idem.Reason, err error) {
	if !h.cfg.Logger.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{
		slog.String("event_id", d.msg.EventID),
		slog.String("tenant", d.msg.Tenant),
		slog.String("consumer", h.consumer),
		slog.String("queue", h.cfg.Source),
		slog.String("provider", h.provider.Name),
		slog.Int("attempt", d.msg.Attempt),
		slog.Float64("duration_ms", float64(h.now().Sub(d.start).Microseconds())/1000),
	}
	if d.ev.Outcome != "" {
		attrs = append(attrs, slog.String("outcome", string(d.ev.Outcome)))
	}
	if reason != "" {
		attrs = append(attrs, slog.String("reason", string(reason)))
	}
	if err != nil {
		attrs = append(attrs, slog.String("error_type", d.ev.Class.String()), slog.String("error", h.redactor.Text(err.Error())))
	}
	if d.ev.Delay > 0 {
		attrs = append(attrs, slog.String("retry_in", d.ev.Delay.String()))
	}
	h.cfg.Logger.LogAttrs(ctx, level, text, attrs...)
}

// refusals are the reasons a sender may learn from a 401: a legitimate sender with a skewed
// clock or a rotated key can act on them, and they say nothing about the keys held.
var refusals = []error{ErrNotSigned, ErrMalformedSignature, ErrBadSignature, ErrStaleSignature, ErrClaimMismatch, ErrNoTenant,
	idemauth.ErrNotSigned, idemauth.ErrMalformedSignature, idemauth.ErrUnknownKey, idemauth.ErrBadSignature,
	idemauth.ErrKeyExpired, idemauth.ErrStaleSignature, idemauth.ErrTenantMismatch, idemauth.ErrVersionRetired}

// unauthenticatedDetail is the problem detail of a refused signature: its reason only, without
// the verifier's detail (which may count keys or quote claims; the dead letter keeps it).
func unauthenticatedDetail(err error) string {
	for _, r := range refusals {
		if errors.Is(err, r) {
			return "signature verification failed: " + r.Error()
		}
	}
	return "signature verification failed"
}

// bounded shortens a verifier's error for a problem body.
func bounded(s string) string {
	if len(s) <= maxDetailLen {
		return s
	}
	return strings.ToValidUTF8(s[:maxDetailLen], "") + "…"
}

// rawFingerprint is the fingerprint of a delivery rejected before the consumer computed one: the
// core's, with Raw so that a body that is not JSON still hashes (Replayer accepts such dead
// letters as unedited, and two different rejected requests never share a pending dead letter).
func rawFingerprint(msg idem.Message) idem.Fingerprint {
	fp, _ := idem.ComputeFingerprint(msg, idem.FingerprintConfig{Raw: true}) // Raw hashes anything
	return fp
}
