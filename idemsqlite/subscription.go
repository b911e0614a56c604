package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
)

var _ idemstore.QueueSubscriptionStore = (*Store)(nil)

// subDeleteBatch bounds one statement of QueueUnsubscribe's job deletion, so that it holds the
// write lock briefly.
const subDeleteBatch = 1000

// QueueSubscribe registers subscription name on topic (idempotent): from its commit on, every
// message published to topic gets a job of its own in the queue idemstore.SubscriptionQueue(topic,
// name). Messages published before are not copied to it, as for a new subscriber of a broker.
func (s *Store) QueueSubscribe(ctx context.Context, topic, name string) error {
	if _, err := idemstore.SubscriptionQueue(topic, name); err != nil {
		return fmt.Errorf("idemsqlite: subscribe: %w", err)
	}
	if _, err := s.execWrite(ctx, s.q.subInsert, topic, name, time.Now().UnixMicro()); err != nil {
		return fmt.Errorf("idemsqlite: subscribe %q to queue topic %q: %w", name, topic, err)
	}
	return nil
}

// QueueUnsubscribe removes subscription name of topic, then deletes the jobs left in its queue,
// at most subDeleteBatch per statement, and reports how many it deleted. A job leased at that
// moment is deleted too: its ack then fails with idem.ErrLeaseLost.
func (s *Store) QueueUnsubscribe(ctx context.Context, topic, name string) (int, error) {
	queue, err := idemstore.SubscriptionQueue(topic, name)
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: unsubscribe: %w", err)
	}
	if _, err := s.execWrite(ctx, s.q.subDelete, topic, name); err != nil {
		return 0, fmt.Errorf("idemsqlite: unsubscribe %q from queue topic %q: %w", name, topic, err)
	}
	deleted := 0
	for {
		res, err := s.execWrite(ctx, s.q.subDeleteJobs, queue, subDeleteBatch)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil {
			return deleted, fmt.Errorf("idemsqlite: unsubscribe %q from queue topic %q: delete its jobs: %w", name, topic, err)
		}
		deleted += int(n)
		if n < subDeleteBatch {
			return deleted, nil
		}
	}
}

// publishTargets returns the queues a publish to queue inserts into, read inside tx: the queue of
// each subscription of the topic queue, or queue itself when it has none. One lookup per publish
// rather than per message keeps a publish to a topic without subscriptions as cheap as before.
// The lookup and the inserts share tx's snapshot, and SQLite serialises writers (a write
// committed after the lookup fails tx's first insert with SQLITE_BUSY), so they see one set of
// subscriptions.
func (s *Store) publishTargets(ctx context.Context, tx *sql.Tx, queue string) ([]string, error) {
	names, err := s.subscriptionNames(ctx, tx, queue)
	if err != nil {
		return nil, fmt.Errorf("subscriptions: %w", err)
	}
	if len(names) == 0 {
		return []string{queue}, nil
	}
	targets := make([]string, len(names))
	for i, name := range names {
		targets[i] = queue + idemstore.SubscriptionSeparator + name
	}
	return targets, nil
}

// QueueSubscriptions lists the subscriptions of topic, by name.
func (s *Store) QueueSubscriptions(ctx context.Context, topic string) ([]string, error) {
	names, err := s.subscriptionNames(ctx, s.db, topic)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: subscriptions of queue topic %q: %w", topic, err)
	}
	return names, nil
}

// subscriptionNames reads the subscription names of topic through q (the store's pool, or the
// publishing transaction so that the jobs follow the subscriptions it sees).
func (s *Store) subscriptionNames(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, topic string) ([]string, error) {
	rows, err := q.QueryContext(ctx, s.q.subList, topic)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		names = append(names, name)
	}
	return names, rows.Err()
}
