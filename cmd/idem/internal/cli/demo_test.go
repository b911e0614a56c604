package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDemo(t *testing.T) {
	t.Parallel()
	dsn := sqliteDSN(t)
	// --timeout bounds the run; the channel bounds the test should demo ever hang.
	done := make(chan result, 1)
	go func() { done <- idemCLI(t, "demo", "--events", "300", "--json", "--timeout", "90s", "--store", dsn) }()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("idem demo --events 300 did not return within 3 minutes")
	}
	require.Equal(t, ExitOK, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	var verdict map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &verdict), "one JSON object on stdout: %s", r.stdout)
	require.Equal(t, true, verdict["ok"], r.stdout)
	require.NotContains(t, r.stderr, "\r", "no progress bar with --json")
}

func TestDemoFanOut(t *testing.T) {
	t.Parallel()
	r := idemCLI(t, "demo", "--fanout", "--events", "200", "--timeout", "90s", "--store", sqliteDSN(t))
	require.Equal(t, ExitOK, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	require.Contains(t, r.stdout, "fan-out")
	require.Contains(t, r.stdout, "email@v1 on its own subscription")
	require.Contains(t, r.stdout, "double sent 0, not sent once 0, wrong 0, poison ok")
	require.True(t, strings.HasSuffix(r.stdout, "verdict: ok\n"), r.stdout)
	requireOneLineError(t, idemCLI(t, "demo", "--fanout", "--broker", "nats://127.0.0.1:4222"), ExitUsage, "--fanout: needs --broker sql")
}

func TestDemoFlags(t *testing.T) {
	t.Parallel()
	requireOneLineError(t, idemCLI(t, "demo", "--broker", "mqtt://x"), ExitUsage, `--broker: broker URL "mqtt://x": unknown scheme "mqtt"`)
	requireOneLineError(t, idemCLI(t, "demo", "--events", "many"), ExitUsage, `invalid argument "many" for "--events"`)
	requireOneLineError(t, idemCLI(t, "demo", "--timeout", "later"), ExitUsage, `invalid duration "later"`)
	requireOneLineError(t, idemCLI(t, "demo", "--http", "--broker", "nats://127.0.0.1:4222"), ExitUsage, "--http replaces the broker")
	r := idemCLI(t, "demo", "--help")
	requireOK(t, r)
	for _, f := range []string{"--store", "--broker", "--events", "--concurrency", "--seed", "--duplicates", "--transient", "--poison", "--lost-acks", "--timeout", "--http", "--json", "--fanout"} {
		require.Contains(t, r.stdout, f)
	}
	require.Contains(t, r.stdout, DemoStoreDefault)
}

func TestProgressBar(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	p := &progressBar{w: &buf, now: func() time.Time { return now }}
	p.update(0, 300)
	p.update(10, 300) // within 100ms of the last draw: skipped
	now = now.Add(time.Second)
	p.update(150, 300)
	p.update(300, 300) // the end is always drawn
	p.finish()
	p.update(300, 300) // after finish: nothing
	out := buf.String()
	require.Equal(t, 3, strings.Count(out, "\r"), "%q", out)
	require.Contains(t, out, "\r[..............................]   0/300   0%")
	require.Contains(t, out, "[###############...............] 150/300  50%")
	require.True(t, strings.HasSuffix(out, "[##############################] 300/300 100%\n"), "%q", out)

	var nilBar *progressBar
	nilBar.finish() // demo calls finish without a bar with --json
}

// TestProgressLines: on a pipe or file the demo prints a line every few seconds and at the end.
func TestProgressLines(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	p := &progressBar{w: &buf, now: func() time.Time { return now }, lines: true}
	p.update(0, 300)
	now = now.Add(time.Second)
	p.update(10, 300) // within progressLineEvery: skipped
	now = now.Add(progressLineEvery)
	p.update(150, 300)
	p.update(160, 300) // skipped
	p.update(300, 300) // the end is always printed
	p.finish()
	require.Equal(t, "demo: 150/300 orders settled (50%)\ndemo: 300/300 orders settled (100%)\n", buf.String())
	require.NotContains(t, buf.String(), "\r")
}
