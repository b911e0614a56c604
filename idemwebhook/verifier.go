package idemwebhook

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemtype"
)

// Why a verifier refused a request. Verify's errors wrap idem.ErrUnauthenticated and one of these,
// so a caller (or a test) can tell the reasons apart with errors.Is. None of their texts contains a
// secret or a MAC.
var (
	// ErrNotSigned: the request has no signature header.
	ErrNotSigned = errors.New("idemwebhook: request is not signed")
	// ErrMalformedSignature: the signature header does not parse.
	ErrMalformedSignature = errors.New("idemwebhook: malformed signature header")
	// ErrBadSignature: no configured secret produces the signature: the body was changed after
	// signing, or it was signed with a secret this verifier does not hold.
	ErrBadSignature = errors.New("idemwebhook: signature does not match the request")
	// ErrStaleSignature: the signature is genuine but its time lies outside the tolerance (or its
	// token expired): a captured request sent again later, or a badly skewed clock.
	ErrStaleSignature = errors.New("idemwebhook: signature timestamp outside the tolerance")
	// ErrClaimMismatch: the signature is genuine but was made for another destination URL, issuer
	// or body (QStash's sub, iss and body claims).
	ErrClaimMismatch = errors.New("idemwebhook: signed claims do not match the request")
	// ErrNoTenant: the verifier accepted the request but named no tenant, or one that is not a
	// valid identity (a custom Verifier's bug): the Handler refuses the delivery as
	// unauthenticated rather than run it under no tenant.
	ErrNoTenant = errors.New("idemwebhook: verifier named no valid tenant")
)

// Verified is what a Verifier learned from a request whose signature it checked.
type Verified struct {
	// EventID is the provider's id of the event or message; it becomes the claim's event id, so
	// a redelivery of the same event is recognised.
	EventID string
	// Tenant is the tenant of the secret that verified the signature; never a field of the request.
	Tenant string
	// Type names the kind of event when the provider says it ("payment_intent.succeeded").
	Type string
	// OccurredAt is when the provider says the event happened; zero when it does not say.
	OccurredAt time.Time
	// Attempt is the 1-based delivery attempt when the provider counts them (QStash); 0 when it
	// does not.
	Attempt int
	// Replay is true when the request carried a replay signature that verified (idemauth's
	// Idem-Replay-Signature): only then are its Idem-Replay-* headers kept on the message, since
	// the replay signature is what covers them. A verifier that does not verify replays leaves it
	// false.
	Replay bool
}

// Provider describes how a provider talks to the ingress.
type Provider struct {
	// Name identifies the provider in dead letters (the Idem-Webhook-Provider header and the
	// default source "webhook:<name>"), logs and problem bodies: "qstash", "stripe", "github", "idem".
	Name string
	// Headers lists the request headers kept with the message, and so with a dead letter: the
	// signature, id and type headers an operator needs to understand a failure. Other request
	// headers (cookies, credentials of a proxy) are never stored.
	Headers []string
	// StopStatus is the status that answers a delivery the ingress refused for good (it is
	// dead-lettered): a 4xx the provider treats as final where it has one.
	StopStatus int
	// StopHeaders are sent with StopStatus (QStash needs Upstash-NonRetryable-Error: true).
	StopHeaders map[string]string
}

// Verifier checks one provider's signature scheme. Implementations must be safe for concurrent use.
type Verifier interface {
	// Provider describes the provider; the Handler reads it once, in New.
	Provider() Provider
	// Verify checks the signature of r over body (read in full, at most Config.MaxBodyBytes) and
	// returns what it learned. It refuses a missing, malformed, wrong-key or stale signature with
	// an error wrapping idem.ErrUnauthenticated, and a genuine request it cannot turn into an
	// event (no event id) with one wrapping idem.ErrInvalidPayload, returning the verified
	// tenant with it. On every error it also returns the event id the request claims, when it
	// can read one: the dead letter records it (bounded), nothing else trusts it.
	Verify(r *http.Request, body []byte) (Verified, error)
}

// SecretMinBytes is the shortest secret a verifier accepts: shorter ones are guessable offline
// from one captured request.
const SecretMinBytes = 16

// Secret is one signing secret and the tenant whose deliveries it signs. Listing two secrets for
// one tenant is how a rotation runs (QStash's current and next signing keys, Stripe's rolled
// endpoint secret). Its String never shows Key.
type Secret struct {
	// Tenant is the tenant every delivery verified by this secret belongs to (required).
	Tenant string
	// Key is the secret as the provider shows it, used as the HMAC key byte for byte
	// ("whsec_…", "sig_…"); at least SecretMinBytes (required).
	Key []byte
}

// String describes s without its key.
func (s Secret) String() string {
	return fmt.Sprintf("idemwebhook.Secret{Tenant: %q, Key: [REDACTED %d bytes]}", s.Tenant, len(s.Key))
}

// GoString is String, so that %#v does not print the key either.
func (s Secret) GoString() string { return s.String() }

// validateSecrets reports every invalid secret of a verifier config: none at all, an empty
// tenant or one that is not a valid identity (idem.ValidateIdentity's rules), a short key, or
// one key (as the HMAC key it amounts to, idemauth.HMACKey) listed for two tenants (the signer
// would not decide the tenant).
func validateSecrets(secrets []Secret) []error {
	if len(secrets) == 0 {
		return []error{errors.New("Secrets is empty (want at least one signing secret)")}
	}
	var errs []error
	for i, s := range secrets {
		if s.Tenant == "" {
			errs = append(errs, fmt.Errorf("Secrets[%d]: Tenant is empty", i))
		} else if err := idemtype.ValidateField(idemtype.FieldTenant, s.Tenant); err != nil {
			errs = append(errs, fmt.Errorf("Secrets[%d]: Tenant: %w", i, err))
		}
		if len(s.Key) < SecretMinBytes {
			errs = append(errs, fmt.Errorf("Secrets[%d]: Key has %d bytes, want at least %d", i, len(s.Key), SecretMinBytes))
		}
		for j := range i {
			if bytes.Equal(idemauth.HMACKey(secrets[j].Key), idemauth.HMACKey(s.Key)) && secrets[j].Tenant != s.Tenant {
				errs = append(errs, fmt.Errorf("Secrets[%d]: the same Key as Secrets[%d] for another tenant (%q, %q): the signer could not decide the tenant", i, j, s.Tenant, secrets[j].Tenant))
			}
		}
	}
	return errs
}

// copySecrets returns a deep copy, so that a caller changing its slice later changes nothing.
func copySecrets(secrets []Secret) []Secret {
	out := make([]Secret, len(secrets))
	for i, s := range secrets {
		out[i] = Secret{Tenant: s.Tenant, Key: append([]byte(nil), s.Key...)}
	}
	return out
}

// refuse builds a verification error: idem.ErrUnauthenticated, the reason, and a detail.
func refuse(reason error, format string, args ...any) error {
	if format == "" {
		return fmt.Errorf("%w: %w", idem.ErrUnauthenticated, reason)
	}
	return fmt.Errorf("%w: %w %s", idem.ErrUnauthenticated, reason, fmt.Sprintf(format, args...))
}

// invalid builds the error of a genuine request that cannot become an event.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", idem.ErrInvalidPayload, fmt.Sprintf(format, args...))
}

// EventIDMaxLen bounds a verified event id; the claim key and every log line carry it.
const EventIDMaxLen = 256

// checkEventID refuses an event id that is empty, longer than EventIDMaxLen, not UTF-8, or holds
// control characters; name says where it came from.
func checkEventID(id, name string) error {
	switch {
	case id == "":
		return invalid("%s is missing or empty: without the provider's id a redelivery cannot be recognised", name)
	case len(id) > EventIDMaxLen:
		return invalid("%s is %d bytes, limit %d", name, len(id), EventIDMaxLen)
	case !utf8.ValidString(id):
		return invalid("%s is not UTF-8", name)
	}
	for _, r := range id {
		if idemtype.ForbiddenInIdentity(r) {
			return invalid("%s %s holds a control character or a line separator", name, quoteTrunc(id))
		}
	}
	return nil
}

// boundedIDLen bounds an unverified event id kept in a dead letter.
const boundedIDLen = 128

// boundID makes an unverified, claimed event id safe to store and print: valid UTF-8, control
// characters replaced, at most boundedIDLen bytes.
func boundID(id string) string {
	id = strings.ToValidUTF8(id, "\uFFFD")
	id = strings.Map(func(r rune) rune {
		if idemtype.ForbiddenInIdentity(r) {
			return '?'
		}
		return r
	}, id)
	if len(id) <= boundedIDLen {
		return id
	}
	cut := boundedIDLen
	for cut > 0 && !utf8.RuneStart(id[cut]) {
		cut--
	}
	return id[:cut]
}

// quoteTrunc quotes a bounded part of hostile input for an error message.
func quoteTrunc(s string) string {
	const n = 64
	if len(s) > n {
		return fmt.Sprintf("%q…", s[:n])
	}
	return fmt.Sprintf("%q", s)
}
