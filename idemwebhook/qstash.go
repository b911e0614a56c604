package idemwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// QStash's webhook headers.
const (
	// HeaderQStashSignature carries the JWT QStash signs every delivery with.
	HeaderQStashSignature = "Upstash-Signature"
	// HeaderQStashMessageID carries the message id, kept across retries: the event id.
	HeaderQStashMessageID = "Upstash-Message-Id"
	// HeaderQStashRetried counts earlier attempts (0 on the first).
	HeaderQStashRetried = "Upstash-Retried"
	// HeaderQStashNonRetryable, with status 489, tells QStash to stop retrying and move the
	// message to its own dead-letter queue.
	HeaderQStashNonRetryable = "Upstash-NonRetryable-Error"
)

// QStash defaults and bounds.
const (
	// QStashIssuer is the iss claim of every QStash token.
	QStashIssuer = "Upstash"
	// QStashClockSkewDefault is how far exp and nbf may be missed by, for clocks that disagree.
	QStashClockSkewDefault = 30 * time.Second
	// QStashStopStatus is the status that, with Upstash-NonRetryable-Error: true, stops QStash's
	// retries.
	QStashStopStatus = 489
	// maxQStashTokenLen bounds the token ParseQStashToken reads (a real one is about 450 bytes).
	maxQStashTokenLen = 4096
)

// QStashClaims are the claims of a QStash token.
type QStashClaims struct {
	// Issuer is always "Upstash".
	Issuer string `json:"iss"`
	// Subject is the destination URL the token was made for.
	Subject string `json:"sub"`
	// Expires, NotBefore and IssuedAt are unix seconds; a token lives 5 minutes by default.
	Expires   int64 `json:"exp"`
	NotBefore int64 `json:"nbf"`
	IssuedAt  int64 `json:"iat"`
	// ID is the token's own id, new for every attempt (not the message id).
	ID string `json:"jti"`
	// Body is base64url of the SHA-256 of the body (QStash writes it with padding).
	Body string `json:"body"`
}

// QStashToken is a parsed, not yet verified, QStash JWT.
type QStashToken struct {
	// SigningInput is "<header>.<claims>" as received: what the MAC covers.
	SigningInput string
	// MAC is the decoded signature.
	MAC [sha256.Size]byte
	// Claims are the decoded claims (unverified until the MAC is checked).
	Claims QStashClaims
}

// ParseQStashToken parses an Upstash-Signature value: a compact JWT whose header says
// {"alg":"HS256"} (typ, when present, "JWT"), whose claims are a JSON object, and whose
// signature is 32 bytes, all base64url without padding. It never panics and reads at most 4096
// bytes; its errors wrap ErrMalformedSignature and quote only a bounded part of the input.
func ParseQStashToken(token string) (QStashToken, error) {
	t, err := parseQStashToken(token)
	if err != nil {
		return QStashToken{}, fmt.Errorf("%w: %w", ErrMalformedSignature, err)
	}
	return t, nil
}

func parseQStashToken(token string) (QStashToken, error) {
	var t QStashToken
	if token == "" {
		return t, errors.New("token is empty")
	}
	if len(token) > maxQStashTokenLen {
		return t, fmt.Errorf("token is %d bytes, limit %d", len(token), maxQStashTokenLen)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return t, fmt.Errorf("token has %d parts, want 3 (header.claims.signature)", len(parts))
	}
	dec := base64.RawURLEncoding.Strict()
	hdrJSON, err := dec.DecodeString(parts[0])
	if err != nil {
		return t, errors.New("header is not base64url")
	}
	var hdr struct {
		Alg string `json:"alg"`
		Typ string `json:"typ"`
	}
	if err := json.Unmarshal(hdrJSON, &hdr); err != nil {
		return t, errors.New("header is not a JSON object")
	}
	if hdr.Alg != "HS256" {
		return t, fmt.Errorf("alg %s, want HS256", quoteTrunc(hdr.Alg))
	}
	if hdr.Typ != "" && hdr.Typ != "JWT" {
		return t, fmt.Errorf("typ %s, want JWT", quoteTrunc(hdr.Typ))
	}
	claimsJSON, err := dec.DecodeString(parts[1])
	if err != nil {
		return t, errors.New("claims are not base64url")
	}
	if err := json.Unmarshal(claimsJSON, &t.Claims); err != nil {
		return t, errors.New("claims are not a JSON object of the expected fields")
	}
	mac, err := dec.DecodeString(parts[2])
	if err != nil || len(mac) != sha256.Size {
		return t, errors.New("signature is not 32 bytes of base64url")
	}
	copy(t.MAC[:], mac)
	t.SigningInput = parts[0] + "." + parts[1]
	return t, nil
}

// QStashConfig configures a QStash verifier.
type QStashConfig struct {
	// Secrets are the signing keys ("sig_…"), each with the tenant it speaks for (required): list
	// both the current and the next signing key of an account, so that a key rotation in the
	// console loses no delivery.
	Secrets []Secret
	// URL is the endpoint's public URL exactly as configured in QStash (required): the sub claim
	// must equal it, so a token made for another endpoint is refused.
	URL string
	// ClockSkew is how far exp and nbf may be missed by (default QStashClockSkewDefault).
	ClockSkew time.Duration
	// Now returns the current time (default time.Now).
	Now func() time.Time
}

// QStash verifies Upstash QStash's signature: Upstash-Signature is a JWT (HS256) signed with the
// current or the next signing key, whose claims bind the issuer ("Upstash"), the destination URL
// (sub), a validity window (nbf, exp) and the body (base64url SHA-256). The event id is the
// Upstash-Message-Id header and the attempt comes from Upstash-Retried.
type QStash struct {
	cfg QStashConfig
}

var _ Verifier = (*QStash)(nil)

// NewQStash validates cfg (after defaults) and returns the verifier; errors name the field.
func NewQStash(cfg QStashConfig) (*QStash, error) {
	if cfg.ClockSkew == 0 {
		cfg.ClockSkew = QStashClockSkewDefault
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	errs := validateSecrets(cfg.Secrets)
	if u, err := url.Parse(cfg.URL); cfg.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("URL %s: want the endpoint's absolute http or https URL as QStash calls it", quoteTrunc(cfg.URL)))
	}
	if cfg.ClockSkew < 0 {
		errs = append(errs, fmt.Errorf("ClockSkew is %v, want >= 0", cfg.ClockSkew))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idemwebhook: qstash config: %w", err)
	}
	cfg.Secrets = copySecrets(cfg.Secrets)
	return &QStash{cfg: cfg}, nil
}

// Provider describes QStash: 489 with Upstash-NonRetryable-Error: true stops its retries (the
// message then also lands in QStash's own dead-letter queue).
func (q *QStash) Provider() Provider {
	return Provider{
		Name:        "qstash",
		Headers:     []string{HeaderQStashSignature, HeaderQStashMessageID, HeaderQStashRetried, "Upstash-Schedule-Id", "Upstash-Caller-Ip", "Content-Type", "User-Agent"},
		StopStatus:  QStashStopStatus,
		StopHeaders: map[string]string{HeaderQStashNonRetryable: "true"},
	}
}

// Verify checks the token's MAC against every secret (in constant time each), then the issuer,
// the destination and the body hash, then the validity window; then reads the message id.
func (q *QStash) Verify(r *http.Request, body []byte) (Verified, error) {
	claimed := Verified{EventID: r.Header.Get(HeaderQStashMessageID)}
	header := r.Header.Get(HeaderQStashSignature)
	if header == "" {
		return claimed, refuse(ErrNotSigned, "(no %s header)", HeaderQStashSignature)
	}
	tok, err := ParseQStashToken(header)
	if err != nil {
		return claimed, refuse(err, "")
	}
	tenant, ok := "", false
	for _, sec := range q.cfg.Secrets {
		if hmac.Equal(tok.MAC[:], qstashMAC(sec.Key, tok.SigningInput)) && !ok {
			tenant, ok = sec.Tenant, true
		}
	}
	if !ok {
		return claimed, refuse(ErrBadSignature, "(matches neither of the %d signing keys): signed with another key, or changed after signing", len(q.cfg.Secrets))
	}
	c := tok.Claims
	sum := sha256.Sum256(body)
	wantBody := base64.RawURLEncoding.EncodeToString(sum[:])
	switch {
	case !hmac.Equal([]byte(c.Issuer), []byte(QStashIssuer)):
		return claimed, refuse(ErrClaimMismatch, "(iss %s, want %q)", quoteTrunc(c.Issuer), QStashIssuer)
	case !hmac.Equal([]byte(c.Subject), []byte(q.cfg.URL)):
		return claimed, refuse(ErrClaimMismatch, "(sub %s is not this endpoint's URL %q): a token made for another destination", quoteTrunc(c.Subject), q.cfg.URL)
	case !hmac.Equal([]byte(strings.TrimRight(c.Body, "=")), []byte(wantBody)):
		return claimed, refuse(ErrClaimMismatch, "(the body claim is not the SHA-256 of the body): the body was changed after signing")
	}
	now := q.cfg.Now()
	if c.Expires == 0 {
		return claimed, refuse(ErrStaleSignature, "(the token has no exp)")
	}
	if exp := time.Unix(c.Expires, 0); now.After(exp.Add(q.cfg.ClockSkew)) {
		return claimed, refuse(ErrStaleSignature, "(expired at %s, %v ago; clock skew allowed %v)", exp.UTC().Format(time.RFC3339), now.Sub(exp).Round(time.Second), q.cfg.ClockSkew)
	}
	if c.NotBefore != 0 {
		if nbf := time.Unix(c.NotBefore, 0); now.Add(q.cfg.ClockSkew).Before(nbf) {
			return claimed, refuse(ErrStaleSignature, "(not valid before %s, %v from now; clock skew allowed %v)", nbf.UTC().Format(time.RFC3339), nbf.Sub(now).Round(time.Second), q.cfg.ClockSkew)
		}
	}
	v := Verified{EventID: claimed.EventID, Tenant: tenant, Attempt: 1}
	if n, err := strconv.Atoi(r.Header.Get(HeaderQStashRetried)); err == nil && n >= 0 && n < 1<<20 {
		v.Attempt = n + 1
	}
	if err := checkEventID(v.EventID, "header "+HeaderQStashMessageID); err != nil {
		return v, err
	}
	return v, nil
}
