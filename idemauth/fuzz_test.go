package idemauth_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
)

// FuzzParseSignature checks that parsing an arbitrary header never panics, that whatever parses
// formats back to a header that parses to the same signature, and that a header made by Sign
// for the fuzzed message always parses and verifies — while the fuzzed header, unless it is
// exactly that one, never does.
func FuzzParseSignature(f *testing.F) {
	mac := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	f.Add("kid=acme-2025-06,t=1748779200,v2="+mac, "evt-1", "payment.captured", []byte(`{"amount_cents":500}`), int64(1748779200))
	f.Add("", "", "", []byte(nil), int64(0))
	f.Add("kid=k,t=0,v2="+mac+",v3=later", "e", "t", []byte("x"), int64(1))
	f.Add(" t=1 , v1="+mac+" ,kid=k", "évènement", "тип", []byte{0xff, 0xfe}, int64(253402300799))
	f.Add("kid=k,kid=k,t=1,v1="+mac, "e", "t", []byte("{}"), int64(-1))
	f.Add("kid=k,t=01,v1="+mac, "e", "t", []byte("[]"), int64(1<<40))
	f.Add("kid=,t=,v1=", "e", "t", []byte(nil), int64(5))
	f.Add("=,=,=", "e", "t", []byte(nil), int64(5))

	key := idemauth.Key{ID: "acme-2025-06", Tenant: "acme", Secret: []byte("0123456789abcdef0123456789abcdef")}
	ring, err := idemauth.NewKeyring(key)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, header, eventID, typ string, payload []byte, unix int64) {
		s, err := idemauth.ParseSignature(header)
		if err != nil {
			if !errors.Is(err, idemauth.ErrMalformedSignature) {
				t.Fatalf("ParseSignature(%q) error %v does not wrap ErrMalformedSignature", header, err)
			}
		} else {
			again, err := idemauth.ParseSignature(s.String())
			if err != nil || again != s {
				t.Fatalf("ParseSignature(%q) = %+v, but its String %q parses to %+v, %v", header, s, s.String(), again, err)
			}
		}

		if eventID == "" || unix < 0 || unix > 253402300799 {
			return
		}
		at := time.Unix(unix, 0)
		v, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{Now: func() time.Time { return at }, TenantField: "tenant_id"})
		if err != nil {
			t.Fatal(err)
		}
		msg := idem.Message{EventID: eventID, Type: typ, Payload: payload}
		if err := idemauth.SignMessage(key, &msg, at); err != nil {
			t.Fatalf("SignMessage: %v", err)
		}
		signed := msg.Header(idemauth.HeaderSignature)
		if _, err := idemauth.ParseSignature(signed); err != nil {
			t.Fatalf("Sign made %q, which does not parse: %v", signed, err)
		}
		verified := msg
		err = v.Authenticate(context.Background(), &verified)
		if err != nil && !errors.Is(err, idemauth.ErrTenantMismatch) {
			// A fuzzed payload may claim another tenant; nothing else may fail.
			t.Fatalf("a message signed by Sign does not verify: %v", err)
		}
		if err == nil && verified.Tenant != "acme" {
			t.Fatalf("verified tenant %q, want acme", verified.Tenant)
		}

		forged := msg.Clone()
		forged.Headers[idemauth.HeaderSignature] = header
		err = v.Authenticate(context.Background(), &forged)
		if err == nil && mustParse(t, header) != mustParse(t, signed) {
			// Only another spelling of the same signature (field order, spaces, hex case,
			// unknown fields) may verify.
			t.Fatalf("the fuzzed header %q verified, but Sign made %q", header, signed)
		}
		if err != nil && !errors.Is(err, idem.ErrUnauthenticated) {
			t.Fatalf("Authenticate error %v does not wrap idem.ErrUnauthenticated", err)
		}
	})
}

func mustParse(t *testing.T, h string) idemauth.Signature {
	t.Helper()
	s, err := idemauth.ParseSignature(h)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
