package idemredact_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemredact"
)

// TestURLMasksEveryPassword (finding 4): passwords with an unescaped '#', '?', '/' or '@' came
// back unchanged, and broker tokens in tls:// and other schemes leaked.
func TestURLMasksEveryPassword(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"postgres://u:S3c#ret@h:5432/db", "postgres://[REDACTED]"},       // does not parse: scheme only
		{"postgres://u:S3c?ret@h/db", "postgres://[REDACTED]"},            // idem
		{"postgres://u:S3c/ret@h/db", "postgres://[REDACTED]"},            // idem
		{"postgres://u:1234/S3cret@h/db", "postgres://u:[REDACTED]@h/db"}, // parses, wrongly: masked up to the last '@'
		{"postgres://u:p@ss@h/db?sslmode=disable", "postgres://u:[REDACTED]@h/db?sslmode=disable"},
		{"postgres://alice@h/db", "postgres://alice@h/db"}, // a user name only
		{"tls://S3cretToken@broker:4443", "tls://[REDACTED]@broker:4443"},
		{"nats://S3cretToken@h:4222", "nats://[REDACTED]@h:4222"},
		{"amqp://guest:S3cret@h:5672/", "amqp://[REDACTED]@h:5672/"},
		{"redis://:S3cret@h:6379/0", "redis://[REDACTED]@h:6379/0"},
		{"mqtt://S3cretToken:@h", "mqtt://[REDACTED]@h"},
		{"kafka://S3cretToken@h:9092", "kafka://[REDACTED]@h:9092"},
		{"mqtts://S3cretToken@h", "mqtts://[REDACTED]@h"},
		{"nats://h:4222", "nats://h:4222"},
		{"postgres://u@h/db?password=S3cret&sslmode=disable", "postgres://u@h/db?password=[REDACTED]&sslmode=disable"},
		{"host=h user=u password=S3cret", "host=h user=u password=[REDACTED]"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, idemredact.URL(tt.in), tt.in)
	}
	// In free text (an error that repeats a URL), the same rules hold.
	r := idemredact.New(idemredact.Config{})
	require.Equal(t, `dial "tls://[REDACTED]@broker:4443": refused`, r.Text(`dial "tls://S3cretToken@broker:4443": refused`))
	require.Equal(t, "connect nats://[REDACTED]@a:4222,nats://[REDACTED]@b:4222: timeout", r.Text("connect nats://tokA@a:4222,nats://tokB@b:4222: timeout"))
}

// TestURLErrorRepeatsNothing: url.Parse quotes what it could not read, often the password.
func TestURLErrorRepeatsNothing(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"postgres://u:S3c#ret@h/db", "postgres://u:S3cret%zz@h/db", "postgres://u:S3c ret@h/db", "nats://tok\x7fS3cret@h"} {
		_, err := url.Parse(raw)
		require.Error(t, err, raw)
		msg := idemredact.URLError(err)
		require.NotContains(t, msg, "S3c", raw)
		require.Contains(t, msg, "%XX")
	}
	require.Empty(t, idemredact.URLError(nil))
}

// TestEventIDSuffixMasksNothing (issue 13): the one error shape adds the event id as a suffix,
// `… (event "reset-password-7")`; an id that contains a secret name must not mask the text
// around it, wherever the shape is wrapped.
func TestEventIDSuffixMasksNothing(t *testing.T) {
	t.Parallel()
	r := idemredact.New(idemredact.Config{})
	for _, s := range []string{
		`idem: handler: card declined (event "reset-password-7")`,
		`idem: handler: card declined (event "reset-password-7"): retries exhausted after 5 attempts`,
		`relay: publish: broker down (event "api-token-3"); next try in 5s`,
		`error="idem: handler: card declined (event \"reset-password-7\")" attempt=2`,
	} {
		require.Equal(t, s, r.Text(s))
	}
}

var urlShapes = []string{
	"%s://user:%s@db.example.com:5432/app?sslmode=disable",
	"%s://%s@broker.example.com:4222",
	"%s://:%s@cache.example.com:6379/0",
	"%s://user:%s@h1:1,%[1]s://user:%[2]s@h2:2/x",
	"connect to %s://user:%s@db.example.com/app: dial tcp: connection refused",
	`parse "%s://user:%s@h/db": invalid`,
}

// userScheme are the schemes of urlSchemes in which a bare user info is a user name.
var userScheme = map[string]bool{"postgres": true, "postgresql": true, "mysql": true, "https": true}

var urlSchemes = []string{"postgres", "postgresql", "mysql", "nats", "tls", "amqp", "amqps", "redis", "rediss", "kafka", "mqtt", "https", "x-custom+tls"}

// FuzzURLSecrets embeds a generated secret in the shapes URLs take in configuration and errors
// and asserts that no output of URL, Text or URLError contains it.
func FuzzURLSecrets(f *testing.F) {
	f.Add("S3cr#t?pa/ss", uint8(0), uint8(0))
	f.Add("tok@en:with@ats", uint8(3), uint8(1))
	f.Add("p%zzword99", uint8(1), uint8(4))
	f.Add("REDACTEDx1", uint8(5), uint8(2))
	r := idemredact.New(idemredact.Config{})
	f.Fuzz(func(t *testing.T, secret string, schemeN, shapeN uint8) {
		if !plausibleSecret(secret) {
			return
		}
		scheme := urlSchemes[int(schemeN)%len(urlSchemes)]
		shape := urlShapes[int(shapeN)%len(urlShapes)]
		if shape == urlShapes[1] && userScheme[scheme] {
			return // "postgres://alice@h": a user name, shown by design
		}
		text := fmt.Sprintf(shape, scheme, secret)
		if strings.Contains(strings.ReplaceAll(text, secret, ""), secret) || strings.Contains(fmt.Sprintf(shape, scheme, "")+idemredact.Masked, secret) {
			return // the secret is spelled by the frame itself
		}
		outs := map[string]string{"Text": r.Text(text)}
		if !strings.Contains(shape, " ") {
			outs["URL"] = idemredact.URL(text)
			if _, err := url.Parse(text); err != nil {
				outs["URLError"] = idemredact.URLError(err)
			}
		}
		for name, out := range outs {
			if strings.Contains(out, secret) {
				t.Fatalf("%s(%q) = %q still shows the secret %q", name, text, out, secret)
			}
		}
	})
}

// plausibleSecret keeps secrets that can sit in a URL's user info: 8 to 64 printable ASCII
// characters other than blanks, quotes and angle brackets, with a letter and a digit (so that it
// is not a word of the frame around it), and without ",x://".
func plausibleSecret(s string) bool {
	if len(s) < 8 || len(s) > 64 || strings.Contains(s, ",") && strings.Contains(s, "://") {
		return false // ",x://" inside a secret cannot be told from the next URL of a list
	}
	var letter, digit bool
	for _, c := range s {
		switch {
		case c <= ' ' || c >= 0x7f || strings.ContainsRune("\"'<>`", c):
			return false
		case unicode.IsLetter(c):
			letter = true
		case unicode.IsDigit(c):
			digit = true
		}
	}
	return letter && digit
}
