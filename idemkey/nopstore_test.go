package idemkey_test

import (
	"context"
	"time"

	"github.com/idemkit/idem/idemkey"
)

// nopStore satisfies idemkey.Store for tests of New's validation, which never reach a store.
// The middleware's behaviour is tested against the real stores (storetest.ExerciseIdempotencyKeys).
type nopStore struct{}

func (nopStore) InTx(ctx context.Context, fn func(ctx context.Context, tx struct{}) error) error {
	return fn(ctx, struct{}{})
}
func (nopStore) InsertIdempotencyKeyTx(context.Context, struct{}, idemkey.Record) (bool, error) {
	return false, nil
}
func (nopStore) GetIdempotencyKeyTx(context.Context, struct{}, idemkey.KeyID) (idemkey.Record, error) {
	return idemkey.Record{}, nil
}
func (nopStore) UpdateIdempotencyKeyTx(context.Context, struct{}, idemkey.Record) (bool, error) {
	return false, nil
}
func (nopStore) DeleteIdempotencyKeyTx(context.Context, struct{}, idemkey.KeyID, int64) (bool, error) {
	return false, nil
}
func (nopStore) DeleteExpiredIdempotencyKeys(context.Context, time.Time, int) (int, error) {
	return 0, nil
}
