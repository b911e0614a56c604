package idem

import "hash/fnv"

// OutboxPartitionsDefault is the default number of outbox partitions relays divide among
// themselves. It is fixed per database: changing it re-hashes ordering keys.
const OutboxPartitionsDefault = 16

// OutboxPartition returns the partition of an outgoing event: FNV-1a of its ordering key (its
// event id when the key is empty) modulo n. Events with the same key always share a partition,
// which one relay owns at a time, and that keeps them in order.
func OutboxPartition(o Outgoing, n int) int {
	if n <= 1 {
		return 0
	}
	k := o.Key
	if k == "" {
		k = o.EventID
	}
	h := fnv.New32a()
	h.Write([]byte(k))
	return int(h.Sum32() % uint32(n))
}
