package idempg

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// waitMaxDefault bounds a QueueWait or OutboxWait called with max <= 0.
	waitMaxDefault = time.Second
	// listenBackoffMin and listenBackoffMax bound the pause before the listener reconnects.
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
	// closeTimeout bounds closing the listening connection.
	closeTimeout = 5 * time.Second
)

// waitKey names what a waiter waits for: a queue's publishes, or the outbox's.
type waitKey struct {
	outbox bool
	queue  string
}

// listener is the one LISTEN connection a Store shares among all its QueueWait and OutboxWait
// callers, however many workers and relays wait. It starts with the first wait, reconnects
// with backoff when the connection drops, and stops with Store.Close.
//
// Waiters of one key share a channel; a notification closes it (waking them all at once) and
// the next waiter makes a fresh one. Waiters never depend on the connection: without it they
// sleep their max, which is the polling fallback.
type listener struct {
	pool *pgxpool.Pool
	q    *queries

	mu      sync.Mutex
	waiters map[waitKey]chan struct{}
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
}

func newListener(pool *pgxpool.Pool, q queries) *listener {
	return &listener{pool: pool, q: &q, waiters: make(map[waitKey]chan struct{})}
}

// wait blocks until key is notified, max elapses (waitMaxDefault when max <= 0) or ctx ends;
// only the last returns an error, ctx.Err().
func (l *listener) wait(ctx context.Context, key waitKey, max time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if max <= 0 {
		max = waitMaxDefault
	}
	ch := l.subscribe(key)
	t := time.NewTimer(max)
	defer t.Stop()
	select {
	case <-ch: // nil after close: only the timer or ctx end the wait
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// subscribe returns the channel the next notification of key closes, starting the listening
// goroutine on first use. After close it returns nil.
func (l *listener) subscribe(key waitKey) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.pool == nil {
		return nil
	}
	if !l.started {
		l.started = true
		ctx, cancel := context.WithCancel(context.Background())
		l.cancel, l.done = cancel, make(chan struct{})
		go l.run(ctx)
	}
	ch := l.waiters[key]
	if ch == nil {
		ch = make(chan struct{})
		l.waiters[key] = ch
	}
	return ch
}

// wake wakes the waiters of key.
func (l *listener) wake(key waitKey) {
	l.mu.Lock()
	if ch := l.waiters[key]; ch != nil {
		close(ch)
		delete(l.waiters, key)
	}
	l.mu.Unlock()
}

// wakeAll wakes every waiter: after a (re)connect, since notifications sent while nobody was
// listening are lost, and on close.
func (l *listener) wakeAll() {
	l.mu.Lock()
	for key, ch := range l.waiters {
		close(ch)
		delete(l.waiters, key)
	}
	l.mu.Unlock()
}

// close stops the listening goroutine, if it runs, and waits for it.
func (l *listener) close() {
	l.mu.Lock()
	l.closed = true
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	l.wakeAll()
}

// run listens until ctx ends, reconnecting with capped exponential backoff.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	backoff := listenBackoffMin
	for {
		connected, _ := l.listen(ctx)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = listenBackoffMin
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// listen takes a connection out of the pool (Hijack: a connection in LISTEN state must never
// serve other queries, and the pool's Close must not wait for it), listens on both channels
// and dispatches notifications until the connection fails or ctx ends. It reports whether it
// got as far as listening.
func (l *listener) listen(ctx context.Context) (bool, error) {
	pc, err := l.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	for _, stmt := range []string{l.q.listenQueue, l.q.listenOutbox} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return false, err
		}
	}
	l.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		l.dispatch(n.Channel, n.Payload)
	}
}

// dispatch wakes the waiters a notification concerns. A queue notification carries the queue
// name as payload.
func (l *listener) dispatch(channel, payload string) {
	switch channel {
	case l.q.queueChannel:
		l.wake(waitKey{queue: payload})
	case l.q.outboxChannel:
		l.wake(waitKey{outbox: true})
	}
}
