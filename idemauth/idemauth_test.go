package idemauth_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemredact"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func secret(c byte) []byte { return bytes.Repeat([]byte{c}, 32) }

var (
	acmeOld = idemauth.Key{ID: "acme-2025-01", Tenant: "acme", Secret: secret('a'), NotAfter: t0.Add(time.Hour)}
	acmeNew = idemauth.Key{ID: "acme-2025-06", Tenant: "acme", Secret: secret('b')}
	globex  = idemauth.Key{ID: "globex-1", Tenant: "globex", Secret: secret('g')}
)

func ring(t *testing.T) *idemauth.Keyring {
	t.Helper()
	r, err := idemauth.NewKeyring(acmeOld, acmeNew, globex)
	require.NoError(t, err)
	return r
}

func payment(id string) idem.Message {
	return idem.Message{EventID: id, Type: "payment.captured", Payload: []byte(`{"tenant_id":"acme","amount_cents":500}`),
		Headers: map[string]string{"Trace-Id": "abc"}}
}

func signed(t *testing.T, key idemauth.Key, msg idem.Message, at time.Time) idem.Message {
	t.Helper()
	require.NoError(t, idemauth.SignMessage(key, &msg, at))
	return msg
}

func TestNewKeyring(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		keys []idemauth.Key
		want []string // substrings of the error; none means success
	}{
		{name: "valid", keys: []idemauth.Key{acmeOld, acmeNew, globex}},
		{name: "no keys", want: []string{"no keys"}},
		{name: "empty id", keys: []idemauth.Key{{Tenant: "acme", Secret: secret('a')}}, want: []string{"key #0", "ID is empty"}},
		{name: "id with comma", keys: []idemauth.Key{acmeNew, {ID: "a,b", Tenant: "acme", Secret: secret('a')}}, want: []string{"key #1", `ID "a,b"`}},
		{name: "duplicate id", keys: []idemauth.Key{acmeNew, {ID: acmeNew.ID, Tenant: "globex", Secret: secret('c')}}, want: []string{`key "acme-2025-06"`, "used by another key"}},
		{name: "empty tenant", keys: []idemauth.Key{{ID: "k", Secret: secret('a')}}, want: []string{`key "k"`, "Tenant is empty"}},
		{name: "short secret", keys: []idemauth.Key{{ID: "k", Tenant: "acme", Secret: []byte("hunter2")}}, want: []string{`key "k"`, "Secret has 7 bytes, want at least 32"}},
		{name: "every problem named", keys: []idemauth.Key{{ID: "k"}, {ID: "j", Tenant: "x"}}, want: []string{`key "k": Tenant is empty`, `key "k"`, `key "j": Secret has 0 bytes`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := idemauth.NewKeyring(tt.keys...)
			if len(tt.want) == 0 {
				require.NoError(t, err)
				require.Len(t, r.Keys(), len(tt.keys))
				return
			}
			require.Error(t, err)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), "hunter2")
		})
	}
}

func TestKeyringCopiesSecrets(t *testing.T) {
	t.Parallel()
	k := idemauth.Key{ID: "k", Tenant: "acme", Secret: secret('a')}
	r, err := idemauth.NewKeyring(k)
	require.NoError(t, err)
	k.Secret[0] = 'z'
	got, ok := r.Key("k")
	require.True(t, ok)
	require.Equal(t, secret('a'), got.Secret)
}

func TestKeyNeverPrintsSecret(t *testing.T) {
	t.Parallel()
	k := idemauth.Key{ID: "k", Tenant: "acme", Secret: []byte("correct-horse-battery-staple-0123456789")}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("key", "key", k)
	for _, s := range []string{fmt.Sprint(k), fmt.Sprintf("%+v", k), fmt.Sprintf("%#v", k), fmt.Sprintf("%v", []idemauth.Key{k}), logged.String()} {
		require.NotContains(t, s, "horse")
		require.Contains(t, s, "k")
	}
}

func TestSigningKey(t *testing.T) {
	t.Parallel()
	r := ring(t)
	tests := []struct {
		name    string
		tenant  string
		at      time.Time
		wantID  string
		wantErr string
	}{
		{name: "newest listed key", tenant: "acme", at: t0, wantID: acmeNew.ID},
		{name: "other tenant", tenant: "globex", at: t0, wantID: globex.ID},
		{name: "unknown tenant", tenant: "initech", at: t0, wantErr: `no key for tenant "initech"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := r.SigningKey(tt.tenant, tt.at)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantID, k.ID)
		})
	}

	// The new key listed last, but expired: the old one still signs.
	r2, err := idemauth.NewKeyring(acmeNew, acmeOld)
	require.NoError(t, err)
	k, err := r2.SigningKey("acme", t0)
	require.NoError(t, err)
	require.Equal(t, acmeOld.ID, k.ID)
	k, err = r2.SigningKey("acme", t0.Add(2*time.Hour))
	require.NoError(t, err)
	require.Equal(t, acmeNew.ID, k.ID)
	only, err := idemauth.NewKeyring(acmeOld)
	require.NoError(t, err)
	_, err = only.SigningKey("acme", t0.Add(2*time.Hour))
	require.ErrorContains(t, err, "every key of tenant \"acme\" expired")
}

func TestSign(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		key     idemauth.Key
		msg     func() idem.Message
		at      time.Time
		wantErr string
	}{
		{name: "ok", key: acmeNew, msg: func() idem.Message { return payment("e1") }, at: t0},
		{name: "tenant already the key's", key: acmeNew, msg: func() idem.Message { m := payment("e1"); m.Tenant = "acme"; return m }, at: t0},
		{name: "empty event id", key: acmeNew, msg: func() idem.Message { return payment("") }, at: t0, wantErr: "EventID is empty"},
		{name: "other tenant", key: acmeNew, msg: func() idem.Message { m := payment("e1"); m.Tenant = "globex"; return m }, at: t0, wantErr: `Tenant "globex" differs from the tenant "acme" of key "acme-2025-06" (event "e1")`},
		{name: "expired key", key: acmeOld, msg: func() idem.Message { return payment("e1") }, at: t0.Add(2 * time.Hour), wantErr: `key "acme-2025-01" expired`},
		{name: "invalid key", key: idemauth.Key{ID: "k", Tenant: "acme", Secret: []byte("short")}, msg: func() idem.Message { return payment("e1") }, at: t0, wantErr: "Secret has 5 bytes"},
		{name: "before 1970", key: acmeNew, msg: func() idem.Message { return payment("e1") }, at: time.Unix(-1, 0), wantErr: "outside 1970-9999"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h, err := idemauth.Sign(tt.key, tt.msg(), tt.at)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.Empty(t, h)
				return
			}
			require.NoError(t, err)
			require.Regexp(t, `^kid=acme-2025-06,t=1748779200,v2=[0-9a-f]{64}$`, h)
		})
	}
}

// TestSignKnownAnswer pins the wire format to the package documentation with an independent
// implementation, so that a change to the MAC input cannot pass unnoticed.
func TestSignKnownAnswer(t *testing.T) {
	t.Parallel()
	msg := payment("evt-42")
	msg.OccurredAt = time.Date(2025, 6, 1, 11, 59, 0, 123456789, time.FixedZone("CEST", 2*3600))
	got, err := idemauth.Sign(acmeNew, msg, t0)
	require.NoError(t, err)

	m := hmac.New(sha256.New, acmeNew.Secret)
	sum := sha256.Sum256(msg.Payload)
	for _, f := range [][]byte{[]byte("idem-signature-v2"), []byte("event"), []byte("1748779200"), []byte("acme-2025-06"), []byte("evt-42"),
		[]byte("acme"), []byte("payment.captured"), []byte("2025-06-01T09:59:00.123456Z"), sum[:]} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write(f)
	}
	require.Equal(t, "kid=acme-2025-06,t=1748779200,v2="+hex.EncodeToString(m.Sum(nil)), got)
}

func TestSignMessage(t *testing.T) {
	t.Parallel()
	shared := map[string]string{"Trace-Id": "abc"}
	msg := payment("e1")
	msg.Headers = shared
	require.NoError(t, idemauth.SignMessage(acmeNew, &msg, t0))
	require.Equal(t, "acme", msg.Tenant)
	require.NotEmpty(t, msg.Header(idemauth.HeaderSignature))
	require.Equal(t, "abc", msg.Header("Trace-Id"))
	require.NotContains(t, shared, idemauth.HeaderSignature, "the caller's header map is not changed")

	bad := payment("")
	require.Error(t, idemauth.SignMessage(acmeNew, &bad, t0))
	require.Empty(t, bad.Tenant, "a failed SignMessage leaves the message alone")
}

func TestParseSignature(t *testing.T) {
	t.Parallel()
	mac := strings.Repeat("ab", 32)
	tests := []struct {
		name    string
		header  string
		wantErr string
		wantKID string
		wantT   int64
	}{
		{name: "canonical", header: "kid=k1,t=1748779200,v1=" + mac, wantKID: "k1", wantT: 1748779200},
		{name: "any order, spaces, unknown field", header: " v2=" + mac + " , v3=zzz,t=0 ,kid=k1", wantKID: "k1", wantT: 0},
		{name: "v1 only", header: "kid=k1,t=1748779200,v1=" + mac, wantKID: "k1", wantT: 1748779200},
		{name: "upper-case hex", header: "kid=k1,t=1,v1=" + strings.ToUpper(mac), wantKID: "k1", wantT: 1},
		{name: "empty", header: "", wantErr: "header is empty"},
		{name: "too long", header: "kid=k1,t=1,v1=" + mac + ",x=" + strings.Repeat("x", 1024), wantErr: "limit 1024"},
		{name: "no equals", header: "kid=k1,t=1,v1", wantErr: `field 3 "v1" is not key=value`},
		{name: "empty field", header: "kid=k1,,t=1,v1=" + mac, wantErr: "field 2"},
		{name: "missing kid", header: "t=1,v1=" + mac, wantErr: "field kid is missing"},
		{name: "missing t", header: "kid=k1,v1=" + mac, wantErr: "field t is missing"},
		{name: "missing v2", header: "kid=k1,t=1", wantErr: "field v2 (or v1) is missing"},
		{name: "two v2", header: "kid=k1,t=1,v2=" + mac + ",v2=" + mac, wantErr: "field v2 appears twice"},
		{name: "bad v2 beside v1", header: "kid=k1,t=1,v1=" + mac + ",v2=abcd", wantErr: "v2 has 4 characters"},
		{name: "two kids", header: "kid=k1,kid=k2,t=1,v1=" + mac, wantErr: "field kid appears twice"},
		{name: "two v1", header: "kid=k1,t=1,v1=" + mac + ",v1=" + mac, wantErr: "field v1 appears twice"},
		{name: "bad kid", header: "kid=k 1,t=1,v1=" + mac, wantErr: `kid "k 1" is not a key id`},
		{name: "negative t", header: "kid=k1,t=-1,v1=" + mac, wantErr: "digits only"},
		{name: "plus t", header: "kid=k1,t=+1,v1=" + mac, wantErr: "digits only"},
		{name: "leading zero", header: "kid=k1,t=01,v1=" + mac, wantErr: "leading zero"},
		{name: "t too long", header: "kid=k1,t=1234567890123,v1=" + mac, wantErr: "1 to 12 digits"},
		{name: "t after 9999", header: "kid=k1,t=999999999999,v1=" + mac, wantErr: "after the year 9999"},
		{name: "short v1", header: "kid=k1,t=1,v1=abcd", wantErr: "v1 has 4 characters"},
		{name: "non-hex v1", header: "kid=k1,t=1,v1=" + strings.Repeat("zz", 32), wantErr: "v1 is not hex"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := idemauth.ParseSignature(tt.header)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, idemauth.ErrMalformedSignature)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantKID, s.KeyID)
			require.Equal(t, tt.wantT, s.Timestamp.Unix())
			require.Equal(t, mac, hex.EncodeToString(s.MAC[:]))
		})
	}
}

func TestNewVerifierConfig(t *testing.T) {
	t.Parallel()
	_, err := idemauth.NewVerifier(nil, idemauth.VerifierConfig{})
	require.ErrorContains(t, err, "keyring is nil")
	_, err = idemauth.NewVerifier(ring(t), idemauth.VerifierConfig{Tolerance: -time.Second, TenantField: " tenant"})
	require.ErrorContains(t, err, "Tolerance is -1s")
	require.ErrorContains(t, err, `TenantField " tenant"`)
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := t0.Add(30 * time.Second)
	sign := func(key idemauth.Key, at time.Time, mod ...func(*idem.Message)) func(t *testing.T) idem.Message {
		return func(t *testing.T) idem.Message {
			m := payment("evt-1")
			for _, f := range mod[:min(len(mod), 1)] {
				f(&m) // before signing
			}
			m = signed(t, key, m, at)
			for _, f := range mod[min(len(mod), 1):] {
				f(&m) // after signing: the transport or an attacker changed it
			}
			return m
		}
	}
	nop := func(*idem.Message) {}
	tests := []struct {
		name       string
		msg        func(t *testing.T) idem.Message
		wantReason error  // nil: accepted
		wantText   string // substring of the error
	}{
		{name: "valid", msg: sign(acmeNew, t0)},
		{name: "old key still verifies during rotation", msg: sign(acmeOld, t0)},
		{name: "other tenant's own key", msg: sign(globex, t0, func(m *idem.Message) { m.Payload = []byte(`{"tenant_id":"globex"}`) })},
		{name: "transport tenant equal", msg: sign(acmeNew, t0, nop, func(m *idem.Message) { m.Tenant = "acme" })},
		{name: "waited in a backlog past the tolerance", msg: sign(acmeNew, now.Add(-time.Hour), nop, func(m *idem.Message) { m.PublishedAt = now.Add(-time.Hour + time.Second) })},
		{name: "payload not JSON is left to the validator", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte("{not json") })},
		{name: "payload an array", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`[{"tenant_id":"globex"}]`) })},
		{name: "payload tenant null", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`{"tenant_id":null}`) })},
		{name: "payload tenant nested is not a claim", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`{"x":{"tenant_id":"globex"}}`) })},

		{name: "missing header", msg: func(t *testing.T) idem.Message { return payment("evt-1") }, wantReason: idemauth.ErrNotSigned, wantText: "no Idem-Signature header"},
		{name: "malformed header", msg: sign(acmeNew, t0, nop, func(m *idem.Message) { m.Headers[idemauth.HeaderSignature] = "kid=acme-2025-06,t=soon" }), wantReason: idemauth.ErrMalformedSignature, wantText: `t "soon" is not unix seconds`},
		{name: "unknown key", msg: sign(idemauth.Key{ID: "rogue", Tenant: "acme", Secret: secret('r')}, t0), wantReason: idemauth.ErrUnknownKey, wantText: `"rogue"`},
		{name: "payload changed", msg: sign(acmeNew, t0, nop, func(m *idem.Message) { m.Payload = []byte(`{"tenant_id":"acme","amount_cents":50000}`) }), wantReason: idemauth.ErrBadSignature, wantText: "changed after signing"},
		{name: "type changed", msg: sign(acmeNew, t0, nop, func(m *idem.Message) { m.Type = "payment.refunded" }), wantReason: idemauth.ErrBadSignature},
		{name: "event id changed", msg: sign(acmeNew, t0, nop, func(m *idem.Message) { m.EventID = "evt-2" }), wantReason: idemauth.ErrBadSignature},
		{name: "timestamp changed", msg: sign(acmeNew, t0, nop, func(m *idem.Message) {
			m.Headers[idemauth.HeaderSignature] = strings.Replace(m.Headers[idemauth.HeaderSignature], "t=1748779200", "t=1748779201", 1)
		}), wantReason: idemauth.ErrBadSignature},
		{name: "key id swapped to the tenant's other key", msg: sign(acmeNew, t0, nop, func(m *idem.Message) {
			m.Headers[idemauth.HeaderSignature] = strings.Replace(m.Headers[idemauth.HeaderSignature], acmeNew.ID, acmeOld.ID, 1)
		}), wantReason: idemauth.ErrBadSignature},
		{name: "signed after the key's NotAfter", msg: sign(idemauth.Key{ID: acmeOld.ID, Tenant: "acme", Secret: acmeOld.Secret}, acmeOld.NotAfter.Add(time.Second), nop, func(m *idem.Message) {
			m.PublishedAt = acmeOld.NotAfter.Add(time.Second)
		}), wantReason: idemauth.ErrKeyExpired, wantText: "expired at 2025-06-01T13:00:00Z"},
		{name: "older than the tolerance", msg: sign(acmeNew, now.Add(-10*time.Minute)), wantReason: idemauth.ErrStaleSignature, wantText: "10m0s before the message was received; tolerance ±5m0s"},
		{name: "replayed: published long after signing", msg: sign(acmeNew, t0, nop, func(m *idem.Message) { m.PublishedAt = t0.Add(6 * time.Minute) }), wantReason: idemauth.ErrStaleSignature, wantText: "before the message was published"},
		{name: "from the future", msg: sign(acmeNew, now.Add(10*time.Minute)), wantReason: idemauth.ErrStaleSignature, wantText: "in the future"},
		{name: "transport tenant differs", msg: sign(acmeNew, t0, nop, func(m *idem.Message) { m.Tenant = "globex" }), wantReason: idemauth.ErrTenantMismatch, wantText: `the transport says tenant "globex"`},
		{name: "tenant header differs", msg: sign(acmeNew, t0, nop, func(m *idem.Message) { m.Headers[idemauth.HeaderTenant] = "globex" }), wantReason: idemauth.ErrTenantMismatch, wantText: `header Idem-Tenant claims tenant "globex"`},
		{name: "payload tenant differs", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`{"tenant_id":"globex"}`) }), wantReason: idemauth.ErrTenantMismatch, wantText: `payload field "tenant_id" claims tenant "globex", key "acme-2025-06" speaks for tenant "acme"`},
		{name: "payload tenant in other case", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`{"TENANT_ID":"globex"}`) }), wantReason: idemauth.ErrTenantMismatch},
		{name: "payload tenant duplicated", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`{"tenant_id":"acme","tenant_id":"globex"}`) }), wantReason: idemauth.ErrTenantMismatch, wantText: `"globex"`},
		{name: "payload tenant number", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`{"tenant_id":42}`) }), wantReason: idemauth.ErrTenantMismatch, wantText: `"42"`},
		{name: "payload tenant object", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`{"tenant_id":{"id":"acme"}}`) }), wantReason: idemauth.ErrTenantMismatch, wantText: "an object, not a string"},
		{name: "payload tenant before broken JSON", msg: sign(acmeNew, t0, func(m *idem.Message) { m.Payload = []byte(`{"tenant_id":"globex","x":`) }), wantReason: idemauth.ErrTenantMismatch},
		{name: "another tenant's key", msg: sign(globex, t0), wantReason: idemauth.ErrTenantMismatch, wantText: `key "globex-1" speaks for tenant "globex"`},
	}
	v, err := idemauth.NewVerifier(ring(t), idemauth.VerifierConfig{Now: func() time.Time { return now }, TenantField: "tenant_id"})
	require.NoError(t, err)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			msg := tt.msg(t)
			header := msg.Header(idemauth.HeaderSignature)
			err := v.Authenticate(ctx, &msg)
			if tt.wantReason == nil {
				require.NoError(t, err)
				s, _ := idemauth.ParseSignature(header)
				k, _ := ring(t).Key(s.KeyID)
				require.Equal(t, k.Tenant, msg.Tenant, "the verified key decides the tenant")
				return
			}
			require.ErrorIs(t, err, idem.ErrUnauthenticated)
			require.ErrorIs(t, err, tt.wantReason)
			require.NotContains(t, err.Error(), msg.EventID, "an inner layer does not name the event: the consumer adds it once")
			require.Contains(t, err.Error(), tt.wantText)
			for _, k := range []idemauth.Key{acmeOld, acmeNew, globex} {
				require.NotContains(t, err.Error(), string(k.Secret))
			}
			if _, mac, ok := strings.Cut(header, "v2="); ok && len(mac) >= 16 {
				require.NotContains(t, err.Error(), mac[:16], "the MAC is never repeated")
			}
			// Redaction must not eat the reason: dead letters show redacted errors.
			require.Contains(t, idemredact.New(idemredact.Config{}).Text(err.Error()), tt.wantText)
		})
	}
}

func TestAuthenticateErrorsAreDistinct(t *testing.T) {
	t.Parallel()
	reasons := []error{idemauth.ErrNotSigned, idemauth.ErrMalformedSignature, idemauth.ErrUnknownKey, idemauth.ErrBadSignature,
		idemauth.ErrKeyExpired, idemauth.ErrStaleSignature, idemauth.ErrTenantMismatch, idemauth.ErrVersionRetired}
	for i, a := range reasons {
		for j, b := range reasons {
			require.Equal(t, i == j, errors.Is(a, b), "%v vs %v", a, b)
		}
	}
}
