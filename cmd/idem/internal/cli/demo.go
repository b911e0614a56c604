package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/cmd/idem/internal/demo"
	"github.com/idemkit/idem/idemredact"
)

func newDemoCmd(e *env) *cobra.Command {
	var (
		opts      demo.Options
		jsonOut   bool
		logLevel  string
		defaults  = demo.Options{}.WithDefaults()
		storeFlag string
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Push events through duplicates, failures and lost acks, and check exactly-once",
		Long: `demo produces --events payment events through the outbox, relays them to the broker and
consumes them with --concurrency workers, while it injects duplicate deliveries, transient and
poison (permanent) failures and lost acks (a crash after the commit, before the ack, so the
broker redelivers) at the given rates (0 to 1). Then it checks the guarantee: every event applied
exactly once or dead-lettered with a reason, nothing lost. It runs on nothing but Go with the
default SQLite store.

The counts add up, and the verdict says how: deliveries = processed + duplicates ignored +
retries + dead-lettered + other (given back without a verdict); duplicates ignored come from the
injected duplicates that reached the consumer and from the lost acks (a copy of a poison message
is dead-lettered again instead, and a broker may drop a duplicate by its message id).

The verdict is printed as a table (or one JSON object with --json); the exit status is 0 only when
the verdict is ok. demo does not read $` + StoreEnv + `: it writes synthetic events and should never
land in a real database by accident.

With --http there is no broker: the relay signs each event and POSTs it to a webhook ingress
(idemwebhook) on a loopback port, retrying 503s and cut connections as a webhook provider does;
a lost ack then cuts the connection after the commit, before the answer.

--broker pubsub://embedded and --broker kafka://embedded need no service: demo starts Google's
Pub/Sub emulator (pstest) or franz-go's Kafka cluster (kfake) in-process, creates the run's topic
(and subscription or retry topic) and runs through idempubsub or idemkafka. Only the embedded
form is accepted; demo connects to no real Pub/Sub or Kafka.`,
		Example: `  idem demo
  idem demo --events 1000 --lost-acks 0.01 --json
  idem demo --store postgres://postgres@127.0.0.1/test --broker nats://127.0.0.1:4222
  idem demo --http --events 2000
  idem demo --fanout --events 2000
  idem demo --broker sqs://127.0.0.1:5000    # moto_server -p 5000: SQS on this machine
  idem demo --broker pubsub://embedded       # an in-process Pub/Sub server, no service needed
  idem demo --broker kafka://embedded        # an in-process Kafka cluster, no service needed`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			opts.Store = strings.TrimSpace(storeFlag)
			logger, err := newLogger(e.stderr, "text", logLevel)
			if err != nil {
				return err
			}
			opts.Logger = logger
			// The flags start from demo.Options{}.WithDefaults(), so every field is set; calling
			// WithDefaults again would turn "--duplicates 0 --transient 0 --poison 0 --lost-acks 0"
			// back into the default rates.
			if err := opts.Validate(); err != nil {
				return usageError{err}
			}
			var bar *progressBar
			if !jsonOut {
				// A terminal gets a bar; a pipe or file a line every few seconds, so a long run
				// in CI or under nohup is not silent.
				bar = &progressBar{w: e.stderr, now: e.now, lines: !e.isTerminal(e.stderr)}
				opts.Progress = bar.update
			}
			verdict, err := demo.Run(ctx, opts)
			bar.finish()
			if err != nil {
				return fmt.Errorf("demo on store %s: %w", idemredact.URL(opts.Store), err)
			}
			if jsonOut {
				err = writeJSON(e.stdout, verdict)
			} else {
				err = verdict.WriteTable(e.stdout)
			}
			if err != nil {
				return err
			}
			if !verdict.OK {
				msg := "demo verdict: NOT ok"
				if len(verdict.Problems) > 0 {
					msg += ": " + strings.Join(verdict.Problems, "; ")
				}
				return exitError{code: ExitFailure, err: errors.New(msg)}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&storeFlag, "store", defaults.Store, "store DSN: sqlite://PATH, postgres://USER:PASSWORD@HOST:PORT/DB or mysql://USER:PASSWORD@HOST:PORT/DB")
	fl.StringVar(&opts.Broker, "broker", defaults.Broker, "broker: sql (the queue table in the store), nats://HOST:PORT, amqp://USER:PASSWORD@HOST:PORT/VHOST, redis://USER:PASSWORD@HOST:PORT/DB or sqs://HOST:PORT?region=REGION&tls=1 or sqs://aws?region=REGION (SQS, or an emulator such as moto_server on localhost; credentials from KEY_ID:SECRET@ in the URL, else the AWS default chain: environment, profile=/AWS_PROFILE, SSO, web identity, instance role), pubsub://embedded or kafka://embedded (an in-process Pub/Sub server or Kafka cluster demo starts)")
	fl.IntVar(&opts.Events, "events", defaults.Events, "events to produce")
	fl.IntVar(&opts.Concurrency, "concurrency", defaults.Concurrency, "consumer workers")
	fl.BoolVar(&opts.FanOut, "fanout", false, "also run an e-mail consumer of the same topic, each on a queue-table subscription of its own (fan-out); both must apply every event once (needs --broker sql)")
	fl.IntVar(&opts.Batch, "batch", 0, "process up to this many deliveries per transaction (batched mode; 0 or 1: one per event)")
	fl.Int64Var(&opts.Seed, "seed", defaults.Seed, "random seed: the same seed injects the same faults")
	fl.Float64Var(&opts.Duplicates, "duplicates", defaults.Duplicates, "rate of duplicated deliveries (0 to 1)")
	fl.Float64Var(&opts.Transient, "transient", defaults.Transient, "rate of transient handler failures, retried (0 to 1)")
	fl.Float64Var(&opts.Poison, "poison", defaults.Poison, "rate of poison events that must be dead-lettered (0 to 1)")
	fl.Float64Var(&opts.LostAcks, "lost-acks", defaults.LostAcks, "rate of lost acks: a crash after commit, before ack, so the broker redelivers (0 to 1)")
	fl.Float64Var(&opts.LostAcks, "crash", defaults.LostAcks, "old name of --lost-acks")
	_ = fl.MarkDeprecated("crash", "use --lost-acks")
	fl.Var(newDuration(&opts.Timeout, defaults.Timeout), "timeout", "give up after this long")
	fl.BoolVar(&opts.HTTP, "http", false, "deliver through a webhook ingress over HTTP instead of a broker (signed POSTs, retried like a provider)")
	fl.StringVar(&logLevel, "log-level", "error", "log level on stderr: debug, info, warn or error")
	jsonFlag(cmd, &jsonOut)
	return cmd
}

// progressBar draws "[#####.....]  4200/10000  42%" on one terminal line, at most ten times a
// second; with lines set (not a terminal) it prints "demo: 4200/10000 orders settled (42%)" every
// progressLineEvery and at the end instead. demo may report progress from several goroutines.
type progressBar struct {
	w     io.Writer
	now   func() time.Time
	lines bool
	mu    sync.Mutex
	last  time.Time
	done  bool
	drew  bool
}

// progressLineEvery spaces the progress lines written to a pipe or file.
const progressLineEvery = 5 * time.Second

const progressWidth = 30

func (p *progressBar) update(done, total int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done || total <= 0 {
		return
	}
	now := p.now()
	every := 100 * time.Millisecond
	if p.lines {
		every = progressLineEvery
		if p.last.IsZero() {
			p.last = now // the first line after progressLineEvery, not at once
		}
	}
	if done < total && now.Sub(p.last) < every {
		return
	}
	p.last = now
	done = min(max(done, 0), total)
	if p.lines {
		fmt.Fprintf(p.w, "demo: %d/%d orders settled (%d%%)\n", done, total, done*100/total)
		if done == total {
			p.done = true
		}
		return
	}
	filled := done * progressWidth / total
	fmt.Fprintf(p.w, "\r[%s%s] %*d/%d %3d%%", strings.Repeat("#", filled), strings.Repeat(".", progressWidth-filled),
		len(fmt.Sprint(total)), done, total, done*100/total)
	p.drew = true
}

// finish ends the bar's line so that what follows starts on a fresh one; nil-safe.
func (p *progressBar) finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drew && !p.done {
		fmt.Fprintln(p.w)
	}
	p.done = true
}
