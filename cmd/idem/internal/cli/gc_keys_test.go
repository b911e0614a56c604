package cli

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemkey"
)

// TestGCIdempotencyKeys: gc deletes the Idempotency-Key middleware's keys past their own
// expiry, in batches, and keeps the others, with no flag.
func TestGCIdempotencyKeys(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			dsn := kind.dsn(t)
			st := openMigrated(t, dsn)
			now := time.Now()
			var expired []idemkey.Record
			for i := range 3 {
				r := keyRecordAt(fmt.Sprintf("old-%d", i), now.Add(-48*time.Hour))
				expired = append(expired, r)
				seedKey(t, st, r)
			}
			live := keyRecordAt("live", now)
			seedKey(t, st, live)

			r := idemCLI(t, "gc", "--store", dsn, "--batch", "2", "--json")
			requireOK(t, r)
			var res struct {
				Keys int `json:"idempotency_keys_deleted"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
			require.Equal(t, 3, res.Keys)
			for _, k := range expired {
				require.False(t, keyExists(t, st, k.ID), "%s deleted", k.Key)
			}
			require.True(t, keyExists(t, st, live.ID), "a key within its retention stays")

			r = idemCLI(t, "gc", "--store", dsn)
			requireOK(t, r)
			require.Contains(t, r.stdout, "deleted 0 expired idempotency keys")
		})
	}
}

// keyRecordAt is a completed key created at, expiring a day later.
func keyRecordAt(key string, at time.Time) idemkey.Record {
	return idemkey.Record{
		ID: idemkey.NewKeyID("alice", "POST /orders", key), Principal: "alice", Route: "POST /orders", Key: key,
		Fingerprint: idem.Fingerprint{1}, Status: idemkey.StatusCompleted, Token: 2,
		LockedUntil: at.Add(time.Minute), CreatedAt: at, ExpiresAt: at.Add(24 * time.Hour), ResponseStatus: 201,
	}
}

// seedKey inserts r into whichever store st opened.
func seedKey(t *testing.T, st *connect.Stores, r idemkey.Record) {
	t.Helper()
	switch {
	case st.SQLite != nil:
		require.NoError(t, insertKey[*sql.Tx](st.SQLite, r))
	case st.Postgres != nil:
		require.NoError(t, insertKey[pgx.Tx](st.Postgres, r))
	case st.MySQL != nil:
		require.NoError(t, insertKey[*sql.Tx](st.MySQL, r))
	}
}

func insertKey[TTx any](s idemkey.Store[TTx], r idemkey.Record) error {
	return s.InTx(context.Background(), func(ctx context.Context, tx TTx) error {
		ok, err := s.InsertIdempotencyKeyTx(ctx, tx, r)
		if err == nil && !ok {
			err = errors.New("key exists")
		}
		return err
	})
}

// keyExists reports whether the key id is still stored.
func keyExists(t *testing.T, st *connect.Stores, id idemkey.KeyID) bool {
	t.Helper()
	var err error
	switch {
	case st.SQLite != nil:
		err = getKey[*sql.Tx](st.SQLite, id)
	case st.Postgres != nil:
		err = getKey[pgx.Tx](st.Postgres, id)
	case st.MySQL != nil:
		err = getKey[*sql.Tx](st.MySQL, id)
	}
	if errors.Is(err, idem.ErrNotFound) {
		return false
	}
	require.NoError(t, err)
	return true
}

func getKey[TTx any](s idemkey.Store[TTx], id idemkey.KeyID) error {
	return s.InTx(context.Background(), func(ctx context.Context, tx TTx) error {
		_, err := s.GetIdempotencyKeyTx(ctx, tx, id)
		return err
	})
}
