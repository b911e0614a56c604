package idem

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"syscall"
)

// Classifier decides whether an error is transient or permanent. It returns ClassUnknown for
// errors it does not recognise, so that classifiers can be chained.
type Classifier func(err error) Class

// Classify is the default classifier. In order: classes set with Permanent, Transient and
// RetryAfter; ErrKeyReuse, ErrInvalidPayload, ErrUnauthenticated, ErrTooOld and ErrNoRows are
// permanent; context deadlines, network timeouts, refused or reset connections and unexpected
// EOFs are transient; PostgreSQL SQLSTATE classes 08 (connection), 53 (insufficient resources)
// and codes 40001 (serialization failure), 40P01 (deadlock) and 57P01 (admin shutdown) are
// transient, other SQLSTATEs are permanent except as noted; JSON syntax and type errors are
// permanent. Anything else is ClassUnknown, which the consumer treats as transient unless
// ConsumerConfig.Failure.UnknownIsPermanent is set. A store adds its driver's codes (SQLite
// BUSY/LOCKED) through Store.ClassifyError.
func Classify(err error) Class {
	if err == nil {
		return ClassUnknown
	}
	var c *classified
	if errors.As(err, &c) {
		return c.class
	}
	switch {
	case errors.Is(err, ErrKeyReuse), errors.Is(err, ErrInvalidPayload),
		errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrTooOld), errors.Is(err, ErrNoRows):
		return ClassPermanent
	case errors.Is(err, ErrLeaseLost):
		return ClassTransient
	case errors.Is(err, context.DeadlineExceeded):
		return ClassTransient
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return ClassTransient
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return ClassTransient
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return ClassTransient
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return classifySQLState(st.SQLState())
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syn) || errors.As(err, &typ) {
		return ClassPermanent
	}
	return ClassUnknown
}

// classifySQLState maps a PostgreSQL SQLSTATE to a class: connection trouble, serialization
// failures, deadlocks, resource exhaustion and shutdowns pass; constraint violations and the
// like do not.
func classifySQLState(code string) Class {
	if len(code) != 5 {
		return ClassUnknown
	}
	switch code {
	case "40001", "40P01", "57P01", "57P02", "57P03", "55P03", "57014":
		// serialization_failure, deadlock_detected, admin_shutdown, crash_shutdown,
		// cannot_connect_now, lock_not_available, query_canceled (statement timeout)
		return ClassTransient
	}
	switch code[:2] {
	case "08", "53", "58":
		return ClassTransient
	}
	return ClassPermanent
}
