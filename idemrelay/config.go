package idemrelay

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/retry"
)

// Defaults for Config.
const (
	// BatchSizeDefault is how many outbox rows one round fetches, and the most one Publish call
	// carries.
	BatchSizeDefault = 100
	// PollIntervalDefault bounds an idle wait when no notification arrives (SQLite has none, and
	// a PostgreSQL notification can be lost with its connection).
	PollIntervalDefault = time.Second
	// LeaseTTLDefault is how long a partition or membership lease lasts without renewal; it is
	// renewed at a third, so a dead relay's partitions are taken over within about this long.
	LeaseTTLDefault = 10 * time.Second
	// LeaseTTLMin keeps the renewal period (a third of the TTL) above timer and database noise.
	LeaseTTLMin = 30 * time.Millisecond
	// RetentionDefault is how long published rows are kept (for inspection) before deletion.
	RetentionDefault = 24 * time.Hour
	// GCBatchDefault bounds one delete of published rows, so that a large backlog never holds
	// long locks.
	GCBatchDefault = 1000
	// GCIntervalDefault is how often published rows older than the retention are deleted.
	GCIntervalDefault = time.Minute
)

// Names the relay writes into shared tables.
const (
	// ConsumerName is the consumer name of the relay's dead letters, so operators can list them
	// apart from the consumers' (`idem dlq list --consumer relay`).
	ConsumerName = "relay"
	// MemberLeasePrefix starts the name of each relay's membership lease ("relay/member/<ID>");
	// the relays count the live ones to compute their fair share of partitions.
	MemberLeasePrefix = "relay/member/"
	// PartitionLeasePrefix starts the name of each partition's lease ("relay/partition/<k>");
	// whoever holds it is the only relay publishing that partition's rows.
	PartitionLeasePrefix = "relay/partition/"
	// SourcePrefix starts the Source of the relay's dead letters: "outbox:<outbox topic>".
	SourcePrefix = "outbox:"
)

// maxIDLen bounds Config.ID, which is stored in lease names and owners.
const maxIDLen = 200

// Observer receives the relay's outcomes, for metrics. Implementations must be safe for
// concurrent use and must not block.
type Observer interface {
	// Published is called after n rows were published to topic and marked published; lag is
	// how long the oldest of them waited in the outbox. (*idemprom.Metrics satisfies Observer.)
	Published(topic string, n int, lag time.Duration)
	// PublishFailed is called once per row whose publish failed; class is how the error was
	// classified and dead reports that the row was dead-lettered rather than scheduled for
	// another attempt.
	PublishFailed(topic string, class idem.Class, dead bool)
}

// Config configures a Relay. Zero fields take the documented defaults (see WithDefaults);
// validation names the field of every error.
type Config struct {
	// ID identifies this relay in its leases. It must be unique among the relays sharing a
	// database: two processes with one ID would both believe they own the same partitions.
	//
	// New's default is stable per machine: "<hostname>-<slot>", the lowest slot whose lock file
	// (in the OS temp directory, one per user) no live process holds, so a relay killed and
	// restarted on the same machine takes its old ID back and resumes its partitions at once
	// instead of waiting LeaseTTL for its own leases. Where file locks are unavailable, and from
	// WithDefaults alone, it is "<hostname>-<pid>-<random hex>". Set ID yourself when one
	// machine runs relays for several databases and each should keep its partitions across
	// restarts (e.g. "orders-relay-1").
	ID string
	// Owner is who is paged for the relay's dead letters (a team or rotation, the rule of
	// idem.ValidateOwner), stored with each; empty means none.
	Owner string
	// BatchSize is how many rows one round fetches (default BatchSizeDefault). When rows held
	// back behind a not-yet-due row fill a whole batch, the relay fetches more next round (up to
	// 64 times as many) so that the other keys of those partitions are not starved.
	BatchSize int
	// PollInterval bounds an idle wait between rounds (default PollIntervalDefault).
	PollInterval time.Duration
	// LeaseTTL is the lifetime of the partition and membership leases (default LeaseTTLDefault,
	// at least LeaseTTLMin); they are renewed every LeaseTTL/3. A publish must finish within the
	// lease it started under, less a tenth of LeaseTTL that gives what a cut-off publish had
	// already sent the time to land before another relay can take the partition: a little over
	// half of LeaseTTL at worst (a publish begun just before a renewal). A slower one is cut off
	// and counts as a transient failure, so raise LeaseTTL for slow sinks.
	LeaseTTL time.Duration
	// Retry bounds publish retries of one row, counted from its first publish attempt (not its
	// creation: a relay that was down or behind must not dead-letter a row on its first
	// failure): after the budget, or at once on a permanent error, the row is marked dead and a
	// dead letter is written (consumer ConsumerName, reason retries_exhausted or
	// permanent_error). A dead row holds its key back — the key's later rows are not published —
	// until an operator replays or discards that dead letter (`idem dlq replay|discard`); the
	// relay then releases the row and the key goes on.
	Retry retry.Policy
	// SkipDeadRows lets a key's later rows go out past its dead row instead of waiting for the
	// operator: per-key order is then given up for that key. Use it only where later events do
	// not depend on earlier ones; the dead row is still released when its dead letter is
	// replayed or discarded.
	SkipDeadRows bool
	// Retention is how long published rows are kept before they are deleted (default
	// RetentionDefault).
	Retention time.Duration
	// GCBatch bounds one delete of published rows (default GCBatchDefault).
	GCBatch int
	// GCInterval is how often published rows are deleted, starting at Run (default
	// GCIntervalDefault).
	GCInterval time.Duration
	// Topic maps an outbox row to the sink topic it is published to (default: its Topic). An
	// empty result is a permanent error for that row.
	Topic func(idem.Outgoing) string
	// Redact configures the masking of secrets in dead-letter errors and logs.
	Redact idemredact.Config
	// Logger receives the relay's log lines (default slog.Default()).
	Logger *slog.Logger
	// Observer, when set, receives publish and failure counts.
	Observer Observer
	// Now returns the current time (default time.Now). Lease times are computed from it, so all
	// relays of a database need reasonably synchronised clocks.
	Now func() time.Time
	// Rand is the retry jitter source (default a private math/rand/v2 source per decision).
	Rand retry.Rand
}

// WithDefaults returns a copy of c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		c.ID = defaultID()
	}
	if c.BatchSize == 0 {
		c.BatchSize = BatchSizeDefault
	}
	if c.PollInterval == 0 {
		c.PollInterval = PollIntervalDefault
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = LeaseTTLDefault
	}
	c.Retry = c.Retry.WithDefaults()
	if c.Retention == 0 {
		c.Retention = RetentionDefault
	}
	if c.GCBatch == 0 {
		c.GCBatch = GCBatchDefault
	}
	if c.GCInterval == 0 {
		c.GCInterval = GCIntervalDefault
	}
	if c.Topic == nil {
		c.Topic = func(o idem.Outgoing) string { return o.Topic }
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports every invalid field of a config that WithDefaults has filled in.
func (c Config) Validate() error {
	var errs []error
	if c.ID == "" || len(c.ID) > maxIDLen {
		errs = append(errs, fmt.Errorf("ID %q: want 1 to %d bytes", c.ID, maxIDLen))
	}
	if err := idem.ValidateOwner(c.Owner); err != nil {
		errs = append(errs, err)
	}
	if c.BatchSize < 1 {
		errs = append(errs, fmt.Errorf("BatchSize is %d, want > 0", c.BatchSize))
	}
	if c.PollInterval <= 0 {
		errs = append(errs, fmt.Errorf("PollInterval is %v, want > 0", c.PollInterval))
	}
	if c.LeaseTTL < LeaseTTLMin {
		errs = append(errs, fmt.Errorf("LeaseTTL is %v, want at least %v", c.LeaseTTL, LeaseTTLMin))
	}
	if err := c.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("Retry: %w", err))
	}
	if c.Retention <= 0 {
		errs = append(errs, fmt.Errorf("Retention is %v, want > 0", c.Retention))
	}
	if c.GCBatch < 1 {
		errs = append(errs, fmt.Errorf("GCBatch is %d, want > 0", c.GCBatch))
	}
	if c.GCInterval <= 0 {
		errs = append(errs, fmt.Errorf("GCInterval is %v, want > 0", c.GCInterval))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("idemrelay: config: %w", errors.Join(errs...))
}

// hostname is the machine's name, "relay" when it has none, cut to keep IDs within maxIDLen.
func hostname() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "relay"
	}
	if len(host) > maxIDLen/2 {
		host = host[:maxIDLen/2]
	}
	return host
}

// defaultID is "<hostname>-<pid>-<8 random hex digits>": readable in lease tables, and unique
// even when two relays start in one container image with the same hostname and pid.
func defaultID() string {
	host := hostname()
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
}
