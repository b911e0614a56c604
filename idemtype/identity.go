package idemtype

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
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

// ValidateField checks one identity field (FieldEventID, FieldTenant or FieldType) as
// ValidateIdentity does, for a value that arrives on its own (a tenant an Authenticator set).
func ValidateField(field, v string) error {
	switch field {
	case FieldEventID:
		return checkIdentity(field, v, MaxEventIDBytes, true)
	case FieldTenant:
		return checkIdentity(field, v, MaxTenantBytes, false)
	case FieldType:
		return checkIdentity(field, v, MaxTypeBytes, false)
	}
	return fmt.Errorf("idem: %q is not an identity field", field)
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
		if ForbiddenInIdentity(r) {
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

// ForbiddenInIdentity reports the characters an identity may not carry: the C0 and C1 control
// characters and DEL (unicode.IsControl), and the Unicode line and paragraph separators, all of
// which break log lines, terminals or the databases' text types (NUL). ValidateIdentity uses it,
// and so does idemwebhook for the ids it checks and bounds itself: one rule everywhere.
func ForbiddenInIdentity(r rune) bool {
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
