// Package idemkey is idem's Idempotency-Key middleware for net/http: a client that retries a
// POST after a timeout gets the response of the request that already ran, not a second effect.
// It follows the IETF draft "The Idempotency-Key HTTP Header Field" and Stripe's published
// behaviour:
//
//	400  the key is missing (unless Config.Optional) or malformed
//	409  a request with the same key is still in flight (Retry-After: 1)
//	422  the same key comes with another request (method, path or body differ)
//	…    a completed key: the stored status, body and chosen headers, with Idempotent-Replayed: true
//
// Error bodies are application/problem+json (RFC 9457).
//
// # The handler gets the transaction
//
// A request first takes its key in a short transaction of its own (in flight, locked for
// Config.LockTimeout). The handler then runs in a second transaction, writes its business
// change in it, and the middleware stores the response under the key in that same
// transaction: the effect and the stored response commit together, and only then does the
// response go out. A crash or a lost connection before the commit leaves nothing behind but
// the in-flight lock (released at once after an error or panic, else when it expires), so the
// retry runs the handler again; a crash after the commit leaves the stored response, which the
// retry receives. The handler's context ends with its lock, and storing the response is
// conditional on the lock still being its own, so a handler that overran its lock rolls back
// instead of committing beside the request that took over.
//
// Keys are scoped by the principal (Config.Principal, required) and the route (Config.Route),
// kept for Config.Retention and then deleted by CollectGarbage. The Store is idem's store:
// idempg, idemsqlite and idemmysql implement it, and storetest.ExerciseIdempotencyKeys checks
// each one. docs/http.md has the recommended settings.
package idemkey
