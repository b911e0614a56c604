package cli

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// TestServeFlags: bad flags are usage errors, before anything is opened or bound.
func TestServeFlags(t *testing.T) {
	t.Parallel()
	dsn := sqliteDSN(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--token", "short"}, "--token is 5 characters"},
		{[]string{"--broker", "amqp://guest:guest@127.0.0.1:5672/"}, "--topic is required"},
		{[]string{"--sample-interval", "0s"}, "--sample-interval"},
		{[]string{"--log-format", "xml"}, "--log-format"},
		{[]string{"--metrics", "localhost:9464/metrics"}, "--metrics"},
		{[]string{"--metrics", "file:///etc/passwd"}, "--metrics"},
	} {
		r := idemCLI(t, append([]string{"serve", "--store", dsn}, tc.args...)...)
		requireOneLineError(t, r, ExitUsage, tc.want)
	}
	// A store that was never created is reported, not created.
	requireOneLineError(t, idemCLI(t, "serve", "--store", dsn), ExitFailure, "does not exist")
}

// TestServe runs idem serve on a random port: the pages answer, a token from the environment
// enables actions, and the command stops cleanly when its context ends.
func TestServe(t *testing.T) {
	t.Parallel()
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	dl := seedDeadLetter(t, st, "evt-serve", idem.ReasonPermanentError, time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errb syncBuffer
	e := testEnv(&out, &errb, map[string]string{ServeTokenEnv: "0123456789abcdef0123"})
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"serve", "--store", dsn, "--addr", "127.0.0.1:0"}, e) }()

	addrRE := regexp.MustCompile(`dashboard on (http://127\.0\.0\.1:\d+) `)
	var base string
	require.Eventually(t, func() bool {
		m := addrRE.FindStringSubmatch(out.String())
		if m != nil {
			base = m[1]
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, "stdout: %s\nstderr: %s", &out, &errb)
	require.Contains(t, out.String(), "actions by token login")

	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	for _, p := range []string{"/", "/deadletters", "/audit", "/login"} {
		code, _ := get(p)
		require.Equal(t, http.StatusOK, code, p)
	}
	code, body := get("/deadletters?consumer=" + url.QueryEscape("ledger@v1"))
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "evt-serve")
	code, body = get("/deadletters/" + strconv.FormatInt(dl.ID, 10))
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "hunter2")

	cancel()
	select {
	case c := <-done:
		require.Equal(t, ExitOK, c, "stderr: %s", &errb)
	case <-time.After(10 * time.Second):
		t.Fatal("idem serve did not stop")
	}
}
