package idemtype

import "errors"

var (
	// ErrInvalidPayload reports a message that failed validation before its fields were used.
	ErrInvalidPayload = errors.New("idem: invalid payload")

	// ErrLeaseLost reports that a delivery's lease expired or was taken by another worker; the
	// handler's transaction is rolled back and the delivery is left to its new owner.
	ErrLeaseLost = errors.New("idem: lease lost")

	// ErrNotFound reports an id (dead letter, queue job) that does not exist.
	ErrNotFound = errors.New("idem: not found")
)
