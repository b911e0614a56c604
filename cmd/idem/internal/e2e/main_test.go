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
