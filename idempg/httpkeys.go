package idempg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemkey"
)

var _ idemkey.Store[pgx.Tx] = (*Store)(nil)

// The statements of the idempotency keys table (migration 070); {{keys}} is the table.
const (
	httpKeyColumns = `id, principal, route, idem_key, fingerprint, status, token, locked_until,
		created_at, expires_at, response_status, response_header, response_body`
	httpKeyInsert = `INSERT INTO {{keys}} (` + httpKeyColumns + `)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) ON CONFLICT (id) DO NOTHING`
	httpKeySelect = `SELECT ` + httpKeyColumns + ` FROM {{keys}} WHERE id = $1`
	httpKeyUpdate = `UPDATE {{keys}} SET principal = $2, route = $3, idem_key = $4, fingerprint = $5,
		status = $6, token = $7, locked_until = $8, created_at = $9, expires_at = $10,
		response_status = $11, response_header = $12, response_body = $13
		WHERE id = $1 AND token = $14`
	httpKeyDelete        = `DELETE FROM {{keys}} WHERE id = $1 AND token = $2`
	httpKeyDeleteExpired = `DELETE FROM {{keys}} WHERE ctid = ANY (ARRAY (
		SELECT ctid FROM {{keys}} WHERE expires_at < $1 LIMIT $2))`
)

// keysSQL puts the keys table of the store's schema and prefix into q.
func (s *Store) keysSQL(q string) string {
	return strings.ReplaceAll(q, "{{keys}}", `"`+s.cfg.Schema+`"."`+s.cfg.Prefix+`http_keys"`)
}

// InsertIdempotencyKeyTx inserts r inside tx unless its id exists, and reports whether it did.
func (s *Store) InsertIdempotencyKeyTx(ctx context.Context, tx pgx.Tx, r idemkey.Record) (bool, error) {
	tag, err := tx.Exec(ctx, s.keysSQL(httpKeyInsert), r.ID[:], r.Principal, r.Route, r.Key, r.Fingerprint[:],
		int16(r.Status), r.Token, r.LockedUntil, r.CreatedAt, r.ExpiresAt, r.ResponseStatus, r.ResponseHeader, r.ResponseBody)
	if err != nil {
		return false, fmt.Errorf("idempg: insert idempotency key: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// GetIdempotencyKeyTx reads the key id inside tx, or an error wrapping idem.ErrNotFound.
func (s *Store) GetIdempotencyKeyTx(ctx context.Context, tx pgx.Tx, id idemkey.KeyID) (idemkey.Record, error) {
	var (
		r       idemkey.Record
		rid, fp []byte
		status  int16
	)
	err := tx.QueryRow(ctx, s.keysSQL(httpKeySelect), id[:]).Scan(&rid, &r.Principal, &r.Route, &r.Key, &fp,
		&status, &r.Token, &r.LockedUntil, &r.CreatedAt, &r.ExpiresAt, &r.ResponseStatus, &r.ResponseHeader, &r.ResponseBody)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("idempg: idempotency key %x: %w", id[:6], idem.ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("idempg: read idempotency key: %w", err)
	}
	if r.Fingerprint, err = idem.FingerprintFromBytes(fp); err != nil {
		return r, fmt.Errorf("idempg: read idempotency key: %w", err)
	}
	r.ID, r.Status = id, idemkey.Status(status)
	r.LockedUntil, r.CreatedAt, r.ExpiresAt = r.LockedUntil.UTC(), r.CreatedAt.UTC(), r.ExpiresAt.UTC()
	return r, nil
}

// UpdateIdempotencyKeyTx overwrites the key r.ID with r when its token is still r.Token-1. The
// UPDATE waits for a transaction that changed the row and then re-checks the token against
// the committed row, so of two requests that read one token only one can change it.
func (s *Store) UpdateIdempotencyKeyTx(ctx context.Context, tx pgx.Tx, r idemkey.Record) (bool, error) {
	tag, err := tx.Exec(ctx, s.keysSQL(httpKeyUpdate), r.ID[:], r.Principal, r.Route, r.Key, r.Fingerprint[:],
		int16(r.Status), r.Token, r.LockedUntil, r.CreatedAt, r.ExpiresAt, r.ResponseStatus, r.ResponseHeader, r.ResponseBody,
		r.Token-1)
	if err != nil {
		return false, fmt.Errorf("idempg: update idempotency key: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// DeleteIdempotencyKeyTx deletes the key id when its token is still token.
func (s *Store) DeleteIdempotencyKeyTx(ctx context.Context, tx pgx.Tx, id idemkey.KeyID, token int64) (bool, error) {
	tag, err := tx.Exec(ctx, s.keysSQL(httpKeyDelete), id[:], token)
	if err != nil {
		return false, fmt.Errorf("idempg: delete idempotency key: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// DeleteExpiredIdempotencyKeys deletes up to limit keys that expired before before, in one
// statement, and reports how many it deleted.
func (s *Store) DeleteExpiredIdempotencyKeys(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idempg: delete expired idempotency keys: limit is %d, want more than 0", limit)
	}
	tag, err := s.pool.Exec(ctx, s.keysSQL(httpKeyDeleteExpired), before, limit)
	if err != nil {
		return 0, fmt.Errorf("idempg: delete idempotency keys expired before %s: %w", before.UTC().Format(time.RFC3339), err)
	}
	return int(tag.RowsAffected()), nil
}
