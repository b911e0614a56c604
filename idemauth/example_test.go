package idemauth_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
)

// A producer signs with its tenant's newest key; the consumer's Verifier checks the signature
// and takes the tenant from the key, refusing a message changed on the way or one whose payload
// claims another tenant.
func ExampleVerifier() {
	ctx := context.Background()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	ring, err := idemauth.NewKeyring(
		idemauth.Key{ID: "acme-2025-01", Tenant: "acme", Secret: []byte("an-old-secret-of-32-bytes-or-more"), NotAfter: now.Add(24 * time.Hour)},
		idemauth.Key{ID: "acme-2025-06", Tenant: "acme", Secret: []byte("a-new-secret-of-32-bytes-or-more!")},
	)
	if err != nil {
		panic(err)
	}
	// In a consumer: idem.ConsumerConfig{Authenticator: verifier, …}.
	verifier, err := idemauth.NewVerifier(ring, idemauth.VerifierConfig{TenantField: "tenant_id", Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}

	// Producer side.
	key, err := ring.SigningKey("acme", now)
	if err != nil {
		panic(err)
	}
	msg := idem.Message{EventID: "evt-1", Type: "payment.captured", Payload: []byte(`{"tenant_id":"acme","amount_cents":500}`)}
	if err := idemauth.SignMessage(key, &msg, now); err != nil {
		panic(err)
	}
	fmt.Println(msg.Header(idemauth.HeaderSignature))

	// Consumer side.
	received := msg.Clone()
	received.Tenant = "" // whatever the transport said, the key decides
	fmt.Println(verifier.Authenticate(ctx, &received), received.Tenant)

	tampered := msg.Clone()
	tampered.Payload = []byte(`{"tenant_id":"acme","amount_cents":50000}`)
	err = verifier.Authenticate(ctx, &tampered)
	fmt.Println(errors.Is(err, idem.ErrUnauthenticated), errors.Is(err, idemauth.ErrBadSignature))

	other := idem.Message{EventID: "evt-2", Type: "payment.captured", Payload: []byte(`{"tenant_id":"globex","amount_cents":500}`)}
	if err := idemauth.SignMessage(key, &other, now); err != nil {
		panic(err)
	}
	fmt.Println(verifier.Authenticate(ctx, &other))
	// Output:
	// kid=acme-2025-06,t=1748779200,v2=320da5afba04484f9e6410130e12566a34242bf6a523bcda0d9eaf6c7ec04741
	// <nil> acme
	// true true
	// idem: message not authenticated: idemauth: tenant not allowed for the signing key (payload field "tenant_id" claims tenant "globex", key "acme-2025-06" speaks for tenant "acme")
}
