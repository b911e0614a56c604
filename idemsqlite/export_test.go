package idemsqlite

// QueueQueries returns the store's queue-table statements by name, for the tests that check
// their plans.
func (s *Store) QueueQueries() map[string]string {
	return map[string]string{
		"fetch":   s.q.queueFetch,
		"ack":     s.q.queueAck,
		"nak":     s.q.queueNak,
		"extend":  s.q.queueExtend,
		"release": s.q.queueRelease,
		"stats":   s.q.queueStats,
	}
}
