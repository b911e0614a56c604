package idem

import (
	"github.com/idemkit/idem/wire"
)

// HeaderUntrustedTenant carries, on the dead letter of a message that failed authentication, the
// tenant the message claimed. The dead letter itself has no tenant: the claim was never
// verified, so it must neither list under that tenant nor merge into that tenant's rows.
const HeaderUntrustedTenant = wire.UntrustedTenant

// untrustedDeadLetter is what the dead letter of unauthenticated input stores: msg without a
// tenant (the claimed one kept as untrusted text in HeaderUntrustedTenant) under a fingerprint of
// its own, so a forged copy of a legitimate message can never update that message's pending
// dead letter, and nothing forged is listed under a real tenant.
func untrustedDeadLetter(msg Message, fp Fingerprint) (Message, Fingerprint) {
	out := msg
	if msg.Tenant != "" {
		out.Headers = make(map[string]string, len(msg.Headers)+1)
		for k, v := range msg.Headers {
			out.Headers[k] = v
		}
		out.Headers[HeaderUntrustedTenant] = msg.Tenant
		out.Tenant = ""
	}
	return out, hashFields("idem.fp.v1.unauthenticated", msg.Tenant, fp[:])
}
