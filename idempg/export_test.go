package idempg

// QueueQueries returns the store's queue-table statements by name, for the tests that check
// their plans.
func (s *Store) QueueQueries() map[string]string {
	return map[string]string{
		"fetch":      s.q.queueFetch,
		"ack":        s.q.queueAck,
		"ackCommit":  s.q.queueAckCommit,
		"ackCommit1": s.q.queueAckCommit1,
		"nak":        s.q.queueNak,
		"extend":     s.q.queueExtend,
		"stats":      s.q.queueStats,
	}
}

// OutboxFetchQuery returns the relay's fetch statement, for the test that checks its plan.
func (s *Store) OutboxFetchQuery() string { return s.q.outboxFetch }
