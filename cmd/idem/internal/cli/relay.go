package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
)

// Timeouts of the relay's HTTP endpoint.
const (
	// healthTimeout bounds the store query behind /healthz.
	healthTimeout = 2 * time.Second
	// httpShutdownTimeout bounds the wait for in-flight scrapes on shutdown.
	httpShutdownTimeout = 5 * time.Second
	// relayMaxConns bounds the relay's PostgreSQL pool.
	relayMaxConns = 8
)

func newRelayCmd(e *env) *cobra.Command {
	var (
		store, broker, metricsAddr, id string
		owner                          string
		logFormat, logLevel            string
		batch                          int
		poll, leaseTTL, retention      time.Duration
		queues                         []string
	)
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Run the outbox relay: publish what producers enqueued, until stopped",
		Long: `relay publishes the rows producers enqueued in their own transactions (the outbox) to the
broker, under each row's event id, and marks them published; it needs no code of yours. Run it as
a daemon beside your application: several relays on one store share the work by leases, each
ordering key has one publisher at a time, and SIGINT or SIGTERM stop it gracefully (leases are
released so another relay takes over at once).

--broker sql publishes into the queue table of the same store (queue = the row's topic);
--broker nats://HOST:PORT publishes to JetStream (subject = the row's topic), which drops a
republished event id within the stream's duplicate window;
--broker amqp://USER:PASSWORD@HOST:PORT/VHOST publishes to RabbitMQ's default exchange (queue = the
row's topic) with publisher confirms, and a row no queue takes fails instead of vanishing;
--broker redis://USER:PASSWORD@HOST:PORT/DB (or rediss://) adds to the Redis stream idem:<row's
topic>, each entry confirmed before the next, and drops a republish within two minutes;
--broker sqs://HOST:PORT?region=REGION&tls=1 sends to the SQS queue named by the row's topic (a
FIFO queue, name ending in .fifo, gets the row's Idem-Key header, else tenant/event id, as message
group, and drops a republish within five minutes).

--metrics-addr serves Prometheus metrics on /metrics (publish counts and lag, failures, outbox and
dead-letter backlog, and queue backlog of the --queue names) and a health check on /healthz
(200 when the store answers). Logs go to stderr.`,
		Example: `  idem relay --store postgres://app@db/app --broker nats://nats:4222 --metrics-addr :9464
  idem relay --store sqlite://app.db --broker sql --queue payments --log-format json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			logger, err := newLogger(e.stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			if batch < 1 {
				return usagef("--batch is %d, want at least 1", batch)
			}
			if poll <= 0 {
				return usagef("--poll is %s, want a positive duration such as 1s", formatDuration(poll))
			}
			if leaseTTL < idemrelay.LeaseTTLMin {
				return usagef("--lease-ttl is %s, want at least %s (default %s)", formatDuration(leaseTTL),
					idemrelay.LeaseTTLMin, formatDuration(idemrelay.LeaseTTLDefault))
			}
			if err := idem.ValidateOwner(owner); err != nil {
				return usagef("--owner %q: want lower-case letters, digits, '-' and '_', starting with a letter, at most %d bytes (a team or rotation name)", owner, idem.MaxOwnerBytes)
			}
			if _, err := connect.ParseBroker(broker); err != nil {
				return usageError{fmt.Errorf("--broker: %w", err)}
			}
			// The relay's rounds, its lease upkeep, the LISTEN connection and metric scrapes
			// each want a connection.
			s, err := e.openStoreConns(ctx, store, true, relayMaxConns)
			if err != nil {
				return err
			}
			defer s.Close()
			b, err := connect.OpenBroker(ctx, broker, s, connect.BrokerOptions{Name: "idem relay", Reconnect: true})
			if err != nil {
				return err
			}
			defer b.Close()

			metrics := idemprom.New(idemprom.Config{})
			relay, err := idemrelay.New(relayStore{s.Outbox, s.DeadLetters}, b.Sink, idemrelay.Config{
				ID:           id,
				Owner:        owner,
				BatchSize:    batch,
				PollInterval: poll,
				LeaseTTL:     leaseTTL,
				Retention:    retention,
				Logger:       logger,
				Observer:     metrics,
			})
			if err != nil {
				return usageError{err}
			}

			var srv *http.Server
			if metricsAddr != "" {
				ln, err := net.Listen("tcp", metricsAddr)
				if err != nil {
					return fmt.Errorf("--metrics-addr %s: %w", metricsAddr, err)
				}
				srv = metricsServer(s, metrics, queues, logger)
				go func() {
					if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
						logger.Error("idem relay: metrics server failed", slog.String("error", err.Error()))
					}
				}()
				logger.Info("idem relay: serving /metrics and /healthz", slog.String("addr", ln.Addr().String()))
			}
			logger.Info("idem relay: starting", slog.String("relay", relay.ID()),
				slog.String("store", s.URL.String()), slog.String("broker", b.URL.String()))

			runErr := relay.Run(ctx)
			if srv != nil {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownTimeout)
				_ = srv.Shutdown(sctx)
				cancel()
			}
			if runErr != nil {
				return fmt.Errorf("relay %s: %w", relay.ID(), runErr)
			}
			logger.Info("idem relay: stopped", slog.String("relay", relay.ID()))
			return nil
		},
	}
	storeFlag(cmd, &store)
	brokerFlag(cmd, &broker)
	fl := cmd.Flags()
	fl.StringVar(&metricsAddr, "metrics-addr", "", "serve /metrics and /healthz on this address, such as :9464 (default: off)")
	fl.StringSliceVar(&queues, "queue", nil, "queue-table queues whose backlog /metrics reports (repeatable)")
	fl.IntVar(&batch, "batch", idemrelay.BatchSizeDefault, "outbox rows fetched per round, and the most one publish carries")
	fl.Var(newDuration(&poll, idemrelay.PollIntervalDefault), "poll", "longest idle wait between rounds when no notification arrives")
	fl.Var(newDuration(&leaseTTL, idemrelay.LeaseTTLDefault), "lease-ttl", "lifetime of the relay's partition leases; a dead relay's work is taken over after it")
	fl.Var(newDuration(&retention, idemrelay.RetentionDefault), "outbox-retention", "delete published outbox rows older than this")
	fl.StringVar(&id, "id", "", "this relay's id in its leases, unique among relays of the store (default: <hostname>-<n>, stable across restarts on this machine)")
	fl.StringVar(&owner, "owner", "", "who is paged for the relay's dead letters (a team or rotation, such as platform); stored with each")
	fl.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

// readableDurations writes durations as Go duration text ("1.5s") rather than the JSON
// handler's integer nanoseconds, so a person can read the log.
func readableDurations(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// newLogger returns a slog logger writing to w in format at level.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: readableDurations}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usagef("--log-format %q: want text or json", format)
}

// metricsServer serves the relay's metrics, the store's backlog figures and the Go runtime's on
// /metrics from a registry of its own, and the store's health on /healthz.
//
// /healthz answers anyone who can reach the port, so its body is a bare status ("ok", or
// "unavailable" with 503); the reason — the store's error, which may name hosts, users and
// schemas — goes to the log only.
func metricsServer(s *connect.Stores, metrics *idemprom.Metrics, queues []string, logger *slog.Logger) *http.Server {
	reg := prometheus.NewRegistry()
	sc := idemprom.StoreCollectorConfig{DeadLetters: s.DeadLetters, Outbox: s.Outbox}
	if len(queues) > 0 {
		sc.Queue, sc.Queues = s.Queue, queues
	}
	reg.MustRegister(
		metrics,
		idemprom.NewStoreCollector(sc),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	mux := http.NewServeMux()
	// ContinueOnError keeps the other figures in the scrape when one store query fails
	// (idem_store_scrape_success says which).
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
		defer cancel()
		if _, err := s.Outbox.OutboxStats(ctx); err != nil {
			logger.Warn("idem relay: health check failed", slog.String("store", s.URL.String()),
				slog.String("error", idemredact.MaskText(err.Error())))
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// The metrics are the relay's observer as they are.
var _ idemrelay.Observer = (*idemprom.Metrics)(nil)

// relayStore joins the outbox and the dead-letter store the connection opened (a read-only or
// instrumented wrapper may hold each) into the one store idemrelay.New takes.
type relayStore struct {
	idemstore.OutboxRelayStore
	idemstore.DeadLetterStore
}
