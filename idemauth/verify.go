package idemauth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/wire"
)

// Why a message was refused. Authenticate's errors wrap idem.ErrUnauthenticated and one of
// these, so a caller (or a test) can tell the reasons apart with errors.Is. None of their texts
// contains a secret or a MAC.
var (
	// ErrNotSigned: the message has no HeaderSignature header.
	ErrNotSigned = errors.New("idemauth: message is not signed")
	// ErrMalformedSignature: the header does not parse (see ParseSignature).
	ErrMalformedSignature = errors.New("idemauth: malformed signature header")
	// ErrUnknownKey: the header names a key the Keyring does not hold (never added, or retired).
	ErrUnknownKey = errors.New("idemauth: unknown signing key")
	// ErrBadSignature: the MAC does not match: the message was changed after signing, or signed
	// with another secret.
	ErrBadSignature = errors.New("idemauth: signature does not match the message")
	// ErrKeyExpired: the signature was made after its key's NotAfter.
	ErrKeyExpired = errors.New("idemauth: signing key expired")
	// ErrStaleSignature: the signature's timestamp is further than the tolerance from when the
	// message was published: a captured message replayed later, or a badly skewed clock.
	ErrStaleSignature = errors.New("idemauth: signature timestamp outside the tolerance")
	// ErrTenantMismatch: the transport or the payload claims a tenant other than the key's.
	ErrTenantMismatch = errors.New("idemauth: tenant not allowed for the signing key")
	// ErrVersionRetired: the signature uses scheme v1, which VerifierConfig.AcceptV1Until no
	// longer (or never) allows.
	ErrVersionRetired = errors.New("idemauth: signature version retired")
)

// HeaderTenant is the header in which a transport reports a tenant claimed by the producer that
// differs from the one it assigned (idemnats does this for a source bound to a tenant). The
// Verifier refuses such a message.
const HeaderTenant = wire.Tenant

// ToleranceDefault is VerifierConfig.Tolerance when unset: it absorbs clock skew and a slow
// producer without keeping a captured message replayable for long.
const ToleranceDefault = 5 * time.Minute

// VerifierConfig configures a Verifier. Zero fields take the documented defaults.
type VerifierConfig struct {
	// Tolerance is how far a signature's timestamp may lie from the moment the broker accepted
	// the message (Message.PublishedAt; now when the transport does not report it), in either
	// direction (default ToleranceDefault). Measuring from the publish time rather than from now
	// keeps a message that waited in a backlog or for a retry valid, while a captured message
	// published again later is refused.
	Tolerance time.Duration
	// Now returns the current time (default time.Now).
	Now func() time.Time
	// TenantField, when set, names a top-level JSON field of the payload that claims a tenant
	// ("tenant_id"). If the payload has it (matched case-insensitively, the way encoding/json
	// fills struct fields) with a value other than the key's tenant, the message is refused: a
	// key may only speak for its own tenant. A payload that is not a JSON object is left to the
	// Validator.
	TenantField string
	// AcceptV1Until, when set, keeps verifying signatures of the former scheme v1 (which covers
	// neither OccurredAt nor a purpose) made at or before this instant, while the verifier's own
	// clock has not passed it either: the rotation window for producers not yet upgraded to v2.
	// Zero (the default) refuses every v1 signature with ErrVersionRetired.
	AcceptV1Until time.Time
	// ReplayKeys are the operators' keys a replayed dead letter may be signed with (see
	// ReplaySigner). Empty means replays of signed messages must carry a fresh producer
	// signature, which a dead letter older than Tolerance never has.
	ReplayKeys []ReplayKey
}

// WithDefaults returns c with zero fields set to their defaults.
func (c VerifierConfig) WithDefaults() VerifierConfig {
	if c.Tolerance == 0 {
		c.Tolerance = ToleranceDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// validate reports every invalid field of a config that WithDefaults has filled in, for a
// Verifier over ring.
func (c VerifierConfig) validate(ring *Keyring) error {
	var errs []error
	if c.Tolerance < 0 {
		errs = append(errs, fmt.Errorf("Tolerance is %v, want > 0", c.Tolerance))
	}
	if c.TenantField != strings.TrimSpace(c.TenantField) {
		errs = append(errs, fmt.Errorf("TenantField %q has surrounding spaces", c.TenantField))
	}
	errs = append(errs, c.validateReplayKeys(ring)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemauth: verifier config: %w", err)
	}
	return nil
}

// validateReplayKeys reports every invalid replay key: an invalid field, an id used twice or by a
// producer key of ring, and a secret (compared as the HMAC key it amounts to) of a producer key
// or of another replay key. A shared secret would let a producer sign replays, or an operator
// whose key is limited to some tenants sign as one that is not.
func (c VerifierConfig) validateReplayKeys(ring *Keyring) []error {
	var errs []error
	seen := map[string]bool{}
	secrets := map[string]string{} // effective HMAC key -> description of its first owner
	for _, k := range ring.keys {
		if hk := string(HMACKey(k.Secret)); secrets[hk] == "" {
			secrets[hk] = fmt.Sprintf("producer key %q's", k.ID)
		}
	}
	for i, k := range c.ReplayKeys {
		if err := k.validate(); err != nil {
			errs = append(errs, fmt.Errorf("ReplayKeys[%d]: %w", i, err))
			continue
		}
		if seen[k.ID] {
			errs = append(errs, fmt.Errorf("ReplayKeys[%d]: ID %q is used by another replay key too", i, k.ID))
		}
		seen[k.ID] = true
		if _, ok := ring.byID[k.ID]; ok {
			errs = append(errs, fmt.Errorf("ReplayKeys[%d]: ID %q is the id of a producer key: give replay keys ids of their own", i, k.ID))
		}
		hk := string(HMACKey(k.Secret))
		if owner, ok := secrets[hk]; ok {
			errs = append(errs, fmt.Errorf("ReplayKeys[%d]: replay key %q: Secret is the same HMAC key as %s: give every replay key a secret of its own", i, k.ID, owner))
			continue
		}
		secrets[hk] = fmt.Sprintf("replay key %q's", k.ID)
	}
	return errs
}

// Verifier is an idem.Authenticator that checks HMAC signatures against a Keyring and sets each
// message's tenant to the tenant of the key that verified it. It is safe for concurrent use.
type Verifier struct {
	ring   *Keyring
	cfg    VerifierConfig
	replay map[string]ReplayKey
}

var _ idem.Authenticator = (*Verifier)(nil)

// NewVerifier returns a Verifier over ring; cfg's errors name the field. It refuses a replay key
// whose id is a producer key's, or whose secret is a producer key's or another replay key's.
func NewVerifier(ring *Keyring, cfg VerifierConfig) (*Verifier, error) {
	if ring == nil {
		return nil, errors.New("idemauth: NewVerifier: keyring is nil")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(ring); err != nil {
		return nil, err
	}
	v := &Verifier{ring: ring, cfg: cfg, replay: make(map[string]ReplayKey, len(cfg.ReplayKeys))}
	for _, k := range cfg.ReplayKeys {
		k.Secret = append([]byte(nil), k.Secret...)
		k.Tenants = append([]string(nil), k.Tenants...)
		v.replay[k.ID] = k
	}
	return v, nil
}

// Authenticate verifies msg's signature and, on success, sets msg.Tenant to the key's tenant.
// It refuses — with an error wrapping idem.ErrUnauthenticated and one of this package's reasons,
// naming neither the event id (the consumer adds it, once) nor a secret or a MAC — a missing or
// malformed header, an unknown key, a MAC that does not match, a signature made after its key's NotAfter or outside the
// tolerance, and a tenant claimed by the transport (msg.Tenant, the Idem-Tenant header) or by
// the payload's TenantField that is not the key's. The MAC is checked before the times, so that
// a time is only reported for a signature that is genuine.
func (v *Verifier) Authenticate(_ context.Context, msg *idem.Message) error {
	refuse := func(reason error, format string, args ...any) error {
		if format == "" {
			return fmt.Errorf("%w: %w", idem.ErrUnauthenticated, reason)
		}
		return fmt.Errorf("%w: %w %s", idem.ErrUnauthenticated, reason, fmt.Sprintf(format, args...))
	}

	if msg.Header(HeaderReplaySignature) != "" {
		return v.authenticateReplay(msg, refuse)
	}
	header := msg.Header(HeaderSignature)
	if header == "" {
		return refuse(ErrNotSigned, "(no %s header)", HeaderSignature)
	}
	sig, err := ParseSignature(header)
	if err != nil {
		return fmt.Errorf("%w: %w", idem.ErrUnauthenticated, err)
	}
	key, err := v.checkProducerMAC(sig, *msg, refuse)
	if err != nil {
		return err
	}
	if err := v.checkTimes(sig, key.ID, key.NotAfter, *msg, refuse); err != nil {
		return err
	}
	if msg.Tenant != "" && msg.Tenant != key.Tenant {
		return refuse(ErrTenantMismatch, "(the transport says tenant %s, key %q speaks for tenant %q)", quoteTrunc(msg.Tenant), key.ID, key.Tenant)
	}
	if err := v.checkTenantClaims(*msg, key.ID, key.Tenant, refuse); err != nil {
		return err
	}
	msg.Tenant = key.Tenant
	return nil
}

// checkTenantClaims refuses a tenant claimed by the Idem-Tenant header or the payload's
// TenantField that is not tenant, the one the verified key speaks for.
func (v *Verifier) checkTenantClaims(msg idem.Message, kid, tenant string, refuse func(error, string, ...any) error) error {
	key := struct{ ID, Tenant string }{kid, tenant}
	if t := msg.Header(HeaderTenant); t != "" && t != key.Tenant {
		return refuse(ErrTenantMismatch, "(header %s claims tenant %s, key %q speaks for tenant %q)", HeaderTenant, quoteTrunc(t), key.ID, key.Tenant)
	}
	if v.cfg.TenantField != "" {
		if claim, ok := payloadTenantMismatch(msg.Payload, v.cfg.TenantField, key.Tenant); ok {
			return refuse(ErrTenantMismatch, "(payload field %q claims tenant %s, key %q speaks for tenant %q)", v.cfg.TenantField, claim, key.ID, key.Tenant)
		}
	}
	return nil
}

// checkProducerMAC finds the key of a producer's signature and checks its MAC: v2, or v1 while
// the rotation window allows it.
func (v *Verifier) checkProducerMAC(sig Signature, msg idem.Message, refuse func(error, string, ...any) error) (Key, error) {
	key, ok := v.ring.Key(sig.KeyID)
	if !ok {
		return Key{}, refuse(ErrUnknownKey, "%q (not in the keyring: never added, or retired)", sig.KeyID)
	}
	want, err := v.producerMAC(key, sig, msg, refuse)
	if err != nil {
		return Key{}, err
	}
	if !hmac.Equal(sig.MAC[:], want[:]) {
		return Key{}, refuse(ErrBadSignature, "(key %q): the message was changed after signing, or signed with another secret", key.ID)
	}
	return key, nil
}

// producerMAC is the MAC key should have made for sig over msg: v2, or v1 while the rotation
// window (VerifierConfig.AcceptV1Until) allows it, for a producer's signature checked directly
// and for the one a replay keeps alike.
func (v *Verifier) producerMAC(key Key, sig Signature, msg idem.Message, refuse func(error, string, ...any) error) ([32]byte, error) {
	if sig.Version != 1 {
		return computeMAC(key, sig.Timestamp.Unix(), msg), nil
	}
	until := v.cfg.AcceptV1Until
	if until.IsZero() || sig.Timestamp.After(until) || v.cfg.Now().After(until) {
		return [32]byte{}, refuse(ErrVersionRetired, "(key %q signed with v1, which does not cover the occurrence time; sign with v2)", key.ID)
	}
	return computeMACv1(key, sig.Timestamp.Unix(), msg), nil
}

// checkTimes refuses a signature made after its key's NotAfter or further than the tolerance from
// the publish time (or now).
func (v *Verifier) checkTimes(sig Signature, kid string, notAfter time.Time, msg idem.Message, refuse func(error, string, ...any) error) error {
	if !notAfter.IsZero() && sig.Timestamp.After(notAfter) {
		return refuse(ErrKeyExpired, "(key %q expired at %s, signed at %s)", kid,
			notAfter.UTC().Format(time.RFC3339), sig.Timestamp.Format(time.RFC3339))
	}
	now := v.cfg.Now()
	ref, refName := msg.PublishedAt, "published"
	if ref.IsZero() {
		ref, refName = now, "received"
	}
	tol := v.cfg.Tolerance
	switch d := ref.Sub(sig.Timestamp); {
	case d > tol:
		return refuse(ErrStaleSignature, "(signed at %s, %v before the message was %s; tolerance ±%v): a replayed or long-delayed message",
			sig.Timestamp.Format(time.RFC3339), d.Round(time.Second), refName, tol)
	case d < -tol || sig.Timestamp.Sub(now) > tol:
		return refuse(ErrStaleSignature, "(signed at %s, in the future; tolerance ±%v): the producer's clock is wrong",
			sig.Timestamp.Format(time.RFC3339), tol)
	}
	return nil
}

// payloadTenantMismatch looks for field (case-insensitively) among the top-level members of a
// JSON object payload and reports the first claim that is not tenant, quoted for an error. Every
// occurrence is checked, so a duplicated field cannot hide a claim from a parser that keeps the
// first or the last. A string claims its value and a number its text; null claims nothing (it
// leaves a Go string field empty); any other value is a mismatch. Where the payload stops being
// JSON the search ends: claims found so far still count, and the Validator refuses the rest.
func payloadTenantMismatch(payload []byte, field, tenant string) (claim string, mismatch bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		name, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return "", false
		}
		if !strings.EqualFold(name, field) {
			continue
		}
		var val any
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if err := d.Decode(&val); err != nil {
			return "", false
		}
		switch x := val.(type) {
		case nil:
		case string:
			if x != tenant {
				return quoteTrunc(x), true
			}
		case json.Number:
			if string(x) != tenant {
				return quoteTrunc(string(x)), true
			}
		case bool:
			return "(a boolean, not a string)", true
		case []any:
			return "(an array, not a string)", true
		default:
			return "(an object, not a string)", true
		}
	}
	return "", false
}
