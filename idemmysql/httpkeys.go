package idemmysql

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
	// A plain INSERT, not INSERT IGNORE (which hides every error of the row) nor ON DUPLICATE
	// KEY UPDATE (whose affected-rows count depends on the DSN's CLIENT_FOUND_ROWS): a
	// duplicate is error 1062, which rolls back that statement only.
	httpKeyInsert = `INSERT INTO {{prefix}}http_keys (` + httpKeyColumns + `)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	httpKeySelect = `SELECT ` + httpKeyColumns + ` FROM {{prefix}}http_keys WHERE id = ?`
	httpKeyUpdate = `UPDATE {{prefix}}http_keys SET principal = ?, route = ?, idem_key = ?,
		fingerprint = ?, status = ?, token = ?, locked_until = ?, created_at = ?, expires_at = ?,
		response_status = ?, response_header = ?, response_body = ?
		WHERE id = ? AND token = ?`
	httpKeyDelete        = `DELETE FROM {{prefix}}http_keys WHERE id = ? AND token = ?`
	httpKeyDeleteExpired = `DELETE FROM {{prefix}}http_keys WHERE expires_at < ? ORDER BY expires_at LIMIT ?`
)

// InsertIdempotencyKeyTx inserts r inside tx unless its id exists, and reports whether it did.
// A collision waits for an uncommitted inserter of the same id and leaves a shared lock on the
// existing row, so the read that follows sees the latest committed row.
func (s *Store) InsertIdempotencyKeyTx(ctx context.Context, tx *sql.Tx, r idemkey.Record) (bool, error) {
	_, err := tx.ExecContext(ctx, s.sub(httpKeyInsert), r.ID[:], r.Principal, r.Route, r.Key, r.Fingerprint[:],
		int(r.Status), r.Token, r.LockedUntil.UnixMicro(), r.CreatedAt.UnixMicro(), r.ExpiresAt.UnixMicro(),
		r.ResponseStatus, r.ResponseHeader, r.ResponseBody)
	switch {
	case err == nil:
		return true, nil
	case isMySQLError(err, errDupEntry):
		return false, nil
	}
	return false, fmt.Errorf("idemmysql: insert idempotency key: %w", err)
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
		return r, fmt.Errorf("idemmysql: idempotency key %x: %w", id[:6], idem.ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("idemmysql: read idempotency key: %w", err)
	}
	if r.Fingerprint, err = idem.FingerprintFromBytes(fp); err != nil {
		return r, fmt.Errorf("idemmysql: read idempotency key: %w", err)
	}
	r.ID, r.Status = id, idemkey.Status(status)
	r.LockedUntil, r.CreatedAt, r.ExpiresAt = fromMicros(lockedUntil), fromMicros(createdAt), fromMicros(expireAt)
	return r, nil
}

// UpdateIdempotencyKeyTx overwrites the key r.ID with r when its token is still r.Token-1. An
// UPDATE reads the latest committed row whatever the isolation level, so of two requests that
// read one token only one can change it.
func (s *Store) UpdateIdempotencyKeyTx(ctx context.Context, tx *sql.Tx, r idemkey.Record) (bool, error) {
	res, err := tx.ExecContext(ctx, s.sub(httpKeyUpdate), r.Principal, r.Route, r.Key, r.Fingerprint[:],
		int(r.Status), r.Token, r.LockedUntil.UnixMicro(), r.CreatedAt.UnixMicro(), r.ExpiresAt.UnixMicro(),
		r.ResponseStatus, r.ResponseHeader, r.ResponseBody, r.ID[:], r.Token-1)
	if err != nil {
		return false, fmt.Errorf("idemmysql: update idempotency key: %w", err)
	}
	return keyAffected(res, "update idempotency key")
}

// DeleteIdempotencyKeyTx deletes the key id when its token is still token.
func (s *Store) DeleteIdempotencyKeyTx(ctx context.Context, tx *sql.Tx, id idemkey.KeyID, token int64) (bool, error) {
	res, err := tx.ExecContext(ctx, s.sub(httpKeyDelete), id[:], token)
	if err != nil {
		return false, fmt.Errorf("idemmysql: delete idempotency key: %w", err)
	}
	return keyAffected(res, "delete idempotency key")
}

// DeleteExpiredIdempotencyKeys deletes up to limit keys that expired before before, in one
// statement, and reports how many it deleted.
func (s *Store) DeleteExpiredIdempotencyKeys(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idemmysql: delete expired idempotency keys: limit is %d, want more than 0", limit)
	}
	res, err := s.db.ExecContext(ctx, s.sub(httpKeyDeleteExpired), before.UnixMicro(), limit)
	if err != nil {
		return 0, fmt.Errorf("idemmysql: delete idempotency keys expired before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("idemmysql: delete expired idempotency keys: rows affected: %w", err)
	}
	return int(n), nil
}

// keyAffected reports whether res changed a row; every change of a key row sets a new token,
// so the count does not depend on CLIENT_FOUND_ROWS.
func keyAffected(res sql.Result, what string) (bool, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("idemmysql: %s: rows affected: %w", what, err)
	}
	return n > 0, nil
}
