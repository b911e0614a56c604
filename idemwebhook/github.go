package idemwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// GitHub's webhook headers.
const (
	// HeaderGitHubSignature carries "sha256=<hex HMAC-SHA256 of the body>".
	HeaderGitHubSignature = "X-Hub-Signature-256"
	// HeaderGitHubDelivery carries the delivery's GUID, kept by a redelivery: the event id.
	HeaderGitHubDelivery = "X-GitHub-Delivery"
	// HeaderGitHubEvent carries the event name ("push", "pull_request"): the type.
	HeaderGitHubEvent = "X-GitHub-Event"
)

// maxGitHubHeaderLen bounds the signature header ParseGitHubSignature reads.
const maxGitHubHeaderLen = 256

// ParseGitHubSignature parses an X-Hub-Signature-256 value, "sha256=" followed by 64 hex digits
// (either case). It never panics; its errors wrap ErrMalformedSignature and quote only a bounded
// part of the input.
func ParseGitHubSignature(header string) ([sha256.Size]byte, error) {
	var mac [sha256.Size]byte
	fail := func(format string, args ...any) ([sha256.Size]byte, error) {
		return [sha256.Size]byte{}, fmt.Errorf("%w: %s", ErrMalformedSignature, fmt.Sprintf(format, args...))
	}
	if len(header) > maxGitHubHeaderLen {
		return fail("header is %d bytes, limit %d", len(header), maxGitHubHeaderLen)
	}
	hexMAC, ok := strings.CutPrefix(header, "sha256=")
	if !ok {
		return fail("%s does not start with sha256=", quoteTrunc(header))
	}
	if len(hexMAC) != hex.EncodedLen(sha256.Size) {
		return fail("MAC has %d characters, want %d hex digits", len(hexMAC), hex.EncodedLen(sha256.Size))
	}
	if _, err := hex.Decode(mac[:], []byte(hexMAC)); err != nil {
		return fail("MAC is not hex")
	}
	return mac, nil
}

// GitHubConfig configures a GitHub verifier.
type GitHubConfig struct {
	// Secrets are the webhook secrets, each with the tenant it speaks for (required). To rotate,
	// list the old and the new secret for the same tenant until GitHub sends with the new one.
	Secrets []Secret
}

// GitHub verifies GitHub's webhook signature: X-Hub-Signature-256 is HMAC-SHA256 of the body
// under the webhook secret. The event id is the X-GitHub-Delivery GUID and the type the
// X-GitHub-Event name. GitHub signs neither these headers nor a time: see docs/webhooks.md for
// what that leaves open.
type GitHub struct {
	cfg GitHubConfig
}

var _ Verifier = (*GitHub)(nil)

// NewGitHub validates cfg and returns the verifier; errors name the field.
func NewGitHub(cfg GitHubConfig) (*GitHub, error) {
	if err := errors.Join(validateSecrets(cfg.Secrets)...); err != nil {
		return nil, fmt.Errorf("idemwebhook: github config: %w", err)
	}
	cfg.Secrets = copySecrets(cfg.Secrets)
	return &GitHub{cfg: cfg}, nil
}

// Provider describes GitHub: it never retries on its own (a failed delivery waits for a manual
// or API redelivery), so the stop answer (400) only marks the delivery failed in its log.
func (g *GitHub) Provider() Provider {
	return Provider{
		Name: "github",
		Headers: []string{HeaderGitHubSignature, HeaderGitHubDelivery, HeaderGitHubEvent,
			"X-GitHub-Hook-ID", "X-GitHub-Hook-Installation-Target-ID", "X-GitHub-Hook-Installation-Target-Type",
			"Content-Type", "User-Agent"},
		StopStatus: http.StatusBadRequest,
	}
}

// Verify checks X-Hub-Signature-256 against every secret (in constant time each), then reads the
// delivery id and the event name.
func (g *GitHub) Verify(r *http.Request, body []byte) (Verified, error) {
	claimed := Verified{EventID: r.Header.Get(HeaderGitHubDelivery)}
	header := r.Header.Get(HeaderGitHubSignature)
	if header == "" {
		return claimed, refuse(ErrNotSigned, "(no %s header; the SHA-1 X-Hub-Signature is not accepted)", HeaderGitHubSignature)
	}
	got, err := ParseGitHubSignature(header)
	if err != nil {
		return claimed, refuse(err, "")
	}
	tenant, ok := "", false
	for _, sec := range g.cfg.Secrets {
		if hmac.Equal(got[:], githubMAC(sec.Key, body)) && !ok {
			tenant, ok = sec.Tenant, true
		}
	}
	if !ok {
		return claimed, refuse(ErrBadSignature, "(matches none of the %d webhook secrets): the body was changed after signing, or signed with another secret", len(g.cfg.Secrets))
	}
	v := Verified{EventID: claimed.EventID, Tenant: tenant, Type: r.Header.Get(HeaderGitHubEvent)}
	if err := checkEventID(v.EventID, "header "+HeaderGitHubDelivery); err != nil {
		return v, err
	}
	return v, nil
}
