package idemtype

// Class says what to do with a failed delivery.
type Class int

const (
	// ClassUnknown is returned by classifiers that do not recognise an error.
	ClassUnknown Class = iota
	// ClassTransient errors are retried within the retry budget.
	ClassTransient
	// ClassPermanent errors go to the dead-letter queue at once.
	ClassPermanent
)

func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassPermanent:
		return "permanent"
	default:
		return "unknown"
	}
}
