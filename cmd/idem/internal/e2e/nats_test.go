package e2e_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/consumertest"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/internal/testenv"
	"github.com/idemkit/idem/storetest"
	"github.com/idemkit/idem/transporttest"
)

// natsHarness connects to IDEM_NATS_URL (or skips) and gives each topic a memory stream of its
// own, deleted at cleanup.
func natsHarness(tb testing.TB) transporttest.Harness {
	tb.Helper()
	nc, err := nats.Connect(testenv.NATS(tb))
	if err != nil {
		tb.Fatalf("connect to NATS: %v", err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return transporttest.Harness{
		Features: transporttest.Features{BrokerDedup: true, DelayedNak: true, Persistent: true, FanOut: true},
		NewTopic: func(tb testing.TB) string {
			id := testdb.Name("")
			name := "IDEME2E_" + strings.ToUpper(id)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := idemnats.EnsureStream(ctx, js, jetstream.StreamConfig{
				Name: name, Subjects: []string{"ideme2e." + id}, Storage: jetstream.MemoryStorage, Duplicates: time.Minute,
				// A bounded redelivery window (idemnats.Source.RedeliveryWindow), within the
				// consumers' RedeliveryWindow; a stream without MaxAge could deliver forever.
				MaxAge: 10 * time.Minute,
			}); err != nil {
				tb.Fatalf("create stream %s: %v", name, err)
			}
			tb.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = js.DeleteStream(ctx, name)
			})
			return "ideme2e." + id
		},
		Source: func(tb testing.TB, topic, name string, lease time.Duration) idem.Source {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stream := "IDEME2E_" + strings.ToUpper(strings.TrimPrefix(topic, "ideme2e."))
			src, err := idemnats.NewSource(ctx, js, idemnats.SourceConfig{Stream: stream, Subject: topic, Durable: name, AckWait: lease, MaxWait: 200 * time.Millisecond})
			if err != nil {
				tb.Fatalf("source on %s: %v", stream, err)
			}
			tb.Cleanup(func() { _ = src.Close() })
			return src
		},
		Sink: func(tb testing.TB) idem.Sink { return idemnats.NewSink(js) },
	}
}

func TestRuntimePostgresNATS(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
		return pgBundle(tb), natsHarness(tb)
	})
}

func TestRuntimeSQLiteNATS(t *testing.T) {
	wholeMatrix(t, "TestRuntimePostgresNATS")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		return sqliteBundle(tb), natsHarness(tb)
	})
}

func TestRuntimeMySQLNATS(t *testing.T) {
	wholeMatrix(t, "TestRuntimePostgresNATS")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		return mysqlBundle(tb), natsHarness(tb)
	})
}

func TestRuntimeBatchedMySQLNATS(t *testing.T) {
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[*sql.Tx], transporttest.Harness) {
		return mysqlBundle(tb), natsHarness(tb)
	}, consumertest.Batched(10))
}

func TestRuntimeBatchedPostgresNATS(t *testing.T) {
	wholeMatrix(t, "TestRuntimeBatchedMySQLNATS")
	t.Parallel()
	consumertest.Exercise(t, func(tb testing.TB) (storetest.Bundle[pgx.Tx], transporttest.Harness) {
		return pgBundle(tb), natsHarness(tb)
	}, consumertest.Batched(10))
}
