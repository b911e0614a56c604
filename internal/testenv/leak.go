package testenv

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// FindLeaks reports the goroutines (other than the caller's) still running after up to wait, so
// a package can prove that every store, source and client its tests made was closed. It retries
// because goroutines that are shutting down need a moment to return.
func FindLeaks(wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		leaks := leakedGoroutines()
		if len(leaks) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d leaked goroutine(s):\n\n%s", len(leaks), strings.Join(leaks, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func leakedGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	stacks := strings.Split(string(buf), "\n\n")
	var leaks []string
	for i, s := range stacks {
		if i == 0 || strings.TrimSpace(s) == "" {
			continue // the first stack is the caller's own goroutine
		}
		if benign(s) {
			continue
		}
		leaks = append(leaks, s)
	}
	return leaks
}

// benign reports whether stack is a goroutine the runtime, the standard library or the testing
// package keep on their own; those are not leaks of the code under test.
func benign(stack string) bool {
	for _, b := range []string{
		"os/signal.signal_recv",
		"os/signal.loop",
		"runtime.ensureSigM",
		"runtime.ReadTrace",
		"runtime/trace.Start",
		"testing.(*M).startAlarm",
		"testing.runFuzzing",
		"testing.(*F).Fuzz",
	} {
		if strings.Contains(stack, b) {
			return true
		}
	}
	// Goroutines the testing package starts for itself (the test-timeout alarm, the output
	// pipes of -json) are not the package's.
	return strings.Contains(stack, "created by testing.")
}

// Run runs the package's tests and prints SkipSummary's line when services were missing; for a
// TestMain that does its own checks: `func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }`.
func Run(m *testing.M) int {
	code := m.Run()
	stopSQS()
	if s := SkipSummary(); s != "" {
		fmt.Println(s)
	}
	return code
}

// MainWith runs the package's tests like Run and then, on a passing run, check (e.g.
// goleak.Find), failing the run with its error; it exits the process.
func MainWith(m *testing.M, check func() error) {
	code := Run(m)
	if code == 0 {
		if err := check(); err != nil {
			fmt.Fprintf(os.Stderr, "after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Main runs the package's tests and then fails the run if goroutines leaked; use it as
// `func TestMain(m *testing.M) { testenv.Main(m) }`. Only a passing run is checked, so a failure
// is never hidden behind a leak report.
func Main(m *testing.M) {
	code := Run(m)
	if code == 0 {
		if err := FindLeaks(2 * time.Second); err != nil {
			fmt.Fprintf(os.Stderr, "goroutine leak check: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
