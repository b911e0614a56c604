package idemwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderStripeSignature carries Stripe's signature: "t=<unix>,v1=<hex>[,v1=<hex>…]".
const HeaderStripeSignature = "Stripe-Signature"

// Bounds of the Stripe-style header.
const (
	// StripeToleranceDefault is how old (or how far in the future) a signature's t may be: the
	// default of Stripe's own libraries.
	StripeToleranceDefault = 5 * time.Minute
	// maxStripeHeaderLen bounds the header ParseStripeSignature reads (a real one with two v1
	// and a v0 is under 250 bytes).
	maxStripeHeaderLen = 2048
	// maxStripeV1 bounds how many v1 signatures are compared: Stripe sends one per active
	// endpoint secret, two during a roll.
	maxStripeV1 = 8
)

// StripeSignature is a parsed Stripe-Signature header.
type StripeSignature struct {
	// Timestamp is t, when Stripe signed.
	Timestamp time.Time
	// V1 holds every v1 signature (HMAC-SHA256), in header order.
	V1 [][sha256.Size]byte
}

// ParseStripeSignature parses a Stripe-Signature header: comma-separated key=value fields with
// exactly one t (decimal unix seconds, no sign, no leading zero) and one to eight v1 (64 hex
// digits each); other fields (v0, the test-mode scheme) are ignored. It never panics and reads
// at most 2048 bytes; its errors wrap ErrMalformedSignature and quote only a bounded part of the
// input.
func ParseStripeSignature(header string) (StripeSignature, error) {
	s, err := parseStripeSignature(header)
	if err != nil {
		return StripeSignature{}, fmt.Errorf("%w: %w", ErrMalformedSignature, err)
	}
	return s, nil
}

func parseStripeSignature(header string) (StripeSignature, error) {
	var s StripeSignature
	if header == "" {
		return s, errors.New("header is empty")
	}
	if len(header) > maxStripeHeaderLen {
		return s, fmt.Errorf("header is %d bytes, limit %d", len(header), maxStripeHeaderLen)
	}
	haveT := false
	for i, f := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok || k == "" {
			return s, fmt.Errorf("field %d %s is not key=value", i+1, quoteTrunc(f))
		}
		switch k {
		case "t":
			if haveT {
				return s, errors.New("field t appears twice")
			}
			haveT = true
			unix, err := parseUnix(v)
			if err != nil {
				return s, fmt.Errorf("t %s %w", quoteTrunc(v), err)
			}
			s.Timestamp = time.Unix(unix, 0).UTC()
		case "v1":
			if len(s.V1) == maxStripeV1 {
				return s, fmt.Errorf("more than %d v1 signatures", maxStripeV1)
			}
			var mac [sha256.Size]byte
			if len(v) != hex.EncodedLen(sha256.Size) {
				return s, fmt.Errorf("v1 has %d characters, want %d hex digits", len(v), hex.EncodedLen(sha256.Size))
			}
			if _, err := hex.Decode(mac[:], []byte(v)); err != nil {
				return s, errors.New("v1 is not hex")
			}
			s.V1 = append(s.V1, mac)
		}
	}
	switch {
	case !haveT:
		return s, errors.New("field t is missing")
	case len(s.V1) == 0:
		return s, errors.New("field v1 is missing")
	}
	return s, nil
}

// maxUnix is the last second of the year 9999: timestamps have at most 12 digits.
const maxUnix = 253402300799

// parseUnix parses unix seconds: digits only, no leading zero, at most the year 9999.
func parseUnix(v string) (int64, error) {
	if v == "" || len(v) > 12 {
		return 0, errors.New("is not unix seconds (1 to 12 digits)")
	}
	if len(v) > 1 && v[0] == '0' {
		return 0, errors.New("has a leading zero")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("is not unix seconds (digits only)")
	}
	if n > maxUnix {
		return 0, errors.New("is after the year 9999")
	}
	return n, nil
}

// StripeConfig configures a Stripe verifier.
type StripeConfig struct {
	// Secrets are the endpoint signing secrets ("whsec_…"), each with the tenant it speaks for
	// (required). During a roll, list the old and the new secret for the same tenant.
	Secrets []Secret
	// Tolerance is how far t may lie from now, in either direction (default
	// StripeToleranceDefault).
	Tolerance time.Duration
	// Now returns the current time (default time.Now).
	Now func() time.Time
}

// Stripe verifies Stripe's webhook signature (and any provider that copies its scheme): v1 is
// HMAC-SHA256 under the endpoint secret of "<t>.<body>". The event id, type and creation time
// come from the signed JSON body ("id", "type", "created").
type Stripe struct {
	cfg StripeConfig
}

var _ Verifier = (*Stripe)(nil)

// NewStripe validates cfg (after defaults) and returns the verifier; errors name the field.
func NewStripe(cfg StripeConfig) (*Stripe, error) {
	if cfg.Tolerance == 0 {
		cfg.Tolerance = StripeToleranceDefault
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	errs := validateSecrets(cfg.Secrets)
	if cfg.Tolerance < 0 {
		errs = append(errs, fmt.Errorf("Tolerance is %v, want > 0", cfg.Tolerance))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idemwebhook: stripe config: %w", err)
	}
	cfg.Secrets = copySecrets(cfg.Secrets)
	return &Stripe{cfg: cfg}, nil
}

// Provider describes Stripe: it retries every non-2xx answer for up to three days, so its stop
// answer (400) ends nothing by itself; see docs/webhooks.md.
func (s *Stripe) Provider() Provider {
	return Provider{
		Name:       "stripe",
		Headers:    []string{HeaderStripeSignature, "Content-Type", "User-Agent"},
		StopStatus: http.StatusBadRequest,
	}
}

// stripeEvent is the part of a Stripe event the ingress reads.
type stripeEvent struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
}

// Verify checks the Stripe-Signature header: the MAC first (against every v1 and every secret,
// in constant time each), then the timestamp, then reads the event id from the body.
func (s *Stripe) Verify(r *http.Request, body []byte) (Verified, error) {
	var ev stripeEvent
	evErr := json.Unmarshal(body, &ev)
	claimed := Verified{EventID: ev.ID}
	header := r.Header.Get(HeaderStripeSignature)
	if header == "" {
		return claimed, refuse(ErrNotSigned, "(no %s header)", HeaderStripeSignature)
	}
	sig, err := ParseStripeSignature(header)
	if err != nil {
		return claimed, refuse(err, "")
	}
	tenant, ok := "", false
	for _, sec := range s.cfg.Secrets {
		want := stripeMAC(sec.Key, sig.Timestamp.Unix(), body)
		for _, got := range sig.V1 {
			if hmac.Equal(got[:], want) && !ok {
				tenant, ok = sec.Tenant, true
			}
		}
	}
	if !ok {
		return claimed, refuse(ErrBadSignature, "(no v1 matches any of the %d endpoint secrets): the body was changed after signing, or signed with another secret", len(s.cfg.Secrets))
	}
	now := s.cfg.Now()
	if d := now.Sub(sig.Timestamp); d > s.cfg.Tolerance || d < -s.cfg.Tolerance {
		return claimed, refuse(ErrStaleSignature, "(signed at %s, %v from now; tolerance ±%v)", sig.Timestamp.Format(time.RFC3339), d.Round(time.Second), s.cfg.Tolerance)
	}
	v := Verified{EventID: ev.ID, Tenant: tenant, Type: ev.Type}
	if evErr != nil {
		return v, invalid("stripe body is not a JSON event: %v", evErr)
	}
	if err := checkEventID(ev.ID, `the body's "id"`); err != nil {
		return v, err
	}
	if ev.Created > 0 && ev.Created <= maxUnix {
		v.OccurredAt = time.Unix(ev.Created, 0).UTC()
	}
	return v, nil
}
