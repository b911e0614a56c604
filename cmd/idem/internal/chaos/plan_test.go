package chaos

import (
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// TestPlanNewClasses: the poison identities and the re-sends are drawn after the older
// decisions (which they leave alone), at their rates, and only where they make sense.
func TestPlanNewClasses(t *testing.T) {
	t.Parallel()
	r := rates{duplicates: 0.1, transient: 0.1, poison: 0.05}
	p := newPlanner(11, r)
	kinds := map[string]int{}
	resends := 0
	for i := range 20000 {
		o := p.at(i)
		kinds[o.poison]++
		if isIdent(o.poison) {
			require.False(t, o.duplicate, "order %d: a poison identity never goes through the outbox", i)
			require.Zero(t, o.resendShift, "order %d", i)
		}
		if o.resendShift != 0 {
			resends++
			require.True(t, o.valid(), "order %d: only valid orders are re-sent", i)
			h := o.resendShift.Abs()
			require.True(t, h >= time.Hour && h <= 72*time.Hour && h%time.Hour == 0, "order %d: shift %v", i, o.resendShift)
		}
	}
	require.InDelta(t, 2000, resends, 300)
	n := 0
	for _, k := range identKinds {
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
		{identBlank, func(t *testing.T, id, tenant string) { require.Empty(t, id) }},
		{identSpace, func(t *testing.T, id, tenant string) {
			require.NotEmpty(t, id)
			require.Empty(t, strings.TrimFunc(id, unicode.IsSpace))
			require.NotContains(t, id, " ", "NATS trims ASCII spaces")
		}},
		{identControl, func(t *testing.T, id, tenant string) {
			require.True(t, strings.ContainsFunc(id, unicode.IsControl))
			require.NotContains(t, id, "\r", "no NATS header carries CR/LF")
		}},
		{identNUL, func(t *testing.T, id, tenant string) { require.Contains(t, id, "\x00") }},
		{identUTF8, func(t *testing.T, id, tenant string) { require.False(t, utf8.ValidString(id)) }},
		{identLong3K, func(t *testing.T, id, tenant string) { require.GreaterOrEqual(t, len(id), 3<<10) }},
		{identLong12K, func(t *testing.T, id, tenant string) { require.GreaterOrEqual(t, len(id), 12<<10) }},
		{identTenant10, func(t *testing.T, id, tenant string) {
			require.Equal(t, eventID("run", 3), id)
			require.GreaterOrEqual(t, len(tenant), 10<<10)
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			o := order{index: 3, poison: tc.kind}
			id, tenant := o.identity("run", 5)
			tc.check(t, id, tenant)
			id2, tenant2 := o.identity("run", 5)
			require.Equal(t, id, id2, "a pure function of the seed and the index")
			require.Equal(t, tenant, tenant2)
			if tc.kind != identBlank {
				other, otherTenant := order{index: 4, poison: tc.kind}.identity("run", 5)
				require.False(t, id == other && tenant == otherTenant, "two orders share an identity")
			}
		})
	}
}
