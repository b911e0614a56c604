package idemtest_test

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// memStore is a minimal idemstore.Store whose transactions hold claims and handler effects until
// commit, so the tests can see what a rollback leaves behind.
type memStore struct {
	mu      sync.Mutex
	claims  map[idem.Key]idem.Fingerprint
	effects []string
	// beginErr, when set, makes InTx fail before fn runs.
	beginErr error
	// commitAnyway makes InTx commit even when fn fails, as a broken store would.
	commitAnyway bool
}

type memTx struct {
	claims  map[idem.Key]idem.Fingerprint
	effects []string
}

func newMemStore() *memStore { return &memStore{claims: map[idem.Key]idem.Fingerprint{}} }

func (s *memStore) Dialect() string { return "memory" }

func (s *memStore) InTx(ctx context.Context, fn func(ctx context.Context, tx *memTx) error) error {
	if s.beginErr != nil {
		return s.beginErr
	}
	tx := &memTx{claims: map[idem.Key]idem.Fingerprint{}}
	if err := fn(ctx, tx); err != nil && !s.commitAnyway {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	maps.Copy(s.claims, tx.claims)
	s.effects = append(s.effects, tx.effects...)
	return nil
}

func (s *memStore) ClaimTx(ctx context.Context, tx *memTx, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fp, ok := tx.claims[p.Key]
	if !ok {
		fp, ok = s.claims[p.Key]
	}
	switch {
	case !ok:
		tx.claims[p.Key] = p.Fingerprint
		return idemstore.ClaimResult{Status: idemstore.ClaimNew}, nil
	case fp == p.Fingerprint:
		return idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: fp}, nil
	}
	return idemstore.ClaimResult{Status: idemstore.ClaimConflict, Existing: fp}, nil
}

func (s *memStore) committed() (claims int, effects []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.claims), append([]string(nil), s.effects...)
}

func (s *memStore) DeleteExpiredClaims(context.Context, idemstore.DeleteExpiredClaimsParams) (int, error) {
	return 0, nil
}
func (s *memStore) ClassifyError(error) idem.Class { return idem.ClassUnknown }
func (s *memStore) InsertDeadLetter(_ context.Context, dl idem.DeadLetter) (idem.DeadLetter, error) {
	return dl, nil
}
func (s *memStore) GetDeadLetter(context.Context, int64) (idem.DeadLetter, error) {
	return idem.DeadLetter{}, idem.ErrNotFound
}
func (s *memStore) ListDeadLetters(context.Context, idemstore.DeadLetterFilter) ([]idem.DeadLetter, error) {
	return nil, nil
}
func (s *memStore) SetDeadLetterStatus(context.Context, idemstore.SetDeadLetterStatusParams) ([]int64, error) {
	return nil, nil
}
func (s *memStore) RecordRecovery(context.Context, idem.Key, int64, time.Time) ([]time.Duration, error) {
	return nil, nil
}
func (s *memStore) ListAudit(context.Context, int) ([]idemstore.AuditEntry, error) { return nil, nil }
func (s *memStore) DeadLetterStats(context.Context) (idemstore.DeadLetterStats, error) {
	return idemstore.DeadLetterStats{}, nil
}
