package idempg

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idemstore"
)

var _ idemstore.QueueSubscriptionStore = (*Store)(nil)

// subDeleteBatch bounds one statement of QueueUnsubscribe's job deletion.
const subDeleteBatch = 1000

// QueueSubscribe registers subscription name on topic (idempotent): from its commit on, every
// message published to topic gets a job of its own in the queue idemstore.SubscriptionQueue(topic,
// name). Messages published before are not copied to it, as for a new subscriber of a broker.
func (s *Store) QueueSubscribe(ctx context.Context, topic, name string) error {
	if _, err := idemstore.SubscriptionQueue(topic, name); err != nil {
		return fmt.Errorf("idempg: subscribe: %w", err)
	}
	if _, err := s.pool.Exec(ctx, s.q.subInsert, topic, name, time.Now().UTC()); err != nil {
		return fmt.Errorf("idempg: subscribe %q to queue topic %s: %w", name, topic, err)
	}
	return nil
}

// QueueUnsubscribe removes subscription name of topic, then deletes the jobs left in its queue,
// at most subDeleteBatch per statement, and reports how many it deleted. A job leased at that
// moment is deleted too: its ack then fails with idem.ErrLeaseLost.
func (s *Store) QueueUnsubscribe(ctx context.Context, topic, name string) (int, error) {
	queue, err := idemstore.SubscriptionQueue(topic, name)
	if err != nil {
		return 0, fmt.Errorf("idempg: unsubscribe: %w", err)
	}
	if _, err := s.pool.Exec(ctx, s.q.subDelete, topic, name); err != nil {
		return 0, fmt.Errorf("idempg: unsubscribe %q from queue topic %s: %w", name, topic, err)
	}
	deleted := 0
	for {
		tag, err := s.pool.Exec(ctx, s.q.subDeleteJobs, queue, subDeleteBatch)
		if err != nil {
			return deleted, fmt.Errorf("idempg: unsubscribe %q from queue topic %s: delete its jobs: %w", name, topic, err)
		}
		deleted += int(tag.RowsAffected())
		if tag.RowsAffected() < subDeleteBatch {
			return deleted, nil
		}
	}
}

// QueueSubscriptions lists the subscriptions of topic, by name.
func (s *Store) QueueSubscriptions(ctx context.Context, topic string) ([]string, error) {
	rows, err := s.pool.Query(ctx, s.q.subList, topic)
	if err != nil {
		return nil, fmt.Errorf("idempg: subscriptions of queue topic %s: %w", topic, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("idempg: subscriptions of queue topic %s: %w", topic, err)
	}
	return names, nil
}
