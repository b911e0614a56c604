package idemqueue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
)

// slowStore is a queue store whose fetch takes a while (a busy single-writer database): it
// leases every job it returns until released, and records how many fetches ran at once.
type slowStore struct {
	delay time.Duration

	mu             sync.Mutex
	free           []int64 // ids not leased
	leased         map[int64]bool
	running, most  int
	fetches        int
	released, nakd int
}

func newSlowStore(n int, delay time.Duration) *slowStore {
	s := &slowStore{delay: delay, leased: map[int64]bool{}}
	for i := range n {
		s.free = append(s.free, int64(i+1))
	}
	return s
}

func (s *slowStore) QueueFetch(ctx context.Context, p idem.QueueFetchParams) ([]idem.QueueJob, error) {
	s.mu.Lock()
	s.running++
	s.fetches++
	s.most = max(s.most, s.running)
	s.mu.Unlock()
	time.Sleep(s.delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	var jobs []idem.QueueJob
	for len(s.free) > 0 && len(jobs) < p.Max {
		id := s.free[0]
		s.free = s.free[1:]
		s.leased[id] = true
		jobs = append(jobs, idem.QueueJob{ID: id, Token: 1, Message: idem.Message{EventID: fmt.Sprint(id), Attempt: 1}})
	}
	return jobs, nil
}

func (s *slowStore) QueueRelease(ctx context.Context, id, token int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.leased[id] {
		return idem.ErrLeaseLost
	}
	delete(s.leased, id)
	s.free = append(s.free, id)
	s.released++
	return nil
}

func (s *slowStore) QueueAck(ctx context.Context, id, token int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.leased[id] {
		return idem.ErrLeaseLost
	}
	delete(s.leased, id)
	return nil
}

func (s *slowStore) QueuePublish(context.Context, string, ...idem.Message) error { return nil }
func (s *slowStore) QueueNak(context.Context, idem.QueueNakParams) error {
	s.mu.Lock()
	s.nakd++
	s.mu.Unlock()
	return nil
}
func (s *slowStore) QueueExtend(context.Context, int64, int64, time.Duration) error { return nil }
func (s *slowStore) QueueWait(ctx context.Context, _ string, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (s *slowStore) QueueStats(context.Context, string) (idem.QueueStats, error) {
	return idem.QueueStats{}, nil
}
func (s *slowStore) QueuePublishTx(context.Context, struct{}, string, ...idem.Message) error {
	return nil
}
func (s *slowStore) QueueAckTx(ctx context.Context, _ struct{}, id, token int64) error {
	return s.QueueAck(ctx, id, token)
}

// TestReceivesThatGiveUpDoNotPileUpFetches: a receiving goroutine whose receives keep ending
// before the store's fetch returns (deadlines far below the fetch time) runs one fetch at a time:
// each receive takes over the fetch the previous one left; and once it stops, every job the last
// fetch leased is given back, so nothing stays leased to nobody.
func TestReceivesThatGiveUpDoNotPileUpFetches(t *testing.T) {
	t.Parallel()
	store := newSlowStore(100, 20*time.Millisecond)
	src, err := idemqueue.NewSource[struct{}](store, idemqueue.SourceConfig{Queue: "q", MaxWait: 10 * time.Millisecond})
	require.NoError(t, err)
	received := 0
	for range 50 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		ds, err := src.Receive(ctx, 5)
		cancel()
		if err == nil {
			require.LessOrEqual(t, len(ds), 5)
			for _, d := range ds {
				require.NoError(t, d.Ack(context.Background()))
			}
			received += len(ds)
		}
	}
	require.Eventually(t, func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return store.running == 0 && len(store.leased) == 0
	}, 5*time.Second, 5*time.Millisecond, "the last fetch's jobs are given back")
	store.mu.Lock()
	most, fetches, free, nakd := store.most, store.fetches, len(store.free), store.nakd
	store.mu.Unlock()
	require.Equal(t, 1, most, "one fetch at a time: each receive took over the one before")
	require.Less(t, fetches, 50, "receives took over fetches instead of starting their own")
	require.Equal(t, 100-received, free, "every job not received is free again")
	require.Zero(t, nakd, "given back by release, not nak")

	// A receive with a smaller max takes over a fetch for a larger one: the extra jobs go back.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	_, err = src.Receive(ctx, 10)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	ds, err := src.Receive(context.Background(), 3)
	require.NoError(t, err)
	require.Len(t, ds, 3)
	require.Eventually(t, func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return store.running == 0 && len(store.leased) == 3
	}, 5*time.Second, 5*time.Millisecond, "only the 3 received stay leased")
}
