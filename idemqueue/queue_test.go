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
	"github.com/idemkit/idem/idemstore"
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

func (s *slowStore) QueueFetch(ctx context.Context, p idemstore.QueueFetchParams) ([]idemstore.QueueJob, error) {
	s.mu.Lock()
	s.running++
	s.fetches++
	s.most = max(s.most, s.running)
	s.mu.Unlock()
	time.Sleep(s.delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	var jobs []idemstore.QueueJob
	for len(s.free) > 0 && len(jobs) < p.Max {
		id := s.free[0]
		s.free = s.free[1:]
		s.leased[id] = true
		jobs = append(jobs, idemstore.QueueJob{ID: id, Token: 1, Message: idem.Message{EventID: fmt.Sprint(id), Attempt: 1}})
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
func (s *slowStore) QueueNak(context.Context, idemstore.QueueNakParams) error {
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
func (s *slowStore) QueueStats(context.Context, string) (idemstore.QueueStats, error) {
	return idemstore.QueueStats{}, nil
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
	src, err := idemqueue.NewSource[struct{}](store, idemqueue.SourceConfig{Queue: "q", MaxWait: 10 * time.Millisecond, Prefetch: -1})
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

// TestPrefetch: a Receive leases Prefetch jobs beyond what it asked for and later Receives take
// them without a fetch of their own; what is still held is given back (released, its attempt
// taken back) by Close, or by the Source itself after a third of the lease.
func TestPrefetch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		lease time.Duration
		close bool
	}{
		{"given back by Close", time.Minute, true},
		{"given back after a third of the lease", 30 * time.Millisecond, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store := newSlowStore(100, 0)
			src, err := idemqueue.NewSource[struct{}](store, idemqueue.SourceConfig{Queue: "q", Lease: tt.lease, Prefetch: 4})
			require.NoError(t, err)
			ctx := context.Background()
			var got []string
			for range 3 {
				ds, err := src.Receive(ctx, 1)
				require.NoError(t, err)
				require.Len(t, ds, 1)
				got = append(got, ds[0].Message().EventID)
				require.NoError(t, ds[0].Ack(ctx))
			}
			require.Equal(t, []string{"1", "2", "3"}, got, "held jobs go out oldest first")
			// A Receive for more than is held takes the held jobs and fetches the rest.
			ds, err := src.Receive(ctx, 4)
			require.NoError(t, err)
			require.Len(t, ds, 4)
			require.Equal(t, "4", ds[0].Message().EventID)
			store.mu.Lock()
			fetches, leased := store.fetches, len(store.leased)
			store.mu.Unlock()
			require.Equal(t, 2, fetches, "one fetch of 1+4 jobs served the first four")
			require.Equal(t, 4+4, leased, "four received, four held ahead")
			if tt.close {
				require.NoError(t, src.Close())
			}
			require.Eventually(t, func() bool {
				store.mu.Lock()
				defer store.mu.Unlock()
				return len(store.leased) == 4
			}, 5*time.Second, time.Millisecond, "the held jobs are given back")
			store.mu.Lock()
			released, nakd := store.released, store.nakd
			store.mu.Unlock()
			require.Equal(t, 4, released)
			require.Zero(t, nakd, "given back by release, not nak")
		})
	}
}

// TestPrefetchRefill: while the queue has a backlog, a Receive that leaves fewer than half of
// Prefetch held starts a fetch of Prefetch more in the background, which the next Receives take
// from; without a backlog (the last fetch found fewer jobs than it asked for) it starts none.
// Close waits for a background fetch and gives back everything held.
func TestPrefetchRefill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	receive := func(t *testing.T, src *idemqueue.Source[struct{}]) string {
		t.Helper()
		ds, err := src.Receive(ctx, 1)
		require.NoError(t, err)
		require.Len(t, ds, 1)
		return ds[0].Message().EventID
	}
	counts := func(store *slowStore) (fetches, leased int) {
		store.mu.Lock()
		defer store.mu.Unlock()
		return store.fetches, len(store.leased)
	}

	t.Run("backlog", func(t *testing.T) {
		t.Parallel()
		store := newSlowStore(100, 5*time.Millisecond)
		src, err := idemqueue.NewSource[struct{}](store, idemqueue.SourceConfig{Queue: "q", Prefetch: 4})
		require.NoError(t, err)
		var got []string
		for range 3 { // a fetch of 1+4; then 3 held, then 2: half of Prefetch, no refill yet
			got = append(got, receive(t, src))
		}
		fetches, _ := counts(store)
		require.Equal(t, 1, fetches)
		got = append(got, receive(t, src)) // leaves 1 held: a fetch of 4 starts in the background
		require.Eventually(t, func() bool {
			f, l := counts(store)
			return f == 2 && l == 4+1+4
		}, 5*time.Second, time.Millisecond, "four received, one held, four fetched ahead in the background")
		for range 5 {
			got = append(got, receive(t, src))
		}
		require.Equal(t, []string{"1", "2", "3", "4", "5", "6", "7", "8", "9"}, got, "held jobs go out oldest first")
		require.NoError(t, src.Close())
		fetches, leased := counts(store)
		require.Equal(t, 9, leased, "only the received jobs stay leased after Close")
		require.GreaterOrEqual(t, fetches, 3, "taking the refill's jobs started another refill")
	})

	t.Run("no backlog", func(t *testing.T) {
		t.Parallel()
		store := newSlowStore(3, 0)
		src, err := idemqueue.NewSource[struct{}](store, idemqueue.SourceConfig{Queue: "q", Prefetch: 4})
		require.NoError(t, err)
		for range 3 {
			receive(t, src)
		}
		fetches, leased := counts(store)
		require.Equal(t, 1, fetches, "a fetch that found fewer jobs than it asked for starts no refill")
		require.Equal(t, 3, leased)
		require.NoError(t, src.Close())
	})
}
