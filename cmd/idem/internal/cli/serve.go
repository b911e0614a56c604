package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/serve"
	"github.com/idemkit/idem/idemdlq"
)

// Defaults of idem serve.
const (
	// serveAddrDefault binds to the loopback interface only: reaching the dashboard from
	// elsewhere is a decision (a reverse proxy, or --addr).
	serveAddrDefault = "127.0.0.1:8080"
	// ServeTokenEnv holds the dashboard token when --token is not given.
	ServeTokenEnv = "IDEM_SERVE_TOKEN"
	// serveMaxConns bounds the dashboard's PostgreSQL pool.
	serveMaxConns = 4
)

func newServeCmd(e *env) *cobra.Command {
	var (
		store, addr, token, trustHeader, broker, topic, keyFile string
		logFormat, logLevel                                     string
		readOnly                                                bool
		metrics, queues                                         []string
		interval                                                time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a dashboard of consumers, backlogs and dead letters, with replay and discard",
		Long: `serve runs a web dashboard over the store: consumers (throughput from their claims, errors by
class, retries, duplicates and the paused state from their metrics endpoints, dead letters pending),
queue-table and outbox backlogs (per relay partition, with its lease holder), dead letters with
filters and details (payload secrets masked), and the audit trail. Small charts show the last hour.

It binds to ` + serveAddrDefault + ` by default. Pages are readable by anyone who reaches the port;
replay and discard need either a token (--token or $` + ServeTokenEnv + `: a person logs in with it
and a name, recorded as the actor) or a reverse proxy that authenticates users and passes the
user's name in the header named by --trust-header (the proxy must drop that header from incoming
requests, and the dashboard must only be reachable through it). Every form carries a CSRF token.
--read-only refuses every action.

Replays go through --broker as with idem dlq replay (default: back into the queue table the
dead letter came from).`,
		Example: `  IDEM_SERVE_TOKEN=$(openssl rand -hex 16) idem serve --store postgres://app@db/app
  idem serve --store sqlite://idem.db --read-only --metrics http://127.0.0.1:9464/metrics
  idem serve --addr 127.0.0.1:8080 --trust-header X-Forwarded-User   # behind an authenticating proxy`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			logger, err := newLogger(e.stderr, logFormat, logLevel)
			if err != nil {
				return err
			}
			if token == "" {
				token = e.getenv(ServeTokenEnv)
			}
			token = strings.TrimSpace(token)
			if token != "" && len(token) < 16 {
				return usagef("--token is %d characters: use at least 16 (openssl rand -hex 16)", len(token))
			}
			if interval <= 0 {
				return usagef("--sample-interval is %s, want a positive duration", interval)
			}
			bu, err := checkReplayTarget(broker, topic)
			if err != nil {
				return err
			}
			for _, m := range metrics {
				if u, err := url.Parse(m); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
					return usagef("--metrics %q: want an http:// or https:// URL of a /metrics endpoint", m)
				}
			}
			st, err := e.openStoreConns(ctx, store, true, serveMaxConns)
			if err != nil {
				return err
			}
			defer st.Close()
			var rp *idemdlq.Replayer
			if !readOnly { // a read-only dashboard never publishes: no broker connection
				var b *connect.Broker
				if rp, b, err = e.openReplayer(ctx, st, broker, keyFile, "idem serve", true); err != nil {
					return err
				}
				defer b.Close()
			}
			srv, err := serve.New(serve.Config{
				Stores: st, Replayer: rp, Topic: strings.TrimSpace(topic), ArrivalTopic: bu.Kind == connect.BrokerNATS,
				Token: token, TrustHeader: trustHeader, ReadOnly: readOnly,
				MetricsURLs: metrics, Queues: queues, SampleInterval: interval,
				Now: e.now, Logger: logger,
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("--addr %s: %w", addr, err)
			}
			hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
				WriteTimeout: time.Minute, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
			runCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			go srv.Run(runCtx)
			actions := "actions disabled (no --token, no --trust-header)"
			switch {
			case readOnly:
				actions = "read-only"
			case token != "" && trustHeader != "":
				actions = "actions by token login or header " + trustHeader
			case token != "":
				actions = "actions by token login"
			case trustHeader != "":
				actions = "actions by header " + trustHeader
			}
			fmt.Fprintf(e.stdout, "idem serve: dashboard on http://%s (store %s, %s)\n", ln.Addr(), st.URL, actions)
			if !isLoopback(ln.Addr()) && token == "" && trustHeader == "" {
				logger.Warn("idem serve: listening beyond localhost: anyone who reaches the port can read dead-letter payloads (secrets masked)", slog.String("addr", ln.Addr().String()))
			}
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			select {
			case err := <-errc:
				if !errors.Is(err, http.ErrServerClosed) {
					return fmt.Errorf("serve %s: %w", addr, err)
				}
				return nil
			case <-ctx.Done():
			}
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownTimeout)
			defer scancel()
			_ = hs.Shutdown(sctx)
			return nil
		},
	}
	storeFlag(cmd, &store)
	brokerFlag(cmd, &broker)
	fl := cmd.Flags()
	fl.StringVar(&addr, "addr", serveAddrDefault, "address to listen on (keep it on localhost unless a reverse proxy fronts it)")
	fl.StringVar(&token, "token", "", "token that enables replay and discard for whoever logs in with it (default $"+ServeTokenEnv+", better: a flag shows in ps; at least 16 characters)")
	fl.StringVar(&trustHeader, "trust-header", "", "request header an authenticating reverse proxy sets to the user's name (such as X-Forwarded-User); requests carrying it may act as that user")
	fl.BoolVar(&readOnly, "read-only", false, "refuse every replay and discard")
	fl.StringVar(&topic, "topic", "", "where replays go: a queue name (sql), subject (nats) or queue/stream (amqp, redis); default: the dead letter's source queue, or on nats the subject it arrived on")
	fl.StringVar(&keyFile, "replay-key-file", "", "sign replays with the operator replay key in this file (default $IDEM_REPLAY_KEY)")
	fl.StringSliceVar(&metrics, "metrics", nil, "a consumer process's Prometheus endpoint to scrape for errors, retries, duplicates and pauses (repeatable)")
	fl.StringSliceVar(&queues, "queue", nil, "queue-table queues to chart (repeatable; default: the queues of pending dead letters)")
	fl.Var(newDuration(&interval, serve.SampleIntervalDefault), "sample-interval", "how often the charts take a point")
	fl.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	fl.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	return cmd
}

// isLoopback reports whether addr is a loopback address.
func isLoopback(addr net.Addr) bool {
	ta, ok := addr.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}
