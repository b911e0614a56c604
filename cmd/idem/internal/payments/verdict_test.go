package payments

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVerdictText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "none", CountText(nil))
	require.Equal(t, "1 a, 2 b", CountText(map[string]int{"b": 2, "a": 1}))
	require.Equal(t, "ok", OKText(true))
	require.Equal(t, "FAILED", OKText(false))
	for _, tc := range []struct {
		notes, problems []string
		ok              bool
		want            string
	}{
		{nil, nil, true, "verdict: ok\n"},
		{[]string{"n1"}, nil, true, "note: n1\nverdict: ok\n"},
		{nil, []string{"p1", "p2"}, false, "verdict: FAILED\n  - p1\n  - p2\n"},
	} {
		var b strings.Builder
		require.NoError(t, WriteVerdict(&b, tc.notes, tc.ok, tc.problems))
		require.Equal(t, tc.want, b.String())
	}
}
