package payments

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestPlanIsDeterministic(t *testing.T) {
	t.Parallel()
	r := Rates{Duplicates: 0.05, Transient: 0.05, Poison: 0.01, Crash: 0.02}
	a, b := Plan(1, 5000, r), Plan(1, 5000, r)
	require.Equal(t, a, b)
	require.NotEqual(t, a, Plan(2, 5000, r))
	// Built one order at a time or in one go: the same plan.
	p := NewPlanner(1, r)
	for i := range 5000 {
		require.Equal(t, a[i], p.At(i), "order %d", i)
	}
	// Changing one rate moves only that misbehaviour.
	c := Plan(1, 5000, Rates{Duplicates: 0.05, Transient: 0.05, Poison: 0.01, Crash: 0.5})
	for i := range a {
		require.Equal(t, a[i].Duplicate, c[i].Duplicate)
		require.Equal(t, a[i].Poison, c[i].Poison)
		require.Equal(t, a[i].Amount, c[i].Amount)
		require.Equal(t, a[i].Transient, c[i].Transient)
	}
}

func TestPlanInjectsWhatItSays(t *testing.T) {
	t.Parallel()
	r := Rates{Duplicates: 0.1, Poison: 0.05, Idents: 0.05, Resends: 0.1, Transient: 0.1, Crash: 0.1}
	p := NewPlanner(11, r)
	kinds := map[string]int{}
	dups, resends, transient, crash := 0, 0, 0, 0
	seen := map[int]bool{}
	for i := range 20000 {
		o := p.At(i)
		kinds[o.Poison]++
		if o.Duplicate {
			dups++
		}
		if o.Poison == PoisonKeyReuse {
			// Key reuse targets a distinct, earlier, valid order in the same wallet, another amount.
			tg := p.At(o.Target)
			require.Less(t, o.Target, o.Index)
			require.False(t, seen[o.Target])
			seen[o.Target] = true
			require.True(t, tg.Valid(), "order %d reuses a valid order's id", i)
			require.Equal(t, tg.Wallet, o.Wallet)
			require.NotEqual(t, tg.Amount, o.Amount)
		}
		if IsIdent(o.Poison) {
			require.False(t, o.Duplicate, "order %d: a poison identity never goes through the outbox", i)
		}
		if o.ResendShift != 0 {
			resends++
			require.True(t, o.Valid(), "order %d: only valid orders are re-sent", i)
			h := o.ResendShift.Abs()
			require.True(t, h >= time.Hour && h <= 72*time.Hour && h%time.Hour == 0, "order %d: shift %v", i, o.ResendShift)
		}
		if o.Transient > 0 {
			transient++
			require.True(t, o.Valid() && o.Transient <= 2, "order %d", i)
		}
		if o.Crash {
			crash++
			require.True(t, o.Valid(), "order %d", i)
		}
	}
	require.InDelta(t, 2000, dups, 300)
	require.InDelta(t, 1000, kinds[PoisonInvalidJSON]+kinds[PoisonMissingField]+kinds[PoisonKeyReuse], 200)
	require.Positive(t, kinds[PoisonKeyReuse])
	require.InDelta(t, 1800, resends, 300)
	require.InDelta(t, 1800, transient, 300)
	require.InDelta(t, 1800, crash, 300)
	n := 0
	for _, k := range IdentKinds {
		require.Positive(t, kinds[k], k)
		n += kinds[k]
	}
	require.InDelta(t, 950, n, 200) // 5% of the orders still valid after the older poison
}

func TestIdentity(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind  string
		check func(t *testing.T, id, tenant string)
	}{
		{IdentBlank, func(t *testing.T, id, tenant string) { require.Empty(t, id) }},
		{IdentSpace, func(t *testing.T, id, tenant string) {
			require.NotEmpty(t, id)
			require.Empty(t, strings.TrimFunc(id, unicode.IsSpace))
			require.NotContains(t, id, " ", "NATS trims ASCII spaces")
		}},
		{IdentControl, func(t *testing.T, id, tenant string) {
			require.True(t, strings.ContainsFunc(id, unicode.IsControl))
			require.NotContains(t, id, "\r", "no NATS header carries CR/LF")
		}},
		{IdentNUL, func(t *testing.T, id, tenant string) { require.Contains(t, id, "\x00") }},
		{IdentUTF8, func(t *testing.T, id, tenant string) { require.False(t, utf8.ValidString(id)) }},
		{IdentLong3K, func(t *testing.T, id, tenant string) { require.GreaterOrEqual(t, len(id), 3<<10) }},
		{IdentLong12K, func(t *testing.T, id, tenant string) { require.GreaterOrEqual(t, len(id), 12<<10) }},
		{IdentTenant10, func(t *testing.T, id, tenant string) {
			require.Equal(t, EventID("run", 3), id)
			require.GreaterOrEqual(t, len(tenant), 10<<10)
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			o := Order{Index: 3, Poison: tc.kind}
			id, tenant := o.Identity("run", 5)
			tc.check(t, id, tenant)
			id2, tenant2 := o.Identity("run", 5)
			require.Equal(t, id, id2, "a pure function of the seed and the index")
			require.Equal(t, tenant, tenant2)
			if tc.kind != IdentBlank {
				other, otherTenant := Order{Index: 4, Poison: tc.kind}.Identity("run", 5)
				require.False(t, id == other && tenant == otherTenant, "two orders share an identity")
			}
		})
	}
}

func TestPoisonPayloads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	msg := func(o Order) idem.Message { return idem.Message{EventID: "e", Type: EventType, Payload: o.Payload()} }
	for _, o := range Plan(5, 300, Rates{Poison: 1}) {
		err := Validate(ctx, msg(o))
		switch o.Poison {
		case PoisonKeyReuse:
			require.NoError(t, err, "a key-reuse payload is valid: only its fingerprint differs")
		default:
			require.ErrorIs(t, err, idem.ErrInvalidPayload, o.Poison)
		}
	}
	valid := Order{Index: 3, Wallet: 4, Amount: 500, Target: -1}
	require.NoError(t, Validate(ctx, msg(valid)))
	var p Payment
	require.NoError(t, json.Unmarshal(valid.Payload(), &p))
	require.Equal(t, "w004", *p.WalletID)
	for _, bad := range []idem.Message{
		{Type: "payment.refunded", Payload: valid.Payload()},
		{Type: EventType, Payload: []byte(`{"order_id":1,"wallet_id":"w001","amount_cents":0}`)},
		{Type: EventType, Payload: []byte(`{"wallet_id":"w001","amount_cents":5}`)},
		{Type: EventType, Payload: []byte(`{"order_id":1,"wallet_id":"w001"}`)},
	} {
		require.ErrorIs(t, Validate(ctx, bad), idem.ErrInvalidPayload, string(bad.Payload))
	}
}
