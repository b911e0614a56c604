package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/wire"
)

// Bounds of a message's identity fields. They keep every index entry that holds them (claims,
// pending dead letters) well inside what the databases accept (a PostgreSQL B-tree entry is
// limited to about 2.7 KB), and they are far above any real id, tenant or type name.
const (
	// MaxEventIDBytes bounds Message.EventID.
	MaxEventIDBytes = 1024
	// MaxTenantBytes bounds Message.Tenant.
	MaxTenantBytes = 256
	// MaxTypeBytes bounds Message.Type.
	MaxTypeBytes = 256
	// BoundIDBytes is how much of an identity BoundID shows before it cuts.
	BoundIDBytes = 64
)

// The identity fields an IdentityError names.
const (
	FieldEventID = "event id"
	FieldTenant  = "tenant"
	FieldType    = "type"
)

// IdentityError reports an event id, tenant or type that cannot serve as an identity: blank,
// carrying control characters or invalid UTF-8, or longer than its bound. It wraps
// ErrInvalidPayload, so such a message becomes an invalid_payload dead letter.
type IdentityError struct {
	// Field is FieldEventID, FieldTenant or FieldType.
	Field string
	// Problem says what is wrong ("is blank", "is 12288 bytes, over the limit of 1024").
	Problem string
	// Value is the offending value in its bounded, printable form (BoundID).
	Value string
}

// Error names the field and the problem. The value is shown (bounded) for the tenant and the
// type; the event id is left out because the consumer adds it to every error it reports.
func (e *IdentityError) Error() string {
	if e.Field == FieldEventID {
		return fmt.Sprintf("%s: %s %s", ErrInvalidPayload.Error(), e.Field, e.Problem)
	}
	return fmt.Sprintf(`%s: %s "%s" %s`, ErrInvalidPayload.Error(), e.Field, e.Value, e.Problem)
}

// Unwrap makes errors.Is(err, ErrInvalidPayload) true.
func (e *IdentityError) Unwrap() error { return ErrInvalidPayload }

// ValidateIdentity checks the identity fields of msg: the event id must not be empty or blank,
// the tenant and the type may be empty but not blank, and none of them may carry control
// characters (C0, DEL, C1, line and paragraph separators) or invalid UTF-8, or exceed
// MaxEventIDBytes, MaxTenantBytes and MaxTypeBytes. It returns the first *IdentityError.
func ValidateIdentity(msg Message) error {
	if err := checkIdentity(FieldEventID, msg.EventID, MaxEventIDBytes, true); err != nil {
		return err
	}
	if err := checkIdentity(FieldTenant, msg.Tenant, MaxTenantBytes, false); err != nil {
		return err
	}
	return checkIdentity(FieldType, msg.Type, MaxTypeBytes, false)
}

func checkIdentity(field, v string, limit int, required bool) error {
	bad := func(problem string) error { return &IdentityError{Field: field, Problem: problem, Value: BoundID(v)} }
	switch {
	case v == "" && required:
		return bad("is empty")
	case v == "":
		return nil
	case len(v) > limit:
		return bad(fmt.Sprintf("is %d bytes, over the limit of %d", len(v), limit))
	case !utf8.ValidString(v):
		return bad("is not valid UTF-8")
	}
	blank := true
	for i, r := range v {
		if forbiddenInIdentity(r) {
			return bad(fmt.Sprintf("has control character %U at byte %d", r, i))
		}
		if !unicode.IsSpace(r) {
			blank = false
		}
	}
	if blank {
		return bad("is blank")
	}
	return nil
}

// forbiddenInIdentity reports the characters an identity may not carry: the C0 and C1 control
// characters and DEL (unicode.IsControl), and the Unicode line and paragraph separators, all of
// which break log lines, terminals or the databases' text types (NUL).
func forbiddenInIdentity(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Zl, unicode.Zp)
}

// BoundID returns the printable, bounded form of an identity (event id, tenant, type) for
// errors, logs, metrics and the identity columns of a dead letter: at most BoundIDBytes bytes of
// escaped text (Go escapes: \n, \x00, \u0085, \" and \\; an invalid UTF-8 byte as \xff),
// followed by "…" when it was cut. A short printable id comes back unchanged.
func BoundID(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		var piece string
		switch {
		case r == utf8.RuneError && size == 1:
			piece = fmt.Sprintf(`\x%02x`, s[i])
		case r == '"' || r == '\\':
			piece = `\` + string(r)
		case strconv.IsPrint(r):
			piece = s[i : i+size]
		default:
			q := strconv.QuoteRune(r) // 'x' with the escape inside
			piece = q[1 : len(q)-1]
		}
		if b.Len()+len(piece) > BoundIDBytes {
			b.WriteString("…")
			return b.String()
		}
		b.WriteString(piece)
		i += size
	}
	return b.String()
}

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
		name  string
		v     *string
		limit int
		req   bool
	}{{FieldEventID, &out.EventID, MaxEventIDBytes, true}, {FieldTenant, &out.Tenant, MaxTenantBytes, false}, {FieldType, &out.Type, MaxTypeBytes, false}} {
		if err := checkIdentity(f.name, *f.v, f.limit, f.req); err != nil {
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
