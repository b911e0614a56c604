package idemmysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemkit/idem/idemstore"
)

var _ idemstore.QueueSubscriptionStore = (*Store)(nil)

// subDeleteBatch bounds one statement of QueueUnsubscribe's job deletion.
const subDeleteBatch = 1000

// QueueSubscribe registers subscription name on topic (idempotent): from its commit on, every
// message published to topic gets a job of its own in the queue idemstore.SubscriptionQueue(topic,
// name), which must fit the queue column's 256 bytes. Messages published before are not copied
// to it, as for a new subscriber of a broker.
func (s *Store) QueueSubscribe(ctx context.Context, topic, name string) error {
	queue, err := idemstore.SubscriptionQueue(topic, name)
	if err != nil {
		return fmt.Errorf("idemmysql: subscribe: %w", err)
	}
	if len(queue) > 256 {
		return fmt.Errorf("idemmysql: subscribe %q to queue topic %q: its queue %q has %d bytes, more than 256", name, topic, queue, len(queue))
	}
	if _, err := s.db.ExecContext(ctx, s.q.subInsert, []byte(topic), []byte(name), time.Now().UnixMicro()); err != nil {
		return fmt.Errorf("idemmysql: subscribe %q to queue topic %q: %w", name, topic, err)
	}
	return nil
}

// QueueUnsubscribe removes subscription name of topic, then deletes the jobs left in its queue,
// at most subDeleteBatch per statement, and reports how many it deleted. A job leased at that
// moment is deleted too: its ack then fails with idem.ErrLeaseLost.
func (s *Store) QueueUnsubscribe(ctx context.Context, topic, name string) (int, error) {
	queue, err := idemstore.SubscriptionQueue(topic, name)
	if err != nil {
		return 0, fmt.Errorf("idemmysql: unsubscribe: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, s.q.subDelete, []byte(topic), []byte(name)); err != nil {
		return 0, fmt.Errorf("idemmysql: unsubscribe %q from queue topic %q: %w", name, topic, err)
	}
	deleted := 0
	for {
		res, err := s.db.ExecContext(ctx, s.q.subDeleteJobs, []byte(queue), subDeleteBatch)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil {
			return deleted, fmt.Errorf("idemmysql: unsubscribe %q from queue topic %q: delete its jobs: %w", name, topic, err)
		}
		deleted += int(n)
		if n < subDeleteBatch {
			return deleted, nil
		}
	}
}

// publishTargets returns the queues a publish to queue inserts into, read inside tx: the queue of
// each subscription of the topic queue, or queue itself when it has none. One lookup per publish
// rather than per message keeps a publish to a topic without subscriptions as cheap as before;
// it is a consistent (non-locking) read, so it never blocks a QueueSubscribe, and the inserts
// follow the one set of subscriptions it saw.
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
		return nil, fmt.Errorf("idemmysql: subscriptions of queue topic %q: %w", topic, err)
	}
	return names, nil
}

// subscriptionNames reads the subscription names of topic through q (the store's pool, or the
// publishing transaction so that the jobs follow the subscriptions it sees).
func (s *Store) subscriptionNames(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, topic string) ([]string, error) {
	rows, err := q.QueryContext(ctx, s.q.subList, []byte(topic))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var name []byte
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		names = append(names, string(name))
	}
	return names, rows.Err()
}
