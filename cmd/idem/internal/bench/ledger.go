package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// Ledger is the business effect of the PostgreSQL cases, in a schema: an append-only ledger row
// and a balance update per event, not idempotent by themselves. riverbench applies the same one
// in River's jobs, so that both sides of the comparison do the same work.
type Ledger struct {
	// Schema holds the tables; it must exist.
	Schema string
	// Wallets is how many wallets there are (ids 0 to Wallets-1).
	Wallets int
}

// Create creates the ledger and the wallets, every balance 0.
func (l Ledger) Create(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE `+l.Schema+`.wallets (id int PRIMARY KEY, balance bigint NOT NULL);
		CREATE TABLE `+l.Schema+`.ledger (id bigserial PRIMARY KEY, event_id text NOT NULL, wallet int NOT NULL, amount bigint NOT NULL);
		INSERT INTO `+l.Schema+`.wallets SELECT g, 0 FROM generate_series(0, `+fmt.Sprint(l.Wallets-1)+`) g`)
	return err
}

// Credit applies one event's effect in tx: its ledger row and its wallet's balance.
func (l Ledger) Credit(ctx context.Context, tx pgx.Tx, eventID string, wallet int) error {
	if _, err := tx.Exec(ctx, `INSERT INTO `+l.Schema+`.ledger (event_id, wallet, amount) VALUES ($1, $2, 1)`, eventID, wallet); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `UPDATE `+l.Schema+`.wallets SET balance = balance + 1 WHERE id = $1`, wallet)
	if err != nil {
		return err
	}
	return idem.ExpectRows(tag.RowsAffected(), 1)
}
