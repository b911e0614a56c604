// Package idemtest helps users unit-test their idem handlers and consumers, in the spirit of
// River's rivertest: run a handler or Consumer.ProcessTx in a transaction that is always rolled
// back (Rollback, ProcessRollback), build messages with sensible defaults (Message), see what a
// handler enqueued in its transaction (Outbox), record what was published (Sink), and drive
// Consumer.Run from memory (Source).
//
// It is not a conformance suite: packages storetest, transporttest and consumertest check
// implementations of idem's interfaces; idemtest is for the code that uses them.
package idemtest

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idem"
)

// TxRunner runs a function in a transaction and commits it when the function returns nil, rolls
// it back otherwise. Every idemstore.Store satisfies it (idempg.Store with pgx.Tx, idemsqlite.Store
// with *sql.Tx), so the test kit stays generic over the transaction type.
type TxRunner[TTx any] interface {
	InTx(ctx context.Context, fn func(ctx context.Context, tx TTx) error) error
}

// errRollback is what Rollback returns to InTx so that the transaction never commits.
var errRollback = errors.New("idemtest: rolled back on purpose")

// Rollback runs fn in a transaction of db that is always rolled back, whatever fn returns, and
// returns fn's error (nil when fn succeeded). What fn wrote is visible inside the transaction
// and gone after, so a test can check a handler's effect without cleaning up. An error of db
// itself (the transaction could not begin) is returned as is.
func Rollback[TTx any](ctx context.Context, db TxRunner[TTx], fn func(ctx context.Context, tx TTx) error) error {
	var fnErr error
	ran := false
	err := db.InTx(ctx, func(ctx context.Context, tx TTx) error {
		ran = true
		fnErr = fn(ctx, tx)
		return errRollback
	})
	switch {
	case !ran:
		return err
	case err == nil:
		// The store committed although fn's transaction returned an error: the test must not
		// believe the database is untouched.
		return errors.Join(fnErr, errors.New("idemtest: the store committed a transaction that should have rolled back"))
	case !errors.Is(err, errRollback):
		return errors.Join(fnErr, err)
	}
	return fnErr
}

// ProcessRollback runs msg through c's full core path (Consumer.ProcessTx) in a transaction of
// db that is always rolled back. inspect, when not nil, runs in the same transaction after
// ProcessTx, so it sees the claim and the handler's effect; the result and error are those of
// ProcessTx. A failure of the transaction itself fails the test.
func ProcessRollback[TTx any](ctx context.Context, t testing.TB, c *idem.Consumer[TTx], db TxRunner[TTx], msg idem.Message, inspect func(ctx context.Context, tx TTx, res idem.Result)) (idem.Result, error) {
	t.Helper()
	var (
		res    idem.Result
		resErr error
	)
	err := Rollback(ctx, db, func(ctx context.Context, tx TTx) error {
		res = c.ProcessTx(ctx, tx, msg)
		resErr = res.Err
		if inspect != nil {
			inspect(ctx, tx, res)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("idemtest: ProcessRollback: %v", err)
	}
	return res, resErr
}
