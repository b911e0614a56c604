// Package idemtype holds the values that cross the seam between idem and its stores: the
// message and its identity (Message, Key, Outgoing, Fingerprint and their validation), how a
// failure is classified (Class) and what a dead letter records (DeadLetter, Reason,
// DeadLetterStatus). It imports nothing of idem but the wire names, so package idemstore, which
// defines the seam, can name these types without importing idem, and idem can import idemstore.
//
// Application code need not import it: package idem declares every type here under the same
// name (idem.Message is idemtype.Message), as River's rivertype sits under river.
package idemtype
