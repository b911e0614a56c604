package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idem/idemtype"
	"github.com/idemkit/idem/wire"
)

// eventError adds the event id once, as a suffix, to an error the consumer reports about one
// delivery: `… (event "evt-1")`, in its bounded form.
type eventError struct {
	id  string
	err error
}

func (e *eventError) Error() string {
	return e.err.Error() + ` (event "` + BoundID(e.id) + `")`
}

func (e *eventError) Unwrap() error { return e.err }

// withEvent wraps err with the event id suffix unless it already carries one.
func withEvent(id string, err error) error {
	if err == nil {
		return nil
	}
	var ee *eventError
	if errors.As(err, &ee) {
		return err
	}
	return &eventError{id: id, err: err}
}

// Headers a dead letter of a message with an invalid identity carries, in place of the raw
// identity, which is not stored anywhere.
const (
	// HeaderInvalidIdentity names the invalid identity field and what is wrong with it.
	HeaderInvalidIdentity = wire.InvalidIdentity
	// HeaderEventIDSHA256 is the SHA-256 (hex) of the raw event id, so an operator can match
	// the dead letter with the producer's record of the message.
	HeaderEventIDSHA256 = wire.EventIDSHA256
)

// storableDeadLetterMessage returns msg in a form every store can keep and index: identity
// fields that fail ValidateIdentity are replaced by their bounded form (BoundID), and header
// names and values with NUL or invalid UTF-8 (which PostgreSQL's text and jsonb types refuse)
// by their escaped form. It reports whether the identity was replaced; the dead letter's
// fingerprint then covers the raw identity (identityFingerprint), so two different hostile
// messages never share a pending dead letter and a replay of the bounded form is refused as
// edited.
func storableDeadLetterMessage(msg Message) (Message, bool) {
	out := msg
	replaced := false
	var problems []string
	for _, f := range []struct {
		name string
		v    *string
	}{{FieldEventID, &out.EventID}, {FieldTenant, &out.Tenant}, {FieldType, &out.Type}} {
		if err := idemtype.ValidateField(f.name, *f.v); err != nil {
			var ie *IdentityError
			errors.As(err, &ie)
			problems = append(problems, ie.Field+" "+ie.Problem)
			*f.v = BoundID(*f.v)
			replaced = true
		}
	}
	needCopy := replaced
	for k, v := range msg.Headers {
		if !storableText(k) || !storableText(v) {
			needCopy = true
			break
		}
	}
	if needCopy {
		headers := make(map[string]string, len(msg.Headers)+2)
		for k, v := range msg.Headers {
			headers[escapeText(k)] = escapeText(v)
		}
		out.Headers = headers
	}
	if replaced {
		out.Headers[HeaderInvalidIdentity] = strings.Join(problems, "; ")
		sum := sha256.Sum256([]byte(msg.EventID))
		out.Headers[HeaderEventIDSHA256] = hex.EncodeToString(sum[:])
	}
	return out, replaced
}

// storableText reports whether s can be stored as text by every store: valid UTF-8 without NUL.
func storableText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// escapeText returns s unchanged when it is storable, else its escaped form (unbounded: header
// values such as signatures may be long, and the broker already bounded the message).
func escapeText(s string) string {
	if storableText(s) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// identityFingerprint hashes the raw identity and the payload of a message whose identity is
// invalid, so its dead letter stays apart from every other message's.
func identityFingerprint(msg Message) Fingerprint {
	h := sha256.New()
	var n [8]byte
	for _, f := range []string{"idem.fp.v1.identity", msg.EventID, msg.Tenant, msg.Type, string(msg.Payload)} {
		binary.LittleEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	var fp Fingerprint
	h.Sum(fp[:0])
	return fp
}
