package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idempg"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/retry"
)

// relayRetry never gives up on a row within a run: a broker restart or a cut must delay a
// publish, not turn it into a relay dead letter.
var relayRetry = retry.Policy{MaxAttempts: 100000, MaxElapsed: 6 * time.Hour, Base: 50 * time.Millisecond, Cap: time.Second}

// runRelay publishes the run's outbox to JetStream until ctx ends. A killed relay leaves its
// leases behind; they expire after LeaseTTL and another relay (or its restart) takes over.
func runRelay(ctx context.Context, a RoleArgs) error {
	pool, err := openPool(ctx, a.PostgresURL, 4)
	if err != nil {
		return fmt.Errorf("chaos: relay: %w", err)
	}
	defer pool.Close()
	store, err := idempg.NewWithConfig(pool, idempg.Config{Schema: a.Schema})
	if err != nil {
		return fmt.Errorf("chaos: relay: %w", err)
	}
	defer store.Close()
	nc, err := connectNATS(a.NATSURL, a.Name)
	if err != nil {
		return fmt.Errorf("chaos: relay: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("chaos: relay: %w", err)
	}
	relay, err := idemrelay.New(store, store, idemnats.NewSink(js), idemrelay.Config{
		BatchSize:    100,
		PollInterval: 200 * time.Millisecond,
		LeaseTTL:     3 * time.Second,
		Retry:        relayRetry,
		Retention:    24 * time.Hour, // keep published rows: the verdict reads them
		Logger:       a.Logger,
	})
	if err != nil {
		return fmt.Errorf("chaos: relay: %w", err)
	}
	return relay.Run(ctx)
}
