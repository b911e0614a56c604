package idemsqs

import "time"

// SetReceived backdates when d's message was received, so tests reach SQS's 12-hour bound.
func SetReceived(d *Delivery, at time.Time) { d.received = at }

// SetLeaseUntil moves when d's lease passes, so tests reach a lost lease without waiting for it.
func SetLeaseUntil(d *Delivery, at time.Time) {
	d.mu.Lock()
	d.leaseUntil = at
	d.mu.Unlock()
}
