package idemhttp_test

import (
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

func TestVerify(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cret")
	body := []byte(`{"amount":5}`)
	at := time.Unix(1740830400, 0)
	good := idemhttp.Sign(secret, at, body)
	v1 := strings.TrimPrefix(good[strings.Index(good, "v1="):], "v1=")
	other := idemhttp.Sign([]byte("old-key"), at, body)
	ts := strconv.FormatInt(at.Unix(), 10)
	for _, tc := range []struct {
		name      string
		secret    []byte
		header    string
		body      []byte
		now       time.Time
		tolerance time.Duration
		want      string // substring of the error; empty means valid
	}{
		{"valid", secret, good, body, at, time.Minute, ""},
		{"valid with kid", secret, "t=" + ts + ",kid=k1,v1=" + v1, body, at, time.Minute, ""},
		{"valid with blanks and unknown fields", secret, " t=" + ts + " , x=y , v1=" + v1, body, at, time.Minute, ""},
		{"rotation: one of two signatures", secret, other + ",v1=" + v1, body, at, time.Minute, ""},
		{"within tolerance", secret, good, body, at.Add(59 * time.Second), time.Minute, ""},
		{"default tolerance", secret, good, body, at.Add(4 * time.Minute), 0, ""},
		{"wrong secret", []byte("wrong"), good, body, at, time.Minute, "no v1 signature matches"},
		{"tampered body", secret, good, []byte(`{"amount":500}`), at, time.Minute, "no v1 signature matches"},
		{"old timestamp (replay)", secret, good, body, at.Add(10 * time.Minute), time.Minute, "beyond the tolerance"},
		{"old beyond default tolerance", secret, good, body, at.Add(6 * time.Minute), 0, "beyond the tolerance of 5m0s"},
		{"future timestamp", secret, good, body, at.Add(-10 * time.Minute), time.Minute, "beyond the tolerance"},
		{"timestamp not signed with body", secret, "t=" + strconv.FormatInt(at.Unix()+1, 10) + ",v1=" + v1, body, at, time.Minute, "no v1 signature matches"},
		{"empty secret", nil, good, body, at, time.Minute, "secret is empty"},
		{"missing header", secret, "", body, at, time.Minute, "header is missing"},
		{"no timestamp", secret, "v1=" + v1, body, at, time.Minute, "no timestamp"},
		{"two timestamps", secret, "t=" + ts + ",t=" + ts + ",v1=" + v1, body, at, time.Minute, "more than one t"},
		{"no signature", secret, "t=" + ts, body, at, time.Minute, "no v1 signature"},
		{"signed timestamp", secret, "t=+" + ts + ",v1=" + v1, body, at, time.Minute, "not unix seconds"},
		{"leading zero", secret, "t=0" + ts + ",v1=" + v1, body, at, time.Minute, "not unix seconds"},
		{"huge timestamp", secret, "t=99999999999999999999,v1=" + v1, body, at, time.Minute, "not unix seconds"},
		{"short v1", secret, "t=" + ts + ",v1=abcd", body, at, time.Minute, "hex-encoded"},
		{"not key=value", secret, "t=" + ts + ",garbage,v1=" + v1, body, at, time.Minute, "not key=value"},
		{"too long", secret, good + strings.Repeat(",x=y", 2000), body, at, time.Minute, "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := idemhttp.Verify(tc.secret, tc.header, tc.body, tc.now, tc.tolerance)
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, idem.ErrUnauthenticated)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, idem.ClassPermanent, idem.Classify(err))
		})
	}
}

func TestSignFormat(t *testing.T) {
	t.Parallel()
	// The signature of "1700000000.{}" under "key", computed independently (see wantHMAC).
	got := idemhttp.Sign([]byte("key"), time.Unix(1700000000, 0), []byte("{}"))
	require.Regexp(t, `^t=1700000000,v1=[0-9a-f]{64}$`, got)
	require.Equal(t, "t=1700000000,v1="+wantHMAC, got)
	require.Empty(t, idemhttp.SignatureKeyID(got))
	require.Equal(t, "k", idemhttp.SignatureKeyID("t=1,kid=k,v1=00"))
}

// FuzzVerify checks that Verify never panics, refuses with ErrUnauthenticated, accepts what Sign
// produced, and never accepts a header for another body.
func FuzzVerify(f *testing.F) {
	f.Add([]byte("secret"), "t=1700000000,v1=00", []byte("{}"), int64(1700000000))
	f.Add([]byte("k"), "", []byte(nil), int64(0))
	f.Add([]byte("k"), "t=1,kid=a,v1=zz,v1=", []byte("x"), int64(1))
	f.Fuzz(func(t *testing.T, secret []byte, header string, body []byte, unix int64) {
		if unix < 0 || unix > 1<<40 {
			unix = 1700000000
		}
		now := time.Unix(unix, 0)
		err := idemhttp.Verify(secret, header, body, now, time.Minute)
		if err != nil && !errors.Is(err, idem.ErrUnauthenticated) {
			t.Fatalf("error does not wrap ErrUnauthenticated: %v", err)
		}
		if err == nil && len(secret) == 0 {
			t.Fatal("verified with an empty secret")
		}
		if err == nil {
			// A header valid for body must not be valid for another body.
			if idemhttp.Verify(secret, header, append(append([]byte(nil), body...), '!'), now, time.Minute) == nil {
				t.Fatalf("header %q verifies two bodies", header)
			}
		}
		if len(secret) == 0 {
			return
		}
		signed := idemhttp.Sign(secret, now, body)
		if err := idemhttp.Verify(secret, signed, body, now, time.Minute); err != nil {
			t.Fatalf("Sign output %q does not verify: %v", signed, err)
		}
		if _, err := hex.DecodeString(signed[strings.LastIndex(signed, "=")+1:]); err != nil {
			t.Fatalf("Sign output %q is not hex", signed)
		}
	})
}

// wantHMAC is `printf '1700000000.{}' | openssl dgst -sha256 -hmac key`.
const wantHMAC = "9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"
