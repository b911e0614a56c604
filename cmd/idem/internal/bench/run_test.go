package bench

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testenv"
)

// TestFull runs the full suite when IDEM_BENCH_FULL=1 (it takes minutes), printing the table:
// IDEM_BENCH_FULL=1 go test -run TestFull -v -timeout 60m ./internal/bench
func TestFull(t *testing.T) {
	if os.Getenv("IDEM_BENCH_FULL") != "1" {
		t.Skip("set IDEM_BENCH_FULL=1 to run the full benchmark suite")
	}
	events, _ := strconv.Atoi(os.Getenv("IDEM_BENCH_EVENTS"))
	rs, err := Run(context.Background(), Options{PostgresURL: testenv.Postgres(t), NATSURL: os.Getenv(testenv.NATSVar), Events: events, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteTable(&b, rs, Ratios(rs)); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
}

// TestSoak runs the soak when IDEM_SOAK=1:
// IDEM_SOAK=1 IDEM_SOAK_DURATION=10m go test -run TestSoak -v -timeout 30m ./internal/bench
func TestSoak(t *testing.T) {
	if os.Getenv("IDEM_SOAK") != "1" {
		t.Skip("set IDEM_SOAK=1 (and IDEM_SOAK_DURATION) to run the soak")
	}
	d, err := time.ParseDuration(os.Getenv("IDEM_SOAK_DURATION"))
	if err != nil {
		d = time.Minute
	}
	rep, err := Soak(context.Background(), SoakOptions{PostgresURL: testenv.Postgres(t), NATSURL: testenv.NATS(t), Duration: d, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("%s", out)
	if !rep.BooksBalance {
		t.Fatalf("books do not balance: double %d lost %d", rep.DoubleApply, rep.Lost)
	}
}

func TestSoakShort(t *testing.T) {
	t.Parallel()
	rep, err := Soak(context.Background(), SoakOptions{PostgresURL: testenv.Postgres(t), NATSURL: testenv.NATS(t), Rate: 100, Duration: 3 * time.Second, Sample: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// No floor on Events: the producer is paced but synchronous, and on a loaded machine it
	// offers fewer than Rate×Duration (199 of 300 in one CI run). What must hold is the books.
	if !rep.BooksBalance || rep.Events == 0 || len(rep.Samples) < 2 {
		t.Fatalf("short soak: %+v", rep)
	}
}

// TestMySQLCases runs the mysql_* cases small, on IDEM_MYSQL_URL: every event of every case is
// processed (a case fails on any other outcome), and each case is reported on the mysql store.
func TestMySQLCases(t *testing.T) {
	t.Parallel()
	rs, err := Run(context.Background(), Options{
		PostgresURL: testenv.Postgres(t), MySQLDSN: testenv.URL(t, testenv.MySQLVar),
		Events: 60, Concurrency: []int{2}, BatchSizes: []int{10}, Cases: mysqlCases,
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Result{}
	for _, r := range rs {
		got[r.Case] = r
	}
	for _, c := range mysqlCases {
		r, ok := got[c]
		if !ok || r.Store != "mysql" || r.Events < 60 || r.EventsPerS <= 0 {
			t.Errorf("case %s: %+v (found %v)", c, r, ok)
		}
	}
}
