package idemwebhook

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// fakeStore is a small in-memory idemstore.Store for the package's unit tests: transactions run one
// at a time and commit claims and effects together. The store-backed tests (idemsqlite, idempg)
// live in cmd/idem/internal/webhooktest.
type fakeStore struct {
	mu      sync.Mutex
	claims  map[idem.Key]idem.Fingerprint
	effects []string
	dls     []idem.DeadLetter
	dlErr   error
}

// fakeTx collects one transaction's claims and effects until it commits.
type fakeTx struct {
	claims  map[idem.Key]idem.Fingerprint
	effects []string
}

// apply records an effect in tx.
func (tx *fakeTx) apply(effect string) { tx.effects = append(tx.effects, effect) }

var errFakeUnused = errors.New("fake store: not used by these tests")

func newFakeStore() *fakeStore { return &fakeStore{claims: map[idem.Key]idem.Fingerprint{}} }

func (s *fakeStore) Dialect() string { return "fake" }

func (s *fakeStore) InTx(ctx context.Context, fn func(ctx context.Context, tx *fakeTx) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	tx := &fakeTx{claims: map[idem.Key]idem.Fingerprint{}}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	for k, fp := range tx.claims {
		s.claims[k] = fp
	}
	s.effects = append(s.effects, tx.effects...)
	return nil
}

func (s *fakeStore) ClaimTx(_ context.Context, tx *fakeTx, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	fp, ok := s.claims[p.Key]
	if !ok {
		fp, ok = tx.claims[p.Key]
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

func (s *fakeStore) DeleteExpiredClaims(context.Context, idemstore.DeleteExpiredClaimsParams) (int, error) {
	return 0, errFakeUnused
}

func (s *fakeStore) ClassifyError(error) idem.Class { return idem.ClassUnknown }

func (s *fakeStore) InsertDeadLetter(_ context.Context, dl idem.DeadLetter) (idem.DeadLetter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dlErr != nil {
		return idem.DeadLetter{}, s.dlErr
	}
	dl.ID = int64(len(s.dls) + 1)
	s.dls = append(s.dls, dl)
	return dl, nil
}

func (s *fakeStore) GetDeadLetter(context.Context, int64) (idem.DeadLetter, error) {
	return idem.DeadLetter{}, errFakeUnused
}

func (s *fakeStore) ListDeadLetters(context.Context, idemstore.DeadLetterFilter) ([]idem.DeadLetter, error) {
	return nil, errFakeUnused
}

func (s *fakeStore) SetDeadLetterStatus(context.Context, idemstore.SetDeadLetterStatusParams) ([]int64, error) {
	return nil, errFakeUnused
}

func (s *fakeStore) RecordRecovery(context.Context, idem.Key, int64, time.Time) ([]time.Duration, error) {
	return nil, errFakeUnused
}

func (s *fakeStore) ListAudit(context.Context, int) ([]idemstore.AuditEntry, error) {
	return nil, errFakeUnused
}

func (s *fakeStore) DeadLetterStats(context.Context) (idemstore.DeadLetterStats, error) {
	return idemstore.DeadLetterStats{}, errFakeUnused
}

// snapshot returns the committed effects, claims and dead letters.
func (s *fakeStore) snapshot() (effects []string, claims int, dls []idem.DeadLetter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.effects...), len(s.claims), append([]idem.DeadLetter(nil), s.dls...)
}
