// Package testenv finds the services tests run against. Each service is named by an
// environment variable; without it the test skips and says which variable to set, and with
// IDEM_REQUIRE_SERVICES=1 a missing service fails the test instead, so CI never passes by
// skipping.
package testenv

import (
	"os"
	"testing"
)

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
