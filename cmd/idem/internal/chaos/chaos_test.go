package chaos

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/internal/testenv"
)

// buildRoleBinary builds testdata/chaosbin, the binary whose `chaos-role` runs a role, into
// the test's temporary directory. It is built without the race detector: the roles are
// ordinary programs here, and the harness (this process) is the one under test.
func buildRoleBinary(t *testing.T) string {
	t.Helper()
	// The go command that runs this test is on PATH (go test puts its GOROOT/bin first).
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is needed to build the role binary")
	exe := filepath.Join(t.TempDir(), "chaosbin")
	cmd := exec.Command(goBin, "build", "-o", exe, "./testdata/chaosbin")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "build the role binary: %s", out)
	return exe
}

// logWriter writes each whole line to the test log.
type logWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Log(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

// runChaos runs the harness for d against IDEM_POSTGRES_URL and broker (empty: the embedded
// NATS server) and checks what every run must show: no violation, and chaos that actually
// happened.
func runChaos(t *testing.T, broker string, d time.Duration, timeout time.Duration) Report {
	t.Helper()
	return runChaosOn(t, Options{PostgresURL: testenv.Postgres(t), BrokerURL: broker}, d, timeout)
}

// runChaosOn is runChaos on the database and broker of db (PostgresURL or MySQLDSN, and
// BrokerURL).
func runChaosOn(t *testing.T, db Options, d time.Duration, timeout time.Duration) Report {
	t.Helper()
	broker := db.BrokerURL
	exe := buildRoleBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	var brokerFaults [2]time.Duration
	if broker != "" && d < time.Minute {
		// A broker fault every 3–5 s: a short run meets a cut and a kill (which takes
		// rabbitmqctl a few seconds).
		brokerFaults = [2]time.Duration{3 * time.Second, 5 * time.Second}
	}
	r, err := Run(ctx, Options{
		PostgresURL:      db.PostgresURL,
		MySQLDSN:         db.MySQLDSN,
		BrokerURL:        broker,
		BrokerFaultEvery: brokerFaults,
		Duration:         d,
		Executable:       exe,
		Out:              &logWriter{t: t},
		// A run that does not drain fails within the CI budget rather than after minutes; two
		// minutes because a database outage near the end, with dead-letter writes refused and
		// consumers pausing, takes a loaded 2-core machine more than one to work off.
		DrainTimeout: DrainTimeoutDefault,
		Logf:         t.Logf,
		Verbose:      os.Getenv("IDEM_CHAOS_VERBOSE") == "1",
	})
	require.NoError(t, err)
	t.Logf("run took %v", time.Since(start).Round(time.Millisecond))
	require.True(t, r.OK, "violations: %q", r.Violations)
	require.Empty(t, r.Violations)
	require.Zero(t, r.DoubleApplied)
	require.Zero(t, r.Lost)
	require.Zero(t, r.UnexpectedExits)
	// The chaos happened, and so did the misbehaviour it is meant to meet.
	require.GreaterOrEqual(t, r.Kills, int(d/(3*time.Second)), "kills")
	// A fault every 3–7 s, and the outage takes one slot: a 15 s run is sure of one. The outage
	// is a database fault too, and it can last most of a short run (13.7 s of 30 in one CI run,
	// which left room for one cut), so it counts.
	require.GreaterOrEqual(t, r.Cuts+r.Stalls+r.Faults["db_outage"].Count, min(2, int(d/(15*time.Second))), "database faults")
	classes := []string{"db_outage", "dead_letter_write_failures", "poison_identities", "resent_occurred_at"}
	if broker == "" {
		require.GreaterOrEqual(t, r.NATSRestarts, 1, "NATS restarts")
		classes = append(classes, "sink_refusals")
	} else {
		// A server-side close may find none of the run's connections (the clients are still
		// reconnecting after a cut): the fault counts as injected, the number closed may be 0.
		require.Positive(t, r.Faults["broker_connection_kills"].Count, "broker connection kills")
		classes = append(classes, "broker_connection_kills", "broker_stalls_and_cuts")
	}
	require.Greater(t, r.Events, 0)
	require.Positive(t, r.DuplicatesInjected)
	require.Positive(t, r.DuplicatesIgnored)
	require.Positive(t, r.TransientInjected)
	require.Positive(t, r.Retries)
	require.Positive(t, r.DeadLetters["invalid_payload"])
	// A key-reuse order waits until its target is applied, so a short run slowed by an outage
	// may send none (the verdict checks each one sent).
	if r.Poison[payments.PoisonKeyReuse] > 0 {
		require.Positive(t, r.DeadLetters["key_reuse"], "key_reuse dead letters")
	}
	// The fault classes of issue 10 happened, and per-key order held.
	for _, k := range classes {
		require.Positive(t, r.Faults[k].Count, "fault class %s", k)
	}
	require.Zero(t, r.OrderViolations)
	return r
}

// TestChaosShort is the CI variant: 30 s of chaos (a SIGKILL every 1–3 s, so at least ten; a
// database cut or stall every 3–7 s; one outage past the retry budget; refused dead-letter
// writes every 5–10 s; two NATS restarts) on PostgreSQL and an embedded NATS, then the drain
// and the verdict. It takes about a minute.
func TestChaosShort(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("skipping the chaos run in -short mode")
	}
	r := runChaos(t, "", 30*time.Second, 4*time.Minute)
	require.GreaterOrEqual(t, r.Kills, 10)
}

// TestChaosShortMySQL is TestChaosShort on MariaDB (or MySQL 8, IDEM_MYSQL_URL) in a database
// of the run's own: 20 s of chaos with the same faults (kills, database cuts and stalls
// through the proxy, one outage past the retry budget, dead-letter writes refused by a
// trigger, NATS restarts), then the drain and the verdict from the database.
func TestChaosShortMySQL(t *testing.T) {
	// Not parallel: beside TestChaosShort, two runs of a dozen processes each on a 2-core CI
	// machine starve the producers' last sends at the drain.
	if testing.Short() {
		t.Skip("skipping the chaos run in -short mode")
	}
	r := runChaosOn(t, Options{MySQLDSN: testenv.URL(t, testenv.MySQLVar)}, 20*time.Second, 4*time.Minute)
	require.Equal(t, "mysql", r.Store)
}

// TestChaosLong is the long run, by hand: IDEM_CHAOS_LONG=1 IDEM_CHAOS_DURATION=10m (and
// IDEM_CHAOS_STORE=mysql for MariaDB).
func TestChaosLong(t *testing.T) {
	if os.Getenv("IDEM_CHAOS_LONG") != "1" {
		t.Skip("set IDEM_CHAOS_LONG=1 (and IDEM_CHAOS_DURATION, default 10m) for the long chaos run")
	}
	d := 10 * time.Minute
	if s := os.Getenv("IDEM_CHAOS_DURATION"); s != "" {
		var err error
		d, err = time.ParseDuration(s)
		require.NoError(t, err, "IDEM_CHAOS_DURATION")
	}
	db := Options{BrokerURL: os.Getenv("IDEM_CHAOS_BROKER")}
	if os.Getenv("IDEM_CHAOS_STORE") == "mysql" {
		db.MySQLDSN = testenv.URL(t, testenv.MySQLVar)
	} else {
		db.PostgresURL = testenv.Postgres(t)
	}
	runChaosOn(t, db, d, d+10*time.Minute)
}

// TestChaosShortBrokers is the CI variant on RabbitMQ and Redis: 20 s of chaos each, one after
// the other (the kills, cuts, outage and refused dead-letter writes as on NATS, and the run's
// broker connections cut, closed from the server's side or stalled every 3–5 s), then the
// drain and the verdict. The five-minute runs are by hand: IDEM_CHAOS_LONG=1 IDEM_CHAOS_DURATION=5m
// IDEM_CHAOS_BROKER=$IDEM_AMQP_URL (or $IDEM_REDIS_URL) go test -run TestChaosLong.
func TestChaosShortBrokers(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the chaos runs in -short mode")
	}
	for _, b := range []struct{ name, env string }{{BrokerAMQP, testenv.AMQPVar}, {BrokerRedis, testenv.RedisVar}} {
		t.Run(b.name, func(t *testing.T) {
			r := runChaos(t, testenv.URL(t, b.env), 20*time.Second, 4*time.Minute)
			require.Equal(t, b.name, r.Broker)
		})
	}
}

func TestBrokerKind(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, kind string }{
		{"", BrokerNATS},
		{"amqp://guest:guest@127.0.0.1:5672/", BrokerAMQP},
		{"amqps://h/", BrokerAMQP},
		{"redis://127.0.0.1:6379/0", BrokerRedis},
		{"rediss://h:6380", BrokerRedis},
		{"nats://127.0.0.1:4222", ""},
		{"127.0.0.1:6379", ""},
	} {
		kind, err := brokerKind(c.url)
		if c.kind == "" {
			require.Error(t, err, c.url)
			continue
		}
		require.NoError(t, err, c.url)
		require.Equal(t, c.kind, kind, c.url)
	}
	for _, c := range []struct{ url, proxied, target string }{
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:guest@127.0.0.1:40000/", "127.0.0.1:5672"},
		{"amqp://h/vhost", "amqp://127.0.0.1:40000/vhost", "h:5672"},
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:40000/0", "127.0.0.1:6379"},
		{"redis://:pw@h/1", "redis://:pw@127.0.0.1:40000/1", "h:6379"},
	} {
		proxied, target, err := proxiedBrokerURL(c.url, "127.0.0.1:40000")
		require.NoError(t, err, c.url)
		require.Equal(t, c.proxied, proxied, c.url)
		require.Equal(t, c.target, target, c.url)
	}
	err := Options{PostgresURL: "postgres://x/y", BrokerURL: "kafka://h"}.WithDefaults().Validate()
	require.ErrorContains(t, err, "BrokerURL")
}

// TestConnNameScopesTheRun: the harness closes the connections named after the run's roles
// and never its own nor another run's.
func TestConnNameScopesTheRun(t *testing.T) {
	t.Parallel()
	run, other := "20261202t072629-c621d633", "20261202t072629-0badf00d"
	prefix := connName(run, "")
	require.True(t, strings.HasPrefix(connName(run, "consumer-1"), prefix))
	require.False(t, strings.HasPrefix(connName(other, "consumer-1"), prefix))
	require.False(t, strings.HasPrefix(strings.TrimSuffix(prefix, "-"), prefix), "the harness's own name")
	require.NotContains(t, connName(run, "relay-1"), " ", "Redis refuses spaces in client names")
}
