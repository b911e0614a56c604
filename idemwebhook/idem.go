package idemwebhook

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/wire"
)

// Idem verifies idem's own message signature (package idemauth) on a request: the one an
// idemhttp sink sends when the relay publishes an outbox event signed with
// idemauth.SignMessage. It rebuilds the idem.Message the producer signed — event id, tenant, type
// and occurrence time from the Idem-* headers, the body as payload, the Idem-Signature header —
// and hands it to an idemauth.Verifier, so the crypto, the keyring, rotation and the tenant rule
// are idemauth's. The tenant is the one of the key that verified.
type Idem struct {
	v *idemauth.Verifier
}

var _ Verifier = (*Idem)(nil)

// NewIdem returns a verifier over v. idemauth measures its tolerance from the moment it
// verifies (an HTTP request has no broker publish time), so give v a Tolerance that covers the
// relay's retry budget, or a retried POST arrives stale.
func NewIdem(v *idemauth.Verifier) (*Idem, error) {
	if v == nil {
		return nil, errors.New("idemwebhook: NewIdem: verifier is nil")
	}
	return &Idem{v: v}, nil
}

// Provider describes an idem relay (idemhttp sink): it treats 4xx other than 408 and 429 as
// permanent and dead-letters the outbox event at its side.
func (i *Idem) Provider() Provider {
	return Provider{
		Name: "idem",
		Headers: []string{idemauth.HeaderSignature, idemhttp.HeaderEventID, idemhttp.HeaderTenant, idemhttp.HeaderType,
			idemhttp.HeaderOccurredAt, idemhttp.HeaderIdempotencyKey, idemauth.HeaderReplaySignature,
			idem.HeaderReplayOf, idem.HeaderReplayEventTime, idem.HeaderReplayNewEventOf, idem.HeaderReplayedBy,
			"Content-Type", "User-Agent"},
		StopStatus: http.StatusUnprocessableEntity,
	}
}

// Verify rebuilds the signed message from r and body and authenticates it with idemauth. A
// tenant claimed in Idem-Tenant that is not the key's is refused (idemauth.ErrTenantMismatch).
// The replay headers are passed on only with a replay signature, which covers them; Verified.Replay
// then says it verified, and the Handler keeps them on the message.
func (i *Idem) Verify(r *http.Request, body []byte) (Verified, error) {
	claimed := Verified{EventID: r.Header.Get(idemhttp.HeaderEventID)}
	msg := idem.Message{
		EventID: claimed.EventID,
		Type:    r.Header.Get(idemhttp.HeaderType),
		Payload: body,
		Headers: map[string]string{},
	}
	if v := r.Header.Get(idemhttp.HeaderOccurredAt); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return claimed, refuse(ErrMalformedSignature, "(header %s %s is not RFC 3339, so the signed message cannot be rebuilt)", idemhttp.HeaderOccurredAt, quoteTrunc(v))
		}
		msg.OccurredAt = t
	}
	for _, h := range []string{idemauth.HeaderSignature, idemauth.HeaderTenant} {
		if v := r.Header.Get(h); v != "" {
			msg.Headers[h] = v
		}
	}
	replay := r.Header.Get(idemauth.HeaderReplaySignature) != ""
	if replay {
		// A replay signature covers the tenant (the operator's replay of that tenant's dead
		// letter): idemauth checks it against the producer key's and the replay key's tenants.
		msg.Tenant = r.Header.Get(idemhttp.HeaderTenant)
		for name := range r.Header {
			if strings.HasPrefix(name, wire.ReplayPrefix) {
				msg.Headers[name] = r.Header.Get(name)
			}
		}
	}
	if err := i.v.Authenticate(r.Context(), &msg); err != nil {
		return claimed, err
	}
	v := Verified{EventID: msg.EventID, Tenant: msg.Tenant, Type: msg.Type, OccurredAt: msg.OccurredAt, Replay: replay}
	if err := checkEventID(v.EventID, "header "+idemhttp.HeaderEventID); err != nil {
		return v, err
	}
	return v, nil
}
