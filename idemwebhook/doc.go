// Package idemwebhook is idem's webhook ingress: an http.Handler that takes a provider's push
// (QStash, Stripe, GitHub, or another idem service's relay), verifies it, and runs it through the
// same path as a broker delivery — verify, then claim and handler in one transaction
// (idem.Consumer.Process), then answer:
//
//	200  only after the claim and the handler's writes committed, and for a duplicate
//	503  with Retry-After for a transient failure (nothing claimed; the provider sends it again)
//	4xx  for a delivery refused for good, after it is dead-lettered (401 for a bad signature;
//	     otherwise the status that makes that provider stop, Provider.StopStatus)
//
// # Trust after verification
//
// A [Verifier] checks one provider's signature in constant time and returns the provider's event
// id (which becomes the claim's event id, so a redelivery is a duplicate), the event type and
// time when the provider gives them, and the tenant — always the tenant of the secret that
// verified, never a field of the request. A request that fails verification is answered 401,
// counted and logged (its claimed event id bounded, never its body) and not stored: anyone can
// send one, and the provider keeps a genuine delivery and sends it again.
//
// The verifiers: [QStash] (Upstash-Signature, a JWT signed with the current or next signing key
// and bound to the URL and the body), [Stripe] (Stripe-Signature, t and v1), [GitHub]
// (X-Hub-Signature-256) and [Idem] (idemauth's Idem-Signature on a request an idemhttp sink
// sent). docs/webhooks.md lists the provider settings we recommend and what each scheme leaves
// open.
//
// # Bounds
//
// Bodies are read up to Config.MaxBodyBytes; header parsers read bounded input and never panic
// (each has a fuzz target). Error answers are application/problem+json and carry only what
// the sender can act on, never a handler's error text.
package idemwebhook
