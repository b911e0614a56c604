package idemkey

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"time"

	"github.com/idemkit/idem"
)

// Store is the seam between the middleware and a database: the store's transactions plus five
// plain statements on one table of idempotency keys. idempg, idemsqlite and idemmysql implement
// it; storetest.ExerciseIdempotencyKeys checks an implementation. TTx is the store's
// transaction type, the one a handler receives.
//
// Every change of a row is conditional on its token and increments it (optimistic
// concurrency), so the middleware's decisions need no row locks of their own: a request that
// lost a race simply finds the row changed.
type Store[TTx any] interface {
	// InTx runs fn in a new transaction and commits it when fn returns nil; any error or panic
	// rolls it back (idemstore.Store's InTx).
	InTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error

	// InsertIdempotencyKeyTx inserts r inside tx unless a row with r.ID exists (INSERT … ON
	// CONFLICT DO NOTHING), and reports whether it inserted.
	InsertIdempotencyKeyTx(ctx context.Context, tx TTx, r Record) (bool, error)
	// GetIdempotencyKeyTx reads the row with id inside tx; an error wrapping idem.ErrNotFound
	// when there is none.
	GetIdempotencyKeyTx(ctx context.Context, tx TTx, id KeyID) (Record, error)
	// UpdateIdempotencyKeyTx overwrites every column of the row r.ID with r, and sets its token
	// to r.Token, when the stored token is still r.Token-1; it reports whether it did.
	UpdateIdempotencyKeyTx(ctx context.Context, tx TTx, r Record) (bool, error)
	// DeleteIdempotencyKeyTx deletes the row id when its token is still token, and reports
	// whether it did.
	DeleteIdempotencyKeyTx(ctx context.Context, tx TTx, id KeyID, token int64) (bool, error)
	// DeleteExpiredIdempotencyKeys deletes up to limit rows whose ExpiresAt is before before, in
	// a short transaction of its own, and reports how many it deleted; callers loop while the
	// count equals the limit.
	DeleteExpiredIdempotencyKeys(ctx context.Context, before time.Time, limit int) (int, error)
}

// KeyID is the primary key of a stored idempotency key: SHA-256 over the principal, the route
// and the key, each length-prefixed, so one principal can never reach another's stored
// response and the index stays 32 bytes whatever the inputs' lengths.
type KeyID [32]byte

// NewKeyID derives the id of key as used by principal on route.
func NewKeyID(principal, route, key string) KeyID {
	h := sha256.New()
	var n [8]byte
	for _, s := range []string{principal, route, key} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	var id KeyID
	h.Sum(id[:0])
	return id
}

// Status is the state of a stored key.
type Status int

const (
	// StatusInFlight means a request holds the key and its handler may be running; LockedUntil
	// says until when the lock holds.
	StatusInFlight Status = 1
	// StatusCompleted means the handler's transaction committed, and the row holds its response.
	StatusCompleted Status = 2
)

// String names the status as operators see it ("in_flight", "completed").
func (s Status) String() string {
	switch s {
	case StatusInFlight:
		return "in_flight"
	case StatusCompleted:
		return "completed"
	}
	return "invalid"
}

// Record is one row of the idempotency keys table.
type Record struct {
	ID KeyID
	// Principal, Route and Key are what ID was derived from, kept for operators; bounded by
	// MaxPrincipalLen, MaxRouteLen and MaxKeyLen.
	Principal, Route, Key string
	// Fingerprint is the request's (method, path and body by default).
	Fingerprint idem.Fingerprint
	Status      Status
	// Token increments with every change of the row; the holder of an in-flight lock writes
	// its response only while the token is the one it locked with.
	Token int64
	// LockedUntil ends an in-flight lock: after it another request with the key may take over
	// (the first one's transaction can then no longer commit).
	LockedUntil time.Time
	CreatedAt   time.Time
	// ExpiresAt ends the key's retention: after it the key is free again and garbage.
	ExpiresAt time.Time
	// ResponseStatus, ResponseHeader (JSON of the kept headers) and ResponseBody are the stored
	// response of a completed key.
	ResponseStatus int
	ResponseHeader []byte
	ResponseBody   []byte
}
