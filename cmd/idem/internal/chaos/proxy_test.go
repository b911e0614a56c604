package chaos

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
)

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string, wait time.Duration) (string, error) {
	t.Helper()
	_, err := c.Write([]byte(msg + "\n"))
	if err != nil {
		return "", err
	}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(wait)))
	return r.ReadString('\n')
}

func TestProxy(t *testing.T) {
	t.Parallel()
	p, err := NewProxy("tcp", echoServer(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })

	// dial connects through the proxy for the (sub)test t, closed when t ends.
	dial := func(t *testing.T) (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", p.Addr())
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c, bufio.NewReader(c)
	}

	t.Run("forwards", func(t *testing.T) {
		c, r := dial(t)
		got, err := roundTrip(t, c, r, "hello", 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, "hello\n", got)
	})

	t.Run("stall holds bytes until resume", func(t *testing.T) {
		c, r := dial(t)
		_, err := roundTrip(t, c, r, "warm", 5*time.Second)
		require.NoError(t, err)
		p.Stall()
		_, err = roundTrip(t, c, r, "held", 300*time.Millisecond)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a stalled proxy must not move bytes")
		require.Equal(t, 1, p.Conns(), "a stall keeps the connection open")
		p.Resume()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		got, err := r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "held\n", got, "the bytes held during the stall arrive after it")
	})

	t.Run("cut drops every connection and refuses new ones until restore", func(t *testing.T) {
		// The connections of the subtests before are closed; wait until the proxy saw it.
		require.Eventually(t, func() bool { return p.Conns() == 0 }, 5*time.Second, 10*time.Millisecond)
		c1, r1 := dial(t)
		c2, r2 := dial(t)
		for _, cr := range []struct {
			c net.Conn
			r *bufio.Reader
		}{{c1, r1}, {c2, r2}} {
			_, err := roundTrip(t, cr.c, cr.r, "up", 5*time.Second)
			require.NoError(t, err)
		}
		require.Equal(t, 2, p.Cut())
		for _, r := range []*bufio.Reader{r1, r2} {
			_, err := r.ReadString('\n')
			require.Error(t, err, "a cut connection ends")
		}
		c3, r3 := dial(t)
		_, err := roundTrip(t, c3, r3, "refused", 5*time.Second)
		require.Error(t, err, "a new connection during a cut is dropped")
		require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "dropped, not hanging: %v", err)

		p.Restore()
		c4, r4 := dial(t)
		got, err := roundTrip(t, c4, r4, "back", 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, "back\n", got)
	})
}

func TestProxiedURL(t *testing.T) {
	t.Parallel()
	got, err := proxiedURL("postgres://u:p@db.example:5432/test?sslmode=disable&host=other", "127.0.0.1:4000")
	require.NoError(t, err)
	require.Equal(t, "postgres://u:p@127.0.0.1:4000/test?sslmode=disable", got)
	got, err = proxiedURL("host=db user=u dbname=test", "127.0.0.1:4000")
	require.NoError(t, err)
	require.Equal(t, "host=db user=u dbname=test host=127.0.0.1 port=4000", got)

	network, addr, err := pgTarget("postgres://u@db.example:6543/test")
	require.NoError(t, err)
	require.Equal(t, "tcp", network)
	require.Equal(t, "db.example:6543", addr)
}

// TestInjectTransient: the handler's injected failures are a pure function of the seed and the
// event id, at their rate.
func TestInjectTransient(t *testing.T) {
	t.Parallel()
	n := 0
	for i := range 10000 {
		if injectTransient(7, 0.1, payments.EventID("run", i)) {
			n++
		}
		require.Equal(t, injectTransient(7, 0.1, payments.EventID("run", i)), injectTransient(7, 0.1, payments.EventID("run", i)))
	}
	require.InDelta(t, 1000, n, 150)
	require.False(t, injectTransient(7, 0, "x"))
}

func TestStatLines(t *testing.T) {
	t.Parallel()
	c, n, ok := parseStat("@chaos duplicate 3")
	require.True(t, ok)
	require.Equal(t, "duplicate", c)
	require.Equal(t, 3, n)
	for _, bad := range []string{"level=WARN msg=x", "@chaos duplicate", "@chaos duplicate x"} {
		_, _, ok := parseStat(bad)
		require.False(t, ok, bad)
	}
}
