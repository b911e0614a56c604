// Package idemhttp is the HTTP sink: it runs an external effect (a webhook, a payment provider
// call) by POSTing an outbox event to a URL, outside the producer's transaction, as the relay
// publishes it.
//
// The relay publishes at least once — after a crash between publish and mark, or after a 503
// that came back although the effect was applied, the same event is POSTed again. Every request
// therefore carries an idempotency key the destination must honour:
//
//	Idempotency-Key:  <tenant>:<event id>     the destination applies the effect once per key
//	Idem-Event-Id:    <event id>
//	Idem-Tenant:      <tenant>                (absent when empty)
//	Idem-Type:        <type>                  (absent when empty)
//	Idem-Occurred-At: <RFC 3339, UTC>         (absent when unknown)
//	Idem-Signature:   t=<unix>,kid=<key id>,v1=<hex HMAC-SHA256 of "<unix>.<body>">
//	Content-Type:     application/json, or application/octet-stream when the payload is not JSON
//
// plus the message's own headers (which cannot override the ones above). A receiver checks the
// signature with Verify before it trusts anything in the request; Verify refuses timestamps
// outside its tolerance, so a captured request cannot be replayed later.
//
// Responses are classified for the relay's retry policy: 2xx is done; 429 and 503 are transient
// and honour Retry-After; 408, other 5xx, network errors and timeouts are transient; every other
// status is permanent, and the relay dead-letters the event without retrying.
package idemhttp
