package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
)

// openStore opens the store named by the --store value v (or its default). Commands that only
// read or operate an existing store pass mustExist, so that a mistyped SQLite path is reported
// instead of silently creating an empty database.
func (e *env) openStore(ctx context.Context, v string, mustExist bool) (*connect.Stores, error) {
	return e.openStoreConns(ctx, v, mustExist, 4)
}

// openStoreConns is openStore with a bound on PostgreSQL connections, for the daemons.
func (e *env) openStoreConns(ctx context.Context, v string, mustExist bool, maxConns int32) (*connect.Stores, error) {
	dsn := e.resolveStore(v)
	if _, err := connect.ParseStore(dsn); err != nil {
		return nil, usageError{fmt.Errorf("--store: %w", err)}
	}
	s, err := connect.OpenStore(ctx, dsn, connect.Options{MaxConns: maxConns, MustExist: mustExist})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// storeErr explains the most common store failure of an operator command, a database that was
// never migrated, and names the store in every error.
func storeErr(s *connect.Stores, what string, err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	missing := errors.As(err, &pgErr) && pgErr.Code == "42P01" || // undefined_table
		strings.Contains(err.Error(), "no such table")
	if missing {
		return fmt.Errorf("%s: store %s has no idem tables (run idem migrate --store …): %w", what, s.URL, err)
	}
	return fmt.Errorf("%s (store %s): %w", what, s.URL, err)
}
