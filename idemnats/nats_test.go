package idemnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// connect opens a JetStream client on IDEM_NATS_URL (or skips) and closes it when tb ends.
func connect(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	url := testenv.NATS(tb)
	nc, err := nats.Connect(url, nats.Name("idemnats-test"), nats.Timeout(5*time.Second))
	require.NoError(tb, err, "connect to %s", url)
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(tb, err)
	return js
}

// testMaxMsgSize is the largest message the test streams store; a bigger one is refused by the
// server (not the client), which is how the conformance suite injects a broker fault.
const testMaxMsgSize = 64 << 10

// testStream creates a memory stream IDEMTEST_<hex> over idemtest.<hex>.> that is deleted when
// tb ends, and returns its name and the subject idemtest.<hex>.events.
func testStream(tb testing.TB, js jetstream.JetStream) (stream, subject string) {
	tb.Helper()
	var b [8]byte
	_, err := rand.Read(b[:])
	require.NoError(tb, err)
	id := hex.EncodeToString(b[:])
	stream = "IDEMTEST_" + id
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       stream,
		Subjects:   []string{"idemtest." + id + ".>"},
		Storage:    jetstream.MemoryStorage,
		MaxAge:     10 * time.Minute, // a stream a crashed test leaves behind expires
		Duplicates: time.Minute,
		MaxMsgSize: testMaxMsgSize,
	})
	require.NoError(tb, err, "create stream %s", stream)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			tb.Errorf("delete stream %s: %v", stream, err)
		}
	})
	return stream, "idemtest." + id + ".events"
}

// streamOf returns the stream testStream made for one of its subjects.
func streamOf(tb testing.TB, subject string) string {
	tb.Helper()
	parts := strings.Split(subject, ".")
	require.Len(tb, parts, 3, "subject %q was not made by testStream", subject)
	return "IDEMTEST_" + parts[1]
}

// ctxT returns a context that ends after d or with the test.
func ctxT(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}
