package idemauth

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/wire"
)

// HeaderReplaySignature carries an operator's replay signature: "kid=<replay key id>,t=<unix>,
// v2=<hex>". It is a header of its own, under keys of their own (VerifierConfig.ReplayKeys), with
// a MAC made for the purpose "replay": a producer's key cannot make it and a replay key cannot
// make an Idem-Signature.
const HeaderReplaySignature = wire.ReplaySignature

// ReplayKey is an operator's key for replaying dead letters: a replay re-publishes a message whose
// producer signature is older than the Verifier's tolerance, and this key vouches that the
// replay comes from an operator. Its String, GoString and LogValue never show Secret.
type ReplayKey struct {
	// ID names the key in replay signature headers (required; the same alphabet as Key.ID). It
	// must not be the id of a producer key (NewVerifier refuses it).
	ID string
	// Secret is the HMAC key, at least SecretMinBytes random bytes (required), shared with no
	// producer key and no other replay key (NewVerifier refuses it).
	Secret []byte
	// Tenants limits the tenants this key may replay for; empty means any tenant.
	Tenants []string
	// NotAfter, when set, is the last instant at which this key may sign a replay.
	NotAfter time.Time
}

// String describes k without its secret.
func (k ReplayKey) String() string {
	return fmt.Sprintf("idemauth.ReplayKey{ID: %q, Tenants: %q, Secret: [REDACTED %d bytes]}", k.ID, k.Tenants, len(k.Secret))
}

// GoString is String, so that %#v does not print the secret either.
func (k ReplayKey) GoString() string { return k.String() }

// LogValue logs k's id only.
func (k ReplayKey) LogValue() slog.Value { return slog.GroupValue(slog.String("id", k.ID)) }

// validate reports every invalid field of k.
func (k ReplayKey) validate() error {
	var errs []error
	if !validKeyID(k.ID) {
		errs = append(errs, fmt.Errorf("ID %s: use 1 to %d letters, digits, '.', '_' or '-'", quoteTrunc(k.ID), KeyIDMaxLen))
	}
	if len(k.Secret) < SecretMinBytes {
		errs = append(errs, fmt.Errorf("Secret has %d bytes, want at least %d random bytes", len(k.Secret), SecretMinBytes))
	}
	for _, t := range k.Tenants {
		if strings.TrimSpace(t) == "" {
			errs = append(errs, errors.New("Tenants has a blank tenant"))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemauth: replay key %s: %w", quoteTrunc(k.ID), err)
	}
	return nil
}

// allows reports whether k may replay for tenant.
func (k ReplayKey) allows(tenant string) bool {
	return tenant != "" && (len(k.Tenants) == 0 || slices.Contains(k.Tenants, tenant))
}

// ReplaySigner signs the messages an idemdlq.Replayer republishes with an operator's ReplayKey. It
// implements idemdlq.ReplaySigner.
type ReplaySigner struct {
	key ReplayKey
	now func() time.Time
}

var _ idemdlq.ReplaySigner = (*ReplaySigner)(nil)

// NewReplaySigner returns a signer with key; now is the clock (nil means time.Now).
func NewReplaySigner(key ReplayKey, now func() time.Time) (*ReplaySigner, error) {
	if err := key.validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	key.Secret = append([]byte(nil), key.Secret...)
	return &ReplaySigner{key: key, now: now}, nil
}

// SignReplay sets msg's HeaderReplaySignature. The MAC covers the purpose "replay", the time,
// the key id, the event id, the tenant (msg.Tenant, the one the original signature verified),
// the type, the occurrence time, the Idem-Replay-Of, Idem-Replayed-By, Idem-Replay-New-Event-Of
// and Idem-Replay-Event-Time headers and SHA-256 of the payload. It refuses a message without tenant or event id, a tenant the key may not replay
// for and a key past its NotAfter.
func (s *ReplaySigner) SignReplay(_ context.Context, msg *idem.Message) error {
	now := s.now()
	switch {
	case msg.EventID == "":
		return errors.New("idemauth: sign replay: EventID is empty")
	case !s.key.allows(msg.Tenant):
		return fmt.Errorf("idemauth: sign replay: replay key %q may not replay for tenant %s", s.key.ID, quoteTrunc(msg.Tenant))
	case !s.key.NotAfter.IsZero() && now.After(s.key.NotAfter):
		return fmt.Errorf("idemauth: sign replay: replay key %q expired at %s", s.key.ID, s.key.NotAfter.UTC().Format(time.RFC3339))
	case now.Unix() < 0 || now.Unix() > maxUnix:
		return fmt.Errorf("idemauth: sign replay: time %s is outside 1970-9999", now.UTC().Format(time.RFC3339))
	}
	sig := Signature{KeyID: s.key.ID, Timestamp: time.Unix(now.Unix(), 0).UTC(), Version: 2}
	sig.MAC = replayMAC(s.key, sig.Timestamp.Unix(), *msg)
	h := make(map[string]string, len(msg.Headers)+1)
	for k, v := range msg.Headers {
		h[k] = v
	}
	h[HeaderReplaySignature] = sig.String()
	msg.Headers = h
	return nil
}

// replayMAC is the v2 MAC with purpose "replay" over msg as the operator republishes it.
func replayMAC(key ReplayKey, unix int64, msg idem.Message) [32]byte {
	return macV2(key.Secret, purposeReplay, unix, key.ID, msg.Tenant, msg,
		msg.Header(idem.HeaderReplayOf), msg.Header(idem.HeaderReplayedBy), msg.Header(idem.HeaderReplayNewEventOf),
		msg.Header(idem.HeaderReplayEventTime))
}

// authenticateReplay verifies a message that carries an operator's replay signature: the replay
// key must be one of ReplayKeys and allowed for the message's tenant, its MAC must cover the
// message as received, and its time must lie within the tolerance of the (re)publish time. The
// producer's original signature must still be there, made with a key of the keyring (v1 only
// inside AcceptV1Until), and match the message (only its age is forgiven), so that a replay key re-authorises what a producer
// signed rather than anything an operator's store holds — except for an edited dead letter the
// operator explicitly sent as a new event (Idem-Replay-New-Event-Of, covered by the MAC).
func (v *Verifier) authenticateReplay(msg *idem.Message, refuse func(error, string, ...any) error) error {
	sig, err := ParseSignature(msg.Header(HeaderReplaySignature))
	if err != nil {
		return fmt.Errorf("%w: %s: %w", idem.ErrUnauthenticated, HeaderReplaySignature, err)
	}
	key, ok := v.replay[sig.KeyID]
	if !ok {
		return refuse(ErrUnknownKey, "%q in %s (not a replay key of this verifier)", sig.KeyID, HeaderReplaySignature)
	}
	if sig.Version != 2 {
		return refuse(ErrVersionRetired, "(replay key %q: a replay signature is v2 only)", key.ID)
	}
	want := replayMAC(key, sig.Timestamp.Unix(), *msg)
	if !hmac.Equal(sig.MAC[:], want[:]) {
		return refuse(ErrBadSignature, "(replay key %q): the replay was changed after signing, or signed with another secret", key.ID)
	}
	if err := v.checkTimes(sig, key.ID, key.NotAfter, *msg, refuse); err != nil {
		return err
	}
	if !key.allows(msg.Tenant) {
		return refuse(ErrTenantMismatch, "(replay key %q may not replay for tenant %s)", key.ID, quoteTrunc(msg.Tenant))
	}
	if msg.Header(idem.HeaderReplayNewEventOf) != "" {
		// An edited dead letter the operator sent as a new event (ReplayParams.AsNewEvent): no
		// producer signed this payload, the operator's key alone vouches for it.
		return v.checkTenantClaims(*msg, key.ID, msg.Tenant, refuse)
	}
	orig := msg.Header(HeaderSignature)
	if orig == "" {
		return refuse(ErrNotSigned, "(a replay keeps the producer's %s header; this one has none)", HeaderSignature)
	}
	osig, err := ParseSignature(orig)
	if err != nil {
		return fmt.Errorf("%w: %w", idem.ErrUnauthenticated, err)
	}
	// The producer's key must be in the keyring: were an unknown one let through unchecked, a
	// replay key alone could put any payload under any event id by naming a key the verifier
	// does not hold. Keep a retired key in the ring (with a NotAfter) while its dead letters may
	// be replayed, or replay them as new events.
	pk, ok := v.ring.Key(osig.KeyID)
	if !ok {
		return refuse(ErrUnknownKey, "%q in %s (the producer key of a replay must be in the keyring; replay it as a new event otherwise)", osig.KeyID, HeaderSignature)
	}
	if pk.Tenant != msg.Tenant {
		return refuse(ErrTenantMismatch, "(the replay says tenant %s, producer key %q speaks for tenant %q)", quoteTrunc(msg.Tenant), pk.ID, pk.Tenant)
	}
	// The producer's MAC covers the message without the replay headers; v1 only inside the
	// rotation window, as for a message verified directly.
	want, err = v.producerMAC(pk, osig, *msg, refuse)
	if err != nil {
		return err
	}
	if !hmac.Equal(osig.MAC[:], want[:]) {
		return refuse(ErrBadSignature, "(producer key %q): the replayed message is not the one the producer signed", pk.ID)
	}
	return v.checkTenantClaims(*msg, key.ID, msg.Tenant, refuse)
}
