package idemauth_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemauth"
)

// TestSignatureCoversWhatDecides (finding 1): a captured signed message re-sent with a field that
// decides the claim, the tenant, retention or routing changed is refused. The occurrence time
// moved back a day put the event in another partitioned bucket and was applied twice under v1.
func TestSignatureCoversWhatDecides(t *testing.T) {
	t.Parallel()
	occurred := t0.Add(-time.Minute)
	v, err := idemauth.NewVerifier(ring(t), idemauth.VerifierConfig{Now: func() time.Time { return t0.Add(time.Second) }})
	require.NoError(t, err)
	tests := []struct {
		name   string
		change func(m *idem.Message)
	}{
		{"occurred at moved back a day", func(m *idem.Message) { m.OccurredAt = m.OccurredAt.Add(-24 * time.Hour) }},
		{"occurred at moved by a microsecond", func(m *idem.Message) { m.OccurredAt = m.OccurredAt.Add(time.Microsecond) }},
		{"occurred at dropped", func(m *idem.Message) { m.OccurredAt = time.Time{} }},
		{"event id", func(m *idem.Message) { m.EventID = "evt-2" }},
		{"type", func(m *idem.Message) { m.Type = "payment.refunded" }},
		{"payload", func(m *idem.Message) { m.Payload = []byte(`{}`) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := payment("evt-1")
			m.OccurredAt = occurred
			m = signed(t, acmeNew, m, t0)
			ok := m.Clone()
			require.NoError(t, v.Authenticate(context.Background(), &ok), "the captured message verifies")
			tt.change(&m)
			err := v.Authenticate(context.Background(), &m)
			require.ErrorIs(t, err, idemauth.ErrBadSignature)
		})
	}
	// The same instant in another zone is the same occurrence time; so is one that lost its
	// nanoseconds in a PostgreSQL dead letter.
	m := payment("evt-1")
	m.OccurredAt = occurred.Add(123456789 * time.Nanosecond)
	m = signed(t, acmeNew, m, t0)
	m.OccurredAt = m.OccurredAt.In(time.FixedZone("X", 3600))
	require.NoError(t, v.Authenticate(context.Background(), &m))
	m.OccurredAt = m.OccurredAt.Truncate(time.Microsecond)
	require.NoError(t, v.Authenticate(context.Background(), &m))
}

// TestReplaySignature (finding 13): an operator's replay signature lets a dead letter signed long
// ago through, for replays only; nothing else can make or reuse one.
func TestReplaySignature(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := t0.Add(3 * time.Hour)
	ops := idemauth.ReplayKey{ID: "ops-1", Secret: secret('o')}
	opsGlobex := idemauth.ReplayKey{ID: "ops-globex", Secret: secret('q'), Tenants: []string{"globex"}}
	v, err := idemauth.NewVerifier(ring(t), idemauth.VerifierConfig{Now: func() time.Time { return now },
		ReplayKeys: []idemauth.ReplayKey{ops, opsGlobex}})
	require.NoError(t, err)
	noReplay, err := idemauth.NewVerifier(ring(t), idemauth.VerifierConfig{Now: func() time.Time { return now }})
	require.NoError(t, err)

	// The dead letter: signed at t0, verified then (tenant set), replayed three hours later.
	stored := signed(t, acmeNew, payment("evt-1"), t0)
	replay := func(key idemauth.ReplayKey, mod func(m *idem.Message)) idem.Message {
		m := stored.Clone()
		m.Headers[idem.HeaderReplayOf] = "17"
		m.Headers[idem.HeaderReplayedBy] = "alice (os:root)"
		if mod != nil {
			mod(&m)
		}
		s, err := idemauth.NewReplaySigner(key, func() time.Time { return now })
		require.NoError(t, err)
		require.NoError(t, s.SignReplay(ctx, &m))
		m.PublishedAt = now
		return m
	}

	m := replay(ops, nil)
	require.NoError(t, v.Authenticate(ctx, &m))
	require.Equal(t, "acme", m.Tenant)

	plain := stored.Clone()
	plain.PublishedAt = now
	require.ErrorIs(t, v.Authenticate(ctx, &plain), idemauth.ErrStaleSignature, "without a replay signature it is stale")

	tests := []struct {
		name   string
		msg    func() idem.Message
		v      *idemauth.Verifier
		reason error
	}{
		{"forged: right key id, wrong secret", func() idem.Message {
			return replay(idemauth.ReplayKey{ID: "ops-1", Secret: secret('x')}, nil)
		}, v, idemauth.ErrBadSignature},
		{"a producer key cannot sign a replay", func() idem.Message {
			return replay(idemauth.ReplayKey{ID: acmeNew.ID, Secret: acmeNew.Secret}, nil)
		}, v, idemauth.ErrUnknownKey},
		{"verifier without replay keys", func() idem.Message { return replay(ops, nil) }, noReplay, idemauth.ErrUnknownKey},
		{"replay key for another tenant", func() idem.Message { return replay(opsGlobex, func(m *idem.Message) { m.Tenant = "globex" }) }, v, idemauth.ErrTenantMismatch},
		{"actor changed after signing", func() idem.Message {
			m := replay(ops, nil)
			m.Headers[idem.HeaderReplayedBy] = "mallory"
			return m
		}, v, idemauth.ErrBadSignature},
		{"occurred at changed after signing", func() idem.Message {
			m := replay(ops, nil)
			m.OccurredAt = t0.Add(-48 * time.Hour)
			return m
		}, v, idemauth.ErrBadSignature},
		{"payload edited before the operator signed", func() idem.Message {
			return replay(ops, func(m *idem.Message) { m.Payload = []byte(`{"amount_cents":99999}`) })
		}, v, idemauth.ErrBadSignature},
		{"tenant swapped before the operator signed", func() idem.Message {
			return replay(ops, func(m *idem.Message) { m.Tenant = "globex" })
		}, v, idemauth.ErrTenantMismatch},
		{"producer signature stripped", func() idem.Message {
			return replay(ops, func(m *idem.Message) { delete(m.Headers, idemauth.HeaderSignature) })
		}, v, idemauth.ErrNotSigned},
		{"replay signature captured and replayed later", func() idem.Message {
			m := replay(ops, nil)
			m.PublishedAt = now.Add(time.Hour)
			return m
		}, v, idemauth.ErrStaleSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := tt.msg()
			err := tt.v.Authenticate(ctx, &m)
			require.ErrorIs(t, err, idem.ErrUnauthenticated)
			require.ErrorIs(t, err, tt.reason)
		})
	}

	// An edited payload the operator explicitly sends as a new event: the operator's key alone.
	edited := replay(ops, func(m *idem.Message) {
		m.EventID = "evt-1~edit-17"
		m.Payload = []byte(`{"amount_cents":700}`)
		m.Headers[idem.HeaderReplayNewEventOf] = "evt-1"
	})
	require.NoError(t, v.Authenticate(ctx, &edited))
	delete(edited.Headers, idem.HeaderReplayNewEventOf)
	require.ErrorIs(t, v.Authenticate(ctx, &edited), idemauth.ErrBadSignature, "the new-event marker is signed")
}

func TestReplayKeyNeverPrintsSecret(t *testing.T) {
	t.Parallel()
	k := idemauth.ReplayKey{ID: "ops-1", Secret: []byte("0123456789abcdef0123456789abcdef-s3cret")}
	for _, s := range []string{k.String(), k.GoString(), k.LogValue().String()} {
		require.NotContains(t, s, "s3cret")
	}
	_, err := idemauth.NewVerifier(ring(t), idemauth.VerifierConfig{ReplayKeys: []idemauth.ReplayKey{{ID: "x", Secret: []byte("short")}, {ID: "a b"}}})
	require.ErrorContains(t, err, "ReplayKeys[0]")
	require.ErrorContains(t, err, "Secret has 5 bytes")
	require.ErrorContains(t, err, "ReplayKeys[1]")
	require.NotContains(t, err.Error(), "short")
}
