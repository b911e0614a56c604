package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// memStore is the smallest store the root package's tests need: claims that commit or roll
// back with their transaction, and dead letters kept in a slice. InsertDeadLetter fails while
// failDeadLetters is set, and refuses what PostgreSQL refuses (NUL, invalid UTF-8, an index
// entry above 2700 bytes), so the runtime's side of those faults shows without a database.
type memStore struct {
	mu     sync.Mutex
	claims map[idem.Key]idem.Fingerprint
	// held maps a key claimed by a transaction still open to that transaction's end: a claim of
	// the same key elsewhere waits for it, as a unique index makes a second insert wait.
	held map[idem.Key]chan struct{}
	// claimCalls counts ClaimTx calls, made or waiting.
	claimCalls  int
	claimedAt   map[idem.Key]time.Time
	deadLetters []idem.DeadLetter
	// failDeadLetters makes InsertDeadLetter fail while it holds.
	failDeadLetters bool
	dlCalls         int
	// gcCalls counts DeleteExpiredClaims calls; failGC makes them fail.
	gcCalls int
	failGC  error
}

type memTx struct {
	claims    map[idem.Key]idem.Fingerprint
	claimedAt map[idem.Key]time.Time
	// done is closed when the transaction commits or rolls back.
	done chan struct{}
}

var _ idemstore.Store[*memTx] = (*memStore)(nil)

func newMemStore() *memStore {
	return &memStore{claims: map[idem.Key]idem.Fingerprint{}, claimedAt: map[idem.Key]time.Time{}, held: map[idem.Key]chan struct{}{}}
}

func (s *memStore) Dialect() string { return "memory" }

func (s *memStore) InTx(ctx context.Context, fn func(ctx context.Context, tx *memTx) error) error {
	tx := &memTx{claims: map[idem.Key]idem.Fingerprint{}, claimedAt: map[idem.Key]time.Time{}, done: make(chan struct{})}
	err := fn(ctx, tx)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, fp := range tx.claims {
		if err == nil {
			s.claims[k] = fp
			s.claimedAt[k] = tx.claimedAt[k]
		}
		delete(s.held, k)
	}
	close(tx.done)
	return err
}

func (s *memStore) ClaimTx(ctx context.Context, tx *memTx, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if err := pgStorable(p.Key.Tenant, p.Key.Consumer, p.Key.EventID); err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("memstore: claim: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claimCalls++
	for {
		fp, ok := tx.claims[p.Key]
		if !ok {
			fp, ok = s.claims[p.Key]
		}
		if ok {
			if fp == p.Fingerprint {
				return idemstore.ClaimResult{Status: idemstore.ClaimDuplicate, Existing: fp}, nil
			}
			return idemstore.ClaimResult{Status: idemstore.ClaimConflict, Existing: fp}, nil
		}
		other, held := s.held[p.Key]
		if !held {
			break
		}
		// Another open transaction holds the key: wait until it commits (a duplicate then) or
		// rolls back (the key is free again).
		s.mu.Unlock()
		select {
		case <-other:
		case <-ctx.Done():
			s.mu.Lock()
			return idemstore.ClaimResult{}, fmt.Errorf("memstore: claim: %w", ctx.Err())
		}
		s.mu.Lock()
	}
	tx.claims[p.Key] = p.Fingerprint
	tx.claimedAt[p.Key] = p.Now
	s.held[p.Key] = tx.done
	return idemstore.ClaimResult{Status: idemstore.ClaimNew}, nil
}

func (s *memStore) claimCallCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claimCalls
}

func (s *memStore) claimed(k idem.Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.claims[k]
	return ok
}

// DeleteExpiredClaims deletes up to p.Limit claims of p.Consumer (all when empty) made before
// p.Before, as the SQL stores do.
func (s *memStore) DeleteExpiredClaims(_ context.Context, p idemstore.DeleteExpiredClaimsParams) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gcCalls++
	if s.failGC != nil {
		return 0, s.failGC
	}
	n := 0
	for k, at := range s.claimedAt {
		if n == p.Limit {
			break
		}
		if (p.Consumer == "" || k.Consumer == p.Consumer) && at.Before(p.Before) {
			delete(s.claims, k)
			delete(s.claimedAt, k)
			n++
		}
	}
	return n, nil
}

// addClaim stores a committed claim made at at.
func (s *memStore) addClaim(k idem.Key, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims[k] = idem.Fingerprint{1}
	s.claimedAt[k] = at
}

func (s *memStore) claimCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.claims)
}

func (s *memStore) gcStats() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gcCalls
}

func (s *memStore) setFailGC(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failGC = err
}

func (s *memStore) ClassifyError(error) idem.Class { return idem.ClassUnknown }

// pgStorable refuses what PostgreSQL's text columns and B-tree indexes refuse.
func pgStorable(fields ...string) error {
	total := 0
	for _, f := range fields {
		for i := 0; i < len(f); i++ {
			if f[i] == 0 {
				return errors.New("invalid byte sequence for encoding \"UTF8\": 0x00 (SQLSTATE 22021)")
			}
		}
		total += len(f)
	}
	if total > 2700 {
		return fmt.Errorf("index row size %d exceeds btree maximum 2704 (SQLSTATE 54000)", total)
	}
	return nil
}

func (s *memStore) InsertDeadLetter(ctx context.Context, dl idem.DeadLetter) (idem.DeadLetter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dlCalls++
	if s.failDeadLetters {
		return idem.DeadLetter{}, errors.New("memstore: connection refused")
	}
	m := dl.Message
	if err := pgStorable(dl.Consumer, m.Tenant, m.EventID); err != nil {
		return idem.DeadLetter{}, fmt.Errorf("memstore: insert dead letter: %w", err)
	}
	if err := pgStorable(m.Type); err != nil {
		return idem.DeadLetter{}, fmt.Errorf("memstore: insert dead letter: %w", err)
	}
	for k, v := range m.Headers { // headers are not indexed: only NUL is refused (jsonb)
		if strings.ContainsRune(k+v, 0) {
			return idem.DeadLetter{}, errors.New("memstore: insert dead letter headers: unsupported Unicode escape sequence \\u0000 (SQLSTATE 22P05)")
		}
	}
	for i, old := range s.deadLetters {
		if old.Status == idem.DeadLetterPending && old.Consumer == dl.Consumer && old.Message.Tenant == m.Tenant &&
			old.Message.EventID == m.EventID && old.Fingerprint == dl.Fingerprint {
			dl.ID, dl.FirstFailed = old.ID, old.FirstFailed
			s.deadLetters[i] = dl
			return dl, nil
		}
	}
	dl.ID = int64(len(s.deadLetters) + 1)
	s.deadLetters = append(s.deadLetters, dl)
	return dl, nil
}

func (s *memStore) setFailDeadLetters(v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failDeadLetters = v
}

func (s *memStore) dls() []idem.DeadLetter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]idem.DeadLetter(nil), s.deadLetters...)
}

func (s *memStore) GetDeadLetter(ctx context.Context, id int64) (idem.DeadLetter, error) {
	for _, dl := range s.dls() {
		if dl.ID == id {
			return dl, nil
		}
	}
	return idem.DeadLetter{}, fmt.Errorf("memstore: dead letter %d: %w", id, idem.ErrNotFound)
}

func (s *memStore) ListDeadLetters(ctx context.Context, f idemstore.DeadLetterFilter) ([]idem.DeadLetter, error) {
	return s.dls(), nil
}

func (s *memStore) SetDeadLetterStatus(context.Context, idemstore.SetDeadLetterStatusParams) ([]int64, error) {
	return nil, errors.New("memstore: not supported")
}

func (s *memStore) RecordRecovery(context.Context, idem.Key, int64, time.Time) ([]time.Duration, error) {
	return nil, nil
}

func (s *memStore) ListAudit(context.Context, int) ([]idemstore.AuditEntry, error) { return nil, nil }

func (s *memStore) DeadLetterStats(context.Context) (idemstore.DeadLetterStats, error) {
	return idemstore.DeadLetterStats{}, nil
}
