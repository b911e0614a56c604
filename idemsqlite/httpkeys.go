package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkey"
)

var _ idemkey.Store[*sql.Tx] = (*Store)(nil)

// The statements of the idempotency keys table (migration 070), with the {{prefix}} placeholder.
const (
	httpKeyColumns = `id, principal, route, idem_key, fingerprint, status, token, locked_until,
		created_at, expires_at, response_status, response_header, response_body`
	httpKeyInsert = `INSERT INTO {{prefix}}http_keys (` + httpKeyColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`
	httpKeySelect = `SELECT ` + httpKeyColumns + ` FROM {{prefix}}http_keys WHERE id = ?`
	httpKeyUpdate = `UPDATE {{prefix}}http_keys SET principal = ?, route = ?, idem_key = ?,
		fingerprint = ?, status = ?, token = ?, locked_until = ?, created_at = ?, expires_at = ?,
		response_status = ?, response_header = ?, response_body = ?
		WHERE id = ? AND token = ?`
	httpKeyDelete        = `DELETE FROM {{prefix}}http_keys WHERE id = ? AND token = ?`
	httpKeyDeleteExpired = `DELETE FROM {{prefix}}http_keys WHERE rowid IN
		(SELECT rowid FROM {{prefix}}http_keys WHERE expires_at < ? LIMIT ?)`
)

// InsertIdempotencyKeyTx inserts r inside tx unless its id exists, and reports whether it did.
func (s *Store) InsertIdempotencyKeyTx(ctx context.Context, tx *sql.Tx, r idemkey.Record) (bool, error) {
	res, err := tx.ExecContext(ctx, s.sub(httpKeyInsert), r.ID[:], r.Principal, r.Route, r.Key, r.Fingerprint[:],
		int(r.Status), r.Token, r.LockedUntil.UnixMicro(), r.CreatedAt.UnixMicro(), r.ExpiresAt.UnixMicro(),
		r.ResponseStatus, r.ResponseHeader, r.ResponseBody)
	if err != nil {
		return false, fmt.Errorf("idemsqlite: insert idempotency key: %w", err)
	}
	return affected(res, "insert idempotency key")
}

// GetIdempotencyKeyTx reads the key id inside tx, or an error wrapping idem.ErrNotFound.
func (s *Store) GetIdempotencyKeyTx(ctx context.Context, tx *sql.Tx, id idemkey.KeyID) (idemkey.Record, error) {
	var (
		r                                idemkey.Record
		rid, fp                          []byte
		status                           int
		lockedUntil, createdAt, expireAt int64
	)
	err := tx.QueryRowContext(ctx, s.sub(httpKeySelect), id[:]).Scan(&rid, &r.Principal, &r.Route, &r.Key, &fp,
		&status, &r.Token, &lockedUntil, &createdAt, &expireAt, &r.ResponseStatus, &r.ResponseHeader, &r.ResponseBody)
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("idemsqlite: idempotency key %x: %w", id[:6], idem.ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("idemsqlite: read idempotency key: %w", err)
	}
	if r.Fingerprint, err = idem.FingerprintFromBytes(fp); err != nil {
		return r, fmt.Errorf("idemsqlite: read idempotency key: %w", err)
	}
	r.ID, r.Status = id, idemkey.Status(status)
	r.LockedUntil, r.CreatedAt, r.ExpiresAt = fromMicros(lockedUntil), fromMicros(createdAt), fromMicros(expireAt)
	return r, nil
}

// UpdateIdempotencyKeyTx overwrites the key r.ID with r when its token is still r.Token-1.
func (s *Store) UpdateIdempotencyKeyTx(ctx context.Context, tx *sql.Tx, r idemkey.Record) (bool, error) {
	res, err := tx.ExecContext(ctx, s.sub(httpKeyUpdate), r.Principal, r.Route, r.Key, r.Fingerprint[:],
		int(r.Status), r.Token, r.LockedUntil.UnixMicro(), r.CreatedAt.UnixMicro(), r.ExpiresAt.UnixMicro(),
		r.ResponseStatus, r.ResponseHeader, r.ResponseBody, r.ID[:], r.Token-1)
	if err != nil {
		return false, fmt.Errorf("idemsqlite: update idempotency key: %w", err)
	}
	return affected(res, "update idempotency key")
}

// DeleteIdempotencyKeyTx deletes the key id when its token is still token.
func (s *Store) DeleteIdempotencyKeyTx(ctx context.Context, tx *sql.Tx, id idemkey.KeyID, token int64) (bool, error) {
	res, err := tx.ExecContext(ctx, s.sub(httpKeyDelete), id[:], token)
	if err != nil {
		return false, fmt.Errorf("idemsqlite: delete idempotency key: %w", err)
	}
	return affected(res, "delete idempotency key")
}

// DeleteExpiredIdempotencyKeys deletes up to limit keys that expired before before, in one
// short transaction, and reports how many it deleted.
func (s *Store) DeleteExpiredIdempotencyKeys(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idemsqlite: delete expired idempotency keys: limit is %d, want more than 0", limit)
	}
	res, err := s.execWrite(ctx, s.sub(httpKeyDeleteExpired), before.UnixMicro(), limit)
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: delete idempotency keys expired before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: delete expired idempotency keys: rows affected: %w", err)
	}
	return int(n), nil
}

// affected reports whether res changed a row.
func affected(res sql.Result, what string) (bool, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idemsqlite: %s: rows affected: %w", what, err)
	}
	return n > 0, nil
}
