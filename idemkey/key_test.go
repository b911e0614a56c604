package idemkey_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemkey"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", idemkey.MaxKeyLen)
	tests := []struct {
		name   string
		values []string
		want   string
		err    error
	}{
		{"bare UUID", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"sf-string", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"sf-string with space and escapes", []string{`"a b \"c\" \\d"`}, `a b "c" \d`, nil},
		{"surrounding whitespace", []string{"  key-1\t"}, "key-1", nil},
		{"longest", []string{long}, long, nil},
		{"missing", nil, "", idemkey.ErrKeyMissing},
		{"two fields", []string{"a", "b"}, "", idemkey.ErrKeyMalformed},
		{"empty", []string{""}, "", idemkey.ErrKeyMalformed},
		{"empty sf-string", []string{`""`}, "", idemkey.ErrKeyMalformed},
		{"too long", []string{long + "k"}, "", idemkey.ErrKeyMalformed},
		{"too long quoted", []string{`"` + long + `k"`}, "", idemkey.ErrKeyMalformed},
		{"inner space bare", []string{"a b"}, "", idemkey.ErrKeyMalformed},
		{"non-ASCII", []string{"clé"}, "", idemkey.ErrKeyMalformed},
		{"unterminated", []string{`"abc`}, "", idemkey.ErrKeyMalformed},
		{"parameters", []string{`"abc";p=1`}, "", idemkey.ErrKeyMalformed},
		{"bad escape", []string{`"a\b"`}, "", idemkey.ErrKeyMalformed},
		{"control in string", []string{"\"a\x01\""}, "", idemkey.ErrKeyMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := idemkey.ParseKey(tt.values)
			if tt.err != nil {
				require.ErrorIs(t, err, tt.err)
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// FuzzParseKey feeds arbitrary header values: ParseKey never panics, and what it accepts is a
// bounded, printable key.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\"`, `""`, `"`, "a b", `"x";y`, "\x00", strings.Repeat("z", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := idemkey.ParseKey([]string{v})
		if err != nil {
			if !errors.Is(err, idemkey.ErrKeyMalformed) {
				t.Fatalf("ParseKey(%q): error %v does not wrap ErrKeyMalformed", v, err)
			}
			return
		}
		if key == "" || len(key) > idemkey.MaxKeyLen {
			t.Fatalf("ParseKey(%q) = %q: length %d out of bounds", v, key, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] >= 0x7f {
				t.Fatalf("ParseKey(%q) = %q: byte %d is not printable", v, key, i)
			}
		}
	})
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	principal := func(*http.Request) (string, error) { return "p", nil }
	tests := []struct {
		name string
		cfg  idemkey.Config
		want []string
	}{
		{"no principal", idemkey.Config{}, []string{"Principal is nil"}},
		{"lower-case method", idemkey.Config{Principal: principal, Methods: []string{"post"}}, []string{`Methods: "post"`}},
		{"negative durations", idemkey.Config{Principal: principal, Retention: -1, LockTimeout: -1}, []string{"Retention is -1ns", "LockTimeout is -1ns"}},
		{"retention under two locks", idemkey.Config{Principal: principal, Retention: time.Minute, LockTimeout: time.Minute}, []string{"shorter than twice LockTimeout"}},
		{"bad header names", idemkey.Config{Principal: principal, ReplayHeaders: []string{"X: y"}, ReplayHeader: "a b"}, []string{`ReplayHeaders: "X: y"`, `ReplayHeader "a b"`}},
		{"negative sizes", idemkey.Config{Principal: principal, MaxBodyBytes: -1, MaxResponseBytes: -1}, []string{"MaxBodyBytes is -1", "MaxResponseBytes is -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := idemkey.New[struct{}](nopStore{}, tt.cfg)
			require.Error(t, err)
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
	m, err := idemkey.New[struct{}](nopStore{}, idemkey.Config{Principal: principal})
	require.NoError(t, err)
	cfg := m.Config()
	require.Equal(t, idemkey.RetentionDefault, cfg.Retention)
	require.Equal(t, idemkey.LockTimeoutDefault, cfg.LockTimeout)
	require.Equal(t, idemkey.MethodsDefault, cfg.Methods)
	require.Equal(t, idemkey.ReplayHeaderDefault, cfg.ReplayHeader)
	require.True(t, cfg.Commit(201))
	require.True(t, cfg.Commit(409))
	require.False(t, cfg.Commit(429))
	require.False(t, cfg.Commit(503))
}

func TestDefaultCommit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status int
		want   bool
	}{
		{http.StatusOK, true},
		{http.StatusCreated, true},
		{http.StatusBadRequest, true},
		{http.StatusConflict, true},
		{http.StatusUnprocessableEntity, true},
		// The client is told to retry: storing would answer every retry the same for 24 h.
		{http.StatusRequestTimeout, false},
		{http.StatusTooEarly, false},
		{http.StatusTooManyRequests, false},
		{http.StatusInternalServerError, false},
		{http.StatusServiceUnavailable, false},
		{599, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, idemkey.DefaultCommit(tt.status), "status %d", tt.status)
	}
}

func TestKeyIDScopes(t *testing.T) {
	t.Parallel()
	a := idemkey.NewKeyID("alice", "POST /orders", "k1")
	require.Equal(t, a, idemkey.NewKeyID("alice", "POST /orders", "k1"))
	require.NotEqual(t, a, idemkey.NewKeyID("bob", "POST /orders", "k1"))
	require.NotEqual(t, a, idemkey.NewKeyID("alice", "POST /refunds", "k1"))
	// Length prefixes keep the parts apart: no concatenation makes two scopes one.
	require.NotEqual(t, idemkey.NewKeyID("ab", "c", "k"), idemkey.NewKeyID("a", "bc", "k"))
}
