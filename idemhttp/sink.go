package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/wire"
)

// The sink implements idem.Sink; the compiler checks it here.
var _ idem.Sink = (*Sink)(nil)

// Header names the sink sends with every request. They are a contract with the receiving
// service, so they are constants rather than configuration (except the signature header).
const (
	// HeaderIdempotencyKey carries IdempotencyKey(tenant, event id). The destination must
	// deduplicate on it: the relay publishes at least once, so the same request can arrive twice.
	HeaderIdempotencyKey = wire.IdempotencyKey
	// HeaderEventID carries Message.EventID.
	HeaderEventID = wire.EventID
	// HeaderTenant carries Message.Tenant.
	HeaderTenant = wire.Tenant
	// HeaderType carries Message.Type.
	HeaderType = wire.Type
	// HeaderOccurredAt carries Message.OccurredAt (RFC 3339 with nanoseconds, UTC) when known.
	HeaderOccurredAt = wire.OccurredAt
)

// Defaults for SinkConfig.
const (
	// SignatureHeaderDefault is the header that carries the HMAC signature. It is not
	// idemauth's Idem-Signature: the HTTP signature covers another input (the request) in
	// another format ("h1"), and the two must never be mistaken for one another.
	SignatureHeaderDefault = wire.HTTPSignature
	// TimeoutDefault bounds one request of the default client, so that a destination that never
	// answers costs one retry rather than a stuck relay.
	TimeoutDefault = 10 * time.Second
)

// errorBodyLen is how much of a failed response's body goes into the error (after redaction).
const errorBodyLen = 200

// drainLen bounds how much of a response body is read and discarded so that the connection can
// be reused; a larger body closes the connection instead.
const drainLen = 64 << 10

// SinkConfig configures an HTTP Sink. Exactly one of URL and BaseURL must be set.
type SinkConfig struct {
	// URL maps a topic to the URL its events are POSTed to. It wins over BaseURL; an error it
	// returns is permanent (the event is dead-lettered, naming the topic).
	URL func(topic string) (string, error)
	// BaseURL is the prefix a path-escaped topic is appended to, with one '/' between:
	// BaseURL "https://hooks.example.com/idem" and topic "payments.captured" POST to
	// "https://hooks.example.com/idem/payments.captured".
	BaseURL string
	// Client sends the requests (default: a client with Timeout TimeoutDefault). Redirects are
	// never followed, with this client or a caller's (the sink uses a copy of it whose
	// CheckRedirect refuses): a 307 to another origin would hand it the body, the signature and
	// the idempotency key, and a 301/302/303 would turn the POST into a GET. A redirect is a
	// permanent error naming the status.
	Client *http.Client
	// Secret is the HMAC-SHA256 key requests are signed with, at least SecretMinBytes random
	// bytes. Empty means no signature header:
	// only acceptable when the channel is authenticated some other way (mTLS, a private network).
	Secret []byte
	// KeyID is sent as kid in the signature header so that the receiver can pick the key, which
	// makes rotating Secret possible without downtime.
	KeyID string
	// SignatureHeader names the signature header (default SignatureHeaderDefault).
	SignatureHeader string
	// Now returns the current time, used for the signature timestamp and HTTP-date Retry-After
	// hints (default time.Now).
	Now func() time.Time
}

// WithDefaults returns a copy of c with its zero fields set to their defaults.
func (c SinkConfig) WithDefaults() SinkConfig {
	if c.Client == nil {
		c.Client = &http.Client{Timeout: TimeoutDefault}
	}
	if c.SignatureHeader == "" {
		c.SignatureHeader = SignatureHeaderDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports every invalid field of a config that WithDefaults filled in.
func (c SinkConfig) validate() error {
	var errs []error
	switch {
	case c.URL == nil && c.BaseURL == "":
		errs = append(errs, errors.New("URL and BaseURL are both empty (set one: where do events go?)"))
	case c.URL != nil && c.BaseURL != "":
		errs = append(errs, errors.New("URL and BaseURL are both set (set one)"))
	case c.BaseURL != "":
		u, err := url.Parse(c.BaseURL)
		if err != nil {
			errs = append(errs, fmt.Errorf("BaseURL %q: %s", idemredact.URL(c.BaseURL), idemredact.URLError(err)))
		} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("BaseURL %q: want an absolute http or https URL", idemredact.URL(c.BaseURL)))
		}
	}
	if !validHeaderName(c.SignatureHeader) {
		errs = append(errs, fmt.Errorf("SignatureHeader %q is not a valid HTTP header name", c.SignatureHeader))
	}
	if strings.ContainsAny(c.KeyID, ",= \t\r\n") {
		errs = append(errs, fmt.Errorf("KeyID %q contains ',', '=' or blanks, which the signature header cannot carry", c.KeyID))
	}
	if len(c.Secret) > 0 && len(c.Secret) < SecretMinBytes {
		errs = append(errs, fmt.Errorf("Secret has %d bytes, want at least %d random bytes", len(c.Secret), SecretMinBytes))
	}
	if len(c.Secret) == 0 && c.KeyID != "" {
		errs = append(errs, fmt.Errorf("KeyID is %q but Secret is empty: nothing would be signed", c.KeyID))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("idemhttp: sink config: %w", errors.Join(errs...))
}

// Sink publishes events as HTTP POST requests to an external service: the relay's way of running
// an external effect outside the producer's transaction. Each request carries an Idempotency-Key
// the destination deduplicates on, because the relay may send the same event twice. A Sink is
// safe for concurrent use.
type Sink struct {
	cfg      SinkConfig
	redactor *idemredact.Redactor
	// ownClient is true when the sink built its client and may close its idle connections.
	ownClient bool
}

// NewSink validates cfg (after WithDefaults) and returns a sink.
func NewSink(cfg SinkConfig) (*Sink, error) {
	own := cfg.Client == nil
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	// A copy, so the caller's client keeps its own redirect policy elsewhere.
	client := *cfg.Client
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	cfg.Client = &client
	return &Sink{cfg: cfg, redactor: idemredact.New(idemredact.Config{}), ownClient: own}, nil
}

// Close closes the idle connections of the client the sink built; a client passed in the config
// belongs to the caller and is left alone.
func (s *Sink) Close() error {
	if s.ownClient {
		s.cfg.Client.CloseIdleConnections()
	}
	return nil
}

// Publish POSTs each message, in order, to the topic's URL and returns at the first failure,
// classified for the relay: 2xx is success; 429 and 503 are transient with the Retry-After hint
// (delta-seconds or HTTP-date) when there is one; 408, other 5xx, network errors and timeouts are
// transient; any other status (4xx, an unfollowed redirect) is permanent. Messages before the
// failing one were delivered; the relay may send them again, which the Idempotency-Key makes
// harmless.
func (s *Sink) Publish(ctx context.Context, topic string, msgs ...idem.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	target, err := s.url(topic)
	if err != nil {
		return idem.Permanent(fmt.Errorf("idemhttp: event %s: %w", msgs[0].EventID, err))
	}
	for _, m := range msgs {
		if err := s.post(ctx, target, m); err != nil {
			return err
		}
	}
	return nil
}

// url resolves the destination of topic.
func (s *Sink) url(topic string) (string, error) {
	if s.cfg.URL != nil {
		u, err := s.cfg.URL(topic)
		if err != nil {
			return "", fmt.Errorf("URL for topic %q: %w", topic, err)
		}
		if u == "" {
			return "", fmt.Errorf("URL for topic %q is empty", topic)
		}
		return u, nil
	}
	if topic == "" {
		return "", errors.New("topic is empty")
	}
	return strings.TrimRight(s.cfg.BaseURL, "/") + "/" + url.PathEscape(topic), nil
}

// post sends one message and classifies the outcome.
func (s *Sink) post(ctx context.Context, target string, m idem.Message) error {
	shown := s.redactor.Text(target)
	if m.EventID == "" {
		return idem.Permanent(fmt.Errorf("idemhttp: message (type %q) to %s has no event id: the destination could not deduplicate it", m.Type, shown))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(m.Payload))
	if err != nil {
		return idem.Permanent(fmt.Errorf("idemhttp: event %s: POST %s: %w", m.EventID, shown, err))
	}
	if err := s.setHeaders(req, m); err != nil {
		return idem.Permanent(fmt.Errorf("idemhttp: event %s: POST %s: %w", m.EventID, shown, err))
	}
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		err = fmt.Errorf("idemhttp: event %s: POST %s: %w", m.EventID, shown, err)
		if ctx.Err() != nil {
			return err // the caller gave up; its own context says why
		}
		// Network errors and client timeouts: the destination may recover.
		return idem.Transient(err)
	}
	defer func() {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLen))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	head, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLen))
	err = fmt.Errorf("idemhttp: event %s: POST %s: status %d: %s",
		m.EventID, shown, resp.StatusCode, s.redactor.Text(string(head)))
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), s.cfg.Now()); ok {
			return idem.RetryAfter(err, d)
		}
		return idem.Transient(err)
	case code == http.StatusRequestTimeout || code >= 500:
		return idem.Transient(err)
	default:
		return idem.Permanent(err)
	}
}

// setHeaders writes the message's own headers first and the sink's after, so that a message
// header can neither forge the idempotency key nor the signature, and signs the request last.
func (s *Sink) setHeaders(req *http.Request, m idem.Message) error {
	h := req.Header
	for k, v := range m.Headers {
		if !validHeaderName(k) {
			return fmt.Errorf("header name %q is not a valid HTTP header name", k)
		}
		if !validHeaderValue(v) {
			return fmt.Errorf("header %q has a value with control characters", k)
		}
		h.Set(k, v)
	}
	if h.Get("Content-Type") == "" {
		if json.Valid(m.Payload) {
			h.Set("Content-Type", "application/json")
		} else {
			h.Set("Content-Type", "application/octet-stream")
		}
	}
	for _, kv := range [][2]string{
		{HeaderIdempotencyKey, IdempotencyKey(m.Tenant, m.EventID)},
		{HeaderEventID, m.EventID},
		{HeaderTenant, m.Tenant},
		{HeaderType, m.Type},
	} {
		if !validHeaderValue(kv[1]) {
			return fmt.Errorf("%s %q has control characters", kv[0], kv[1])
		}
		if kv[1] == "" {
			h.Del(kv[0]) // an absent tenant or type is not sent, and not forged either
			continue
		}
		h.Set(kv[0], kv[1])
	}
	h.Del(HeaderOccurredAt)
	if !m.OccurredAt.IsZero() {
		h.Set(HeaderOccurredAt, m.OccurredAt.UTC().Format(time.RFC3339Nano))
	}
	h.Del(s.cfg.SignatureHeader)
	if len(s.cfg.Secret) > 0 {
		h.Set(s.cfg.SignatureHeader, Sign(s.cfg.Secret, s.cfg.KeyID, s.cfg.Now(), RequestOf(req, m.Payload)))
	}
	return nil
}

// retryAfter parses a Retry-After value: delta-seconds or an HTTP-date relative to now. It
// reports false for a missing or malformed value and for a date not in the future.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n <= 0 {
			return 0, false
		}
		// Bound absurd values so the multiplication cannot overflow; the retry budget refuses
		// anything this long anyway.
		n = min(n, int64(365*24*time.Hour/time.Second))
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, false
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validHeaderValue refuses control characters (CR, LF, NUL…) that would split or corrupt the
// request; horizontal tab is allowed.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
