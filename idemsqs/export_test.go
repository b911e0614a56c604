package idemsqs

import "time"

// SetReceived backdates when d's message was received, so tests reach SQS's 12-hour bound.
func SetReceived(d *Delivery, at time.Time) { d.received = at }
