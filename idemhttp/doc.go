// Package idemhttp is the HTTP sink: it runs an external effect (a webhook, a payment provider
// call) by POSTing an outbox event to a URL, outside the producer's transaction, as the relay
// publishes it.
//
// The relay publishes at least once — after a crash between publish and mark, or after a 503
// that came back although the effect was applied, the same event is POSTed again. Every request
// therefore carries an idempotency key the destination must honour:
//
//	Idempotency-Key:  <tenant>:<event id>     each query-escaped (IdempotencyKey): ':' only separates;
//	                                          the destination applies the effect once per key
//	Idem-Event-Id:    <event id>
//	Idem-Tenant:      <tenant>                (absent when empty)
//	Idem-Type:        <type>                  (absent when empty)
//	Idem-Occurred-At: <RFC 3339, UTC>         (absent when unknown)
//	Idem-Http-Signature: t=<unix>,kid=<key id>,h1=<hex HMAC-SHA256>  (see Sign for what it covers)
//	Content-Type:     application/json, or application/octet-stream when the payload is not JSON
//
// plus the message's own headers (which cannot override the ones above). A receiver checks the
// signature with Verify before it trusts anything in the request. The h1 MAC covers the method,
// the request target, the Idempotency-Key, Idem-Event-Id, Idem-Tenant, Idem-Type and
// Idem-Occurred-At headers, the timestamp, the key id and SHA-256 of the body, so a captured
// request cannot be re-sent under another key, tenant or path; Verify refuses timestamps outside
// its tolerance, so it cannot be re-sent later either. Verify also refuses a request that repeats
// a signed header (the MAC covers one value) and a secret shorter than SecretMinBytes. One sink
// secret signs the events of every tenant; the tenant is bound by Idem-Tenant being signed. The header and its "h1" field are distinct
// from idemauth's broker signature (Idem-Signature, "v2"), which signs another input.
//
// Redirects are never followed, with the default client or a caller's: a 3xx is a permanent
// error, so a redirect to another origin never receives the body, the signature or the key.
//
// Responses are classified for the relay's retry policy: 2xx is done; 429 and 503 are transient
// and honour Retry-After; 408, other 5xx, network errors and timeouts are transient; every other
// status is permanent, and the relay dead-letters the event without retrying.
package idemhttp
