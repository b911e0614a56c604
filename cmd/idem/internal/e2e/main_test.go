package e2e_test

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
)

// e2eParallel is how many checks run at once unless -parallel says otherwise. The checks mostly
// wait on brokers, databases and leases rather than the CPU, so the default (GOMAXPROCS, 2 on a
// small CI machine) leaves the run idle most of its time. 8 halved the package's time alone, but
// beside CI's other packages a queue lease's Extend then timed out under -race.
const e2eParallel = 4

// wholeMatrix skips, in -short mode, a runtime combination whose transport and runtime mode
// another check already runs (named by coveredBy). CI's race step runs -short: the race detector
// finds races in code paths, and the short matrix still runs every transport's per-event path,
// the batched path on NATS, the queue table and Kafka, the set-based path, the queue table on
// every store, every transport suite, the Watermill suites and the fan-out checks. README's test
// command runs the whole matrix.
func wholeMatrix(t *testing.T, coveredBy string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("-short runs the short matrix (see wholeMatrix in main_test.go); this check's paths run in %s", coveredBy)
	}
}

// TestMain runs the tests, more of them at once than GOMAXPROCS, and names in one line the
// service variables whose absence made tests skip.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if p := flag.Lookup("test.parallel"); p != nil && !set {
		if err := p.Value.Set(strconv.Itoa(max(e2eParallel, runtime.GOMAXPROCS(0)))); err != nil {
			panic(err)
		}
	}
	os.Exit(testenv.Run(m))
}
