package idemwebhook

import (
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// The header parsers read hostile input: each must never panic, must bound what it reads, and
// must quote only a bounded part of the input in its errors.

func checkParseError(t *testing.T, input string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if len(err.Error()) > 400 {
		t.Fatalf("error is %d bytes for %d bytes of input: %s", len(err.Error()), len(input), err.Error()[:100])
	}
}

func FuzzParseStripeSignature(f *testing.F) {
	f.Add(SignStripe(keyAcme, t0, []byte(`{"id":"evt_1"}`)))
	f.Add("t=1780315200,v1=" + strings.Repeat("ab", 32) + ",v1=" + strings.Repeat("cd", 32) + ",v0=00")
	f.Add("t=0,v1=")
	f.Add("t=01,v1=zz")
	f.Add(",,=,")
	f.Fuzz(func(t *testing.T, header string) {
		s, err := ParseStripeSignature(header)
		checkParseError(t, header, err)
		if err != nil {
			return
		}
		if len(header) > maxStripeHeaderLen || len(s.V1) == 0 || len(s.V1) > maxStripeV1 {
			t.Fatalf("accepted %q with %d v1", header, len(s.V1))
		}
		if s.Timestamp.Unix() < 0 || s.Timestamp.Unix() > maxUnix {
			t.Fatalf("timestamp %v out of range", s.Timestamp)
		}
	})
}

func FuzzParseGitHubSignature(f *testing.F) {
	f.Add(SignGitHub(keyAcme, []byte("{}")))
	f.Add("sha256=")
	f.Add("sha1=" + strings.Repeat("0", 40))
	f.Add("sha256=" + strings.Repeat("G", 64))
	f.Fuzz(func(t *testing.T, header string) {
		mac, err := ParseGitHubSignature(header)
		checkParseError(t, header, err)
		if err == nil && (!strings.HasPrefix(header, "sha256=") || hex.EncodeToString(mac[:]) != strings.ToLower(header[len("sha256="):])) {
			t.Fatalf("accepted %q as %x", header, mac)
		}
	})
}

func FuzzParseQStashToken(f *testing.F) {
	f.Add(SignQStash(keyAcme, qstashClaims(`{"order":"o-1"}`, t0)))
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("a.b.c")
	f.Add("...")
	f.Add("eyJhbGciOiJIUzI1NiJ9.bnVsbA." + strings.Repeat("A", 43))
	f.Fuzz(func(t *testing.T, token string) {
		tok, err := ParseQStashToken(token)
		checkParseError(t, token, err)
		if err != nil {
			return
		}
		if len(token) > maxQStashTokenLen || !strings.HasPrefix(token, tok.SigningInput+".") {
			t.Fatalf("accepted %q with signing input %q", token, tok.SigningInput)
		}
		// A parsed token is verified like any other: a token not made with the verifier's key
		// never passes, whatever its header or claims say.
		v, err := NewQStash(QStashConfig{Secrets: []Secret{{Tenant: "acme", Key: keyOther}}, URL: qstashURL, Now: func() time.Time { return t0 }})
		if err != nil {
			t.Fatal(err)
		}
		r := post("", map[string]string{HeaderQStashSignature: token})
		if _, err := v.Verify(r, nil); err == nil {
			t.Fatalf("verified %q with a key that did not sign it", token)
		}
	})
}

// FuzzHandlerUnsigned sends hostile requests through the whole handler: whatever the body and
// headers, a request not signed with the secret is answered 401 and dead-lettered without a
// tenant, under a bounded, printable event id.
func FuzzHandlerUnsigned(f *testing.F) {
	f.Add([]byte(`{"tenant":"globex"}`), "sha256="+strings.Repeat("0", 64), "d-1")
	f.Add([]byte{0xff, 0x00}, "", strings.Repeat("\x00é", 200))
	f.Add([]byte(nil), "sha256=zz", "")
	f.Fuzz(func(t *testing.T, body []byte, sig, id string) {
		b := setup(t, githubVerifier(t), nil)
		r := post(string(body), nil)
		r.Header[HeaderGitHubSignature] = []string{sig}
		r.Header[HeaderGitHubDelivery] = []string{id}
		w := serve(b.h, r)
		if w.Code != 401 {
			t.Fatalf("status %d for an unsigned request: %s", w.Code, w.Body.String())
		}
		_, claims, dls := b.store.snapshot()
		if claims != 0 || len(dls) != 0 {
			t.Fatalf("%d claims, %d dead letters: unauthenticated input is never stored", claims, len(dls))
		}
		var p Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("problem body: %v", err)
		}
		if p.Reason != "unauthenticated" || len(p.EventID) > 128 || !utf8.ValidString(p.EventID) || strings.ContainsAny(p.EventID, "\x00\n\r\u2028\u2029") {
			t.Fatalf("problem reason %q, event id %q is not bounded", p.Reason, p.EventID)
		}
	})
}
