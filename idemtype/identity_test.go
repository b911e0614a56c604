package idemtype_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem/idemtype"
)

// TestValidateField checks that one field on its own gets the bound and the rule ValidateIdentity
// gives it inside a message, and that an unknown field name is an error, never a pass.
func TestValidateField(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, field, value string
		ok                 bool
	}{
		{"event id", idemtype.FieldEventID, "evt-1", true},
		{"empty event id", idemtype.FieldEventID, "", false},
		{"long event id", idemtype.FieldEventID, strings.Repeat("x", idemtype.MaxEventIDBytes+1), false},
		{"event id at its bound", idemtype.FieldEventID, strings.Repeat("x", idemtype.MaxEventIDBytes), true},
		{"empty tenant", idemtype.FieldTenant, "", true},
		{"blank tenant", idemtype.FieldTenant, "  ", false},
		{"tenant over its bound", idemtype.FieldTenant, strings.Repeat("t", idemtype.MaxTenantBytes+1), false},
		{"tenant with NUL", idemtype.FieldTenant, "ac\x00me", false},
		{"type with a line separator", idemtype.FieldType, "a\u2028b", false},
		{"unknown field", "colour", "red", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := idemtype.ValidateField(tc.field, tc.value)
			if tc.ok != (err == nil) {
				t.Fatalf("ValidateField(%q, %q) = %v, want ok=%v", tc.field, tc.value, err, tc.ok)
			}
			msg := idemtype.Message{EventID: "evt-1"}
			switch tc.field {
			case idemtype.FieldEventID:
				msg.EventID = tc.value
			case idemtype.FieldTenant:
				msg.Tenant = tc.value
			case idemtype.FieldType:
				msg.Type = tc.value
			default:
				return
			}
			if got := idemtype.ValidateIdentity(msg); (got == nil) != (err == nil) {
				t.Fatalf("ValidateIdentity disagrees with ValidateField: %v against %v", got, err)
			}
			if err != nil && !errors.Is(err, idemtype.ErrInvalidPayload) {
				t.Fatalf("%v does not wrap ErrInvalidPayload", err)
			}
		})
	}
}
