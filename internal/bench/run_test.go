package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

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
