package idemnats_test

import (
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/idemnats"
)

func TestRedeliveryWindow(t *testing.T) {
	t.Parallel()
	info := func(maxAge, dup time.Duration) *jetstream.StreamInfo {
		return &jetstream.StreamInfo{Config: jetstream.StreamConfig{MaxAge: maxAge, Duplicates: dup}}
	}
	tests := []struct {
		name string
		info *jetstream.StreamInfo
		want time.Duration
	}{
		{name: "max age covers the duplicate window", info: info(7*24*time.Hour, 2*time.Minute), want: 7 * 24 * time.Hour},
		{name: "duplicate window longer than max age", info: info(time.Minute, time.Hour), want: time.Hour},
		{name: "unlimited age is unbounded", info: info(0, 2*time.Minute), want: idemnats.RedeliveryWindowUnbounded},
		{name: "no info is unbounded", info: nil, want: idemnats.RedeliveryWindowUnbounded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, idemnats.RedeliveryWindow(tt.info))
		})
	}
	// The sentinel leaves room for a retry budget and a lease without overflowing.
	require.Positive(t, idemnats.RedeliveryWindowUnbounded+100*365*24*time.Hour)
}

func TestEnsureStream(t *testing.T) {
	t.Parallel()
	js := connect(t)
	ctx := ctxT(t, 10*time.Second)
	var b [8]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	id := hex.EncodeToString(b[:])
	cfg := jetstream.StreamConfig{
		Name:     "IDEMTEST_" + id,
		Subjects: []string{"idemtest." + id + ".>"},
		Storage:  jetstream.MemoryStorage,
		MaxAge:   time.Hour,
	}
	t.Cleanup(func() { _ = js.DeleteStream(ctxT(t, 10*time.Second), cfg.Name) })

	st, err := idemnats.EnsureStream(ctx, js, cfg)
	require.NoError(t, err, "create")
	require.Equal(t, 2*time.Minute, st.CachedInfo().Config.Duplicates, "the server's default duplicate window")
	require.Equal(t, time.Hour, idemnats.RedeliveryWindow(st.CachedInfo()))

	cfg.MaxAge = 2 * time.Hour
	st, err = idemnats.EnsureStream(ctx, js, cfg)
	require.NoError(t, err, "update")
	require.Equal(t, 2*time.Hour, idemnats.RedeliveryWindow(st.CachedInfo()))

	_, err = idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{})
	require.ErrorContains(t, err, "Name is empty")
	cfg.Storage = jetstream.FileStorage // storage cannot change
	_, err = idemnats.EnsureStream(ctx, js, cfg)
	require.ErrorContains(t, err, "ensure stream "+cfg.Name)
}
