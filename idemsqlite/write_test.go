package idemsqlite_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemsqlite"
)

// TestWritesHandTheConnectionOn: concurrent writes of one store pass the connection (busy wait
// off) from one to the next instead of returning it to the pool each time; readers of the same
// *sql.DB still get it meanwhile, and once the writes are over it is back in the pool with its
// busy timeout restored.
func TestWritesHandTheConnectionOn(t *testing.T) {
	t.Parallel()
	b := setup(t, idemsqlite.Config{})
	const writers, writes = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers*writes+writes)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range writes {
				errs <- b.store.QueuePublish(b.ctx, "q", msgs(fmt.Sprintf("w%d-%d", w, i))...)
			}
		}()
	}
	wg.Add(1)
	go func() { // a reader of the same pool, between the writes
		defer wg.Done()
		for range writes {
			_, err := b.store.QueueStats(b.ctx, "q")
			errs <- err
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st, err := b.store.QueueStats(b.ctx, "q")
	require.NoError(t, err)
	require.EqualValues(t, writers*writes, st.Backlog)
	var ms int64
	require.NoError(t, b.db.QueryRowContext(b.ctx, `PRAGMA busy_timeout`).Scan(&ms))
	require.Equal(t, idemsqlite.BusyTimeoutDefault.Milliseconds(), ms, "the connection is back in the pool with its busy timeout")
}
