package demo

import (
	"strconv"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// headerOrder carries the order index on every message, so that the misbehaviour wrappers
// find an order's plan and the verdict a dead letter's order; headers are not part of the
// fingerprint.
const headerOrder = payments.HeaderOrder

// orderOf returns the order index a message carries in its headerOrder header, or -1.
func orderOf(headers map[string]string, n int) int {
	s, ok := headers[headerOrder]
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= n {
		return -1
	}
	return i
}
