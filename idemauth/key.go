package idemauth

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Bounds on keys, checked by NewKeyring and Sign.
const (
	// SecretMinBytes is the shortest secret a Key may have: 32 bytes is HMAC-SHA256's own output
	// size, below which the secret, not the hash, is the weak point.
	SecretMinBytes = 32
	// KeyIDMaxLen bounds a key id, which travels in every signature header.
	KeyIDMaxLen = 128
)

// Key is one signing key, bound to the single tenant it may speak for. Its String, GoString and
// LogValue never show Secret, so a Key can be logged or printed with %v by mistake safely.
type Key struct {
	// ID names the key in signature headers (required): 1 to KeyIDMaxLen letters, digits, '.',
	// '_' or '-', unique in a Keyring. Put the tenant and a date in it ("acme-2025-06") so an
	// operator can tell keys apart.
	ID string
	// Tenant is the tenant every message signed with this key belongs to (required).
	Tenant string
	// Secret is the HMAC key, at least SecretMinBytes random bytes (required).
	Secret []byte
	// NotAfter, when set, is the last instant at which this key may sign: it lets an old key
	// retire on schedule after a rotation. A signature made before it still verifies later, as
	// long as it is within the Verifier's tolerance of its message's publish time, so messages
	// in flight during a rotation are not lost.
	NotAfter time.Time
}

// String describes k without its secret.
func (k Key) String() string {
	s := fmt.Sprintf("idemauth.Key{ID: %q, Tenant: %q, Secret: [REDACTED %d bytes]", k.ID, k.Tenant, len(k.Secret))
	if !k.NotAfter.IsZero() {
		s += ", NotAfter: " + k.NotAfter.UTC().Format(time.RFC3339)
	}
	return s + "}"
}

// GoString is String, so that %#v does not print the secret either.
func (k Key) GoString() string { return k.String() }

// LogValue logs k's id and tenant only.
func (k Key) LogValue() slog.Value {
	return slog.GroupValue(slog.String("id", k.ID), slog.String("tenant", k.Tenant))
}

// expiredAt reports whether a signature made at t falls after k's NotAfter.
func (k Key) expiredAt(t time.Time) bool { return !k.NotAfter.IsZero() && t.After(k.NotAfter) }

// validate reports every invalid field of k, naming k by its id (or its position when the id is
// the problem).
func (k Key) validate(pos int) error {
	var errs []error
	name := fmt.Sprintf("key %q", k.ID)
	switch {
	case k.ID == "":
		name = fmt.Sprintf("key #%d", pos)
		errs = append(errs, errors.New("ID is empty"))
	case !validKeyID(k.ID):
		name = fmt.Sprintf("key #%d", pos)
		errs = append(errs, fmt.Errorf("ID %s: use 1 to %d letters, digits, '.', '_' or '-'", quoteTrunc(k.ID), KeyIDMaxLen))
	}
	if k.Tenant == "" {
		errs = append(errs, errors.New("Tenant is empty"))
	}
	if len(k.Secret) < SecretMinBytes {
		errs = append(errs, fmt.Errorf("Secret has %d bytes, want at least %d random bytes", len(k.Secret), SecretMinBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemauth: %s: %w", name, err)
	}
	return nil
}

// validKeyID reports whether id can travel in a signature header unchanged: it matches
// ^[A-Za-z0-9._-]{1,128}$.
func validKeyID(id string) bool {
	if id == "" || len(id) > KeyIDMaxLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Keyring is the set of keys a Verifier accepts and producers sign with. It is immutable and safe
// for concurrent use; to add or retire a key, build a new Keyring.
type Keyring struct {
	keys []Key          // in the order given, secrets copied
	byID map[string]int // index into keys
}

// NewKeyring validates keys and returns a Keyring holding copies of them. Every error names the
// key (by id, or by position when the id itself is wrong) and the field: ids must be non-empty
// and unique, tenants non-empty, secrets at least SecretMinBytes long, and no two tenants may
// share a secret (compared as the HMAC key it amounts to, see HMACKey): a producer holding it
// could otherwise sign for the other tenant. Keys of one tenant may share one.
func NewKeyring(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("idemauth: NewKeyring: no keys (want at least one)")
	}
	r := &Keyring{keys: make([]Key, 0, len(keys)), byID: make(map[string]int, len(keys))}
	var errs []error
	bySecret := make(map[string]Key, len(keys)) // effective HMAC key -> first key with it
	for i, k := range keys {
		if err := k.validate(i); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := r.byID[k.ID]; dup {
			errs = append(errs, fmt.Errorf("idemauth: key %q: ID is used by another key too", k.ID))
			continue
		}
		hk := string(HMACKey(k.Secret))
		if o, dup := bySecret[hk]; dup && o.Tenant != k.Tenant {
			errs = append(errs, fmt.Errorf("idemauth: key %q (tenant %q): Secret is the same HMAC key as key %q's (tenant %q): "+
				"a producer of either tenant could sign for the other; give each tenant its own secret", k.ID, k.Tenant, o.ID, o.Tenant))
			continue
		} else if !dup {
			bySecret[hk] = k
		}
		k.Secret = append([]byte(nil), k.Secret...)
		r.byID[k.ID] = len(r.keys)
		r.keys = append(r.keys, k)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return r, nil
}

// HMACKey returns the key HMAC-SHA256 actually uses for secret, for duplicate-secret checks
// (here and in idemwebhook): a secret longer than SHA-256's
// block size is replaced by its SHA-256, and the result is padded with zero bytes to the block
// size, so trailing zero bytes make no difference. Two secrets with the same HMACKey make the
// same MACs; the duplicate checks compare these.
func HMACKey(secret []byte) []byte {
	if len(secret) > sha256.BlockSize {
		sum := sha256.Sum256(secret)
		secret = sum[:]
	}
	return bytes.TrimRight(secret, "\x00")
}

// Key returns the key named id.
func (r *Keyring) Key(id string) (Key, bool) {
	i, ok := r.byID[id]
	if !ok {
		return Key{}, false
	}
	return r.keys[i], true
}

// Keys returns the keys of the ring in the order they were given (their secrets are shared with
// the ring: do not modify them).
func (r *Keyring) Keys() []Key { return append([]Key(nil), r.keys...) }

// SigningKey returns the key a producer for tenant should sign with at now: the last key listed
// for tenant that has not expired. Listing the new key after the old one is how a rotation starts.
func (r *Keyring) SigningKey(tenant string, now time.Time) (Key, error) {
	found := false
	for i := len(r.keys) - 1; i >= 0; i-- {
		k := r.keys[i]
		if k.Tenant != tenant {
			continue
		}
		found = true
		if !k.expiredAt(now) {
			return k, nil
		}
	}
	if found {
		return Key{}, fmt.Errorf("idemauth: every key of tenant %q expired before %s", tenant, now.UTC().Format(time.RFC3339))
	}
	return Key{}, fmt.Errorf("idemauth: no key for tenant %q", tenant)
}
