package chaos

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStreamOrderViolations(t *testing.T) {
	t.Parallel()
	orders := []walletOrder{{0, "a"}, {1, "b"}, {2, "a"}, {3, "a"}, {4, "b"}}
	for _, tc := range []struct {
		name  string
		first map[int]uint64
		want  int
	}{
		{"in order", map[int]uint64{0: 1, 1: 2, 2: 3, 3: 4, 4: 5}, 0},
		{"other wallets interleave freely", map[int]uint64{1: 1, 0: 2, 4: 3, 2: 4, 3: 5}, 0},
		{"a later order of the wallet first", map[int]uint64{0: 1, 1: 2, 3: 3, 2: 4, 4: 5}, 1},
		{"the first order after both later ones", map[int]uint64{2: 1, 3: 2, 0: 3, 1: 4, 4: 5}, 1},
		{"reversed wallet", map[int]uint64{3: 1, 2: 2, 0: 3, 4: 4, 1: 5}, 3},
		{"an unpublished order is skipped", map[int]uint64{0: 1, 1: 2, 3: 4, 4: 5}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, streamOrderViolations(orders, tc.first))
		})
	}
}
