// Package testenv finds the services tests run against. Each service is named by an
// environment variable; without it the test skips and says which variable to set, and with
// IDEM_REQUIRE_SERVICES=1 a missing service fails the test instead, so CI never passes by
// skipping.
package testenv

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

// skips counts, per service variable, the tests of this test binary that skipped for want of
// it, for the summary line Main prints. It lives for one test process only.
var skips struct {
	sync.Mutex
	byVar map[string]int
}

// SkipSummary returns one line naming the unset service variables that made tests of this
// package skip, with how many, or "" when none skipped.
func SkipSummary() string {
	skips.Lock()
	defer skips.Unlock()
	if len(skips.byVar) == 0 {
		return ""
	}
	names := make([]string, 0, len(skips.byVar))
	n := 0
	for name, c := range skips.byVar {
		names = append(names, name)
		n += c
	}
	slices.Sort(names)
	return fmt.Sprintf("testenv: SKIPPED %d tests: set %s to run them against real services", n, strings.Join(names, ", "))
}

// The environment variables that locate services.
const (
	PostgresVar = "IDEM_POSTGRES_URL"
	NATSVar     = "IDEM_NATS_URL"
	AMQPVar     = "IDEM_AMQP_URL"
	RedisVar    = "IDEM_REDIS_URL"
	MySQLVar    = "IDEM_MYSQL_URL"
	RequireVar  = "IDEM_REQUIRE_SERVICES"
)

// Required reports whether missing services must fail the run.
func Required() bool { return os.Getenv(RequireVar) == "1" }

// URL returns the value of the service variable name, skipping the test when it is unset (or
// failing it when IDEM_REQUIRE_SERVICES=1).
func URL(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if Required() {
			t.Fatalf("%s is not set and %s=1: this test needs the service", name, RequireVar)
		}
		skips.Lock()
		if skips.byVar == nil {
			skips.byVar = map[string]int{}
		}
		skips.byVar[name]++
		skips.Unlock()
		t.Skipf("skipping: set %s to run this test against a real service", name)
	}
	return v
}

// Postgres returns IDEM_POSTGRES_URL or skips.
func Postgres(t testing.TB) string { t.Helper(); return URL(t, PostgresVar) }

// NATS returns IDEM_NATS_URL or skips.
func NATS(t testing.TB) string { t.Helper(); return URL(t, NATSVar) }

// AMQP returns IDEM_AMQP_URL or skips.
func AMQP(t testing.TB) string { t.Helper(); return URL(t, AMQPVar) }
