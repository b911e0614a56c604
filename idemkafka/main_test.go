package idemkafka_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the package when a goroutine of franz-go or of this package outlives the tests:
// every Source, client and cluster a test made must have been closed.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaks := kafkaGoroutines(5 * time.Second); leaks != "" {
			fmt.Fprintf(os.Stderr, "idemkafka: goroutines outlived the tests:\n\n%s\n", leaks)
			code = 1
		}
	}
	os.Exit(code)
}

// kafkaGoroutines returns the stacks of goroutines in franz-go or idemkafka still running after
// up to wait, or "".
func kafkaGoroutines(wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaks []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "github.com/twmb/franz-go") || strings.Contains(g, "idemkafka.(*") {
				leaks = append(leaks, g)
			}
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return strings.Join(leaks, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
