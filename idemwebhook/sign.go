package idemwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"
)

// The signing side of each scheme, exactly as the providers publish it: the verifiers compute
// their MACs with these, and tests, demos and senders that speak a scheme sign with them.

// stripeMAC is HMAC-SHA256 under key of "<unix t>.<body>".
func stripeMAC(key []byte, t int64, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(strconv.FormatInt(t, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// SignStripe returns a Stripe-Signature value for body signed with key at t: "t=<unix>,v1=<hex>".
func SignStripe(key []byte, t time.Time, body []byte) string {
	return "t=" + strconv.FormatInt(t.Unix(), 10) + ",v1=" + hex.EncodeToString(stripeMAC(key, t.Unix(), body))
}

// githubMAC is HMAC-SHA256 of body under key.
func githubMAC(key, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return m.Sum(nil)
}

// SignGitHub returns an X-Hub-Signature-256 value for body signed with key: "sha256=<hex>".
func SignGitHub(key, body []byte) string {
	return "sha256=" + hex.EncodeToString(githubMAC(key, body))
}

// qstashMAC is HMAC-SHA256 of a JWT's signing input under key.
func qstashMAC(key []byte, signingInput string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(signingInput))
	return m.Sum(nil)
}

// QStashBodyClaim returns the body claim QStash puts in its token: base64url (with padding, as
// QStash writes it) of the SHA-256 of body.
func QStashBodyClaim(body []byte) string {
	sum := sha256.Sum256(body)
	return base64.URLEncoding.EncodeToString(sum[:])
}

// SignQStash returns an Upstash-Signature value: a JWT with header {"alg":"HS256","typ":"JWT"}
// and claims c, signed with key.
func SignQStash(key []byte, c QStashClaims) string {
	enc := base64.RawURLEncoding
	claims, _ := json.Marshal(c) // a struct of strings and integers always marshals
	input := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc.EncodeToString(claims)
	return input + "." + enc.EncodeToString(qstashMAC(key, input))
}
