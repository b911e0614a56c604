package idemkafka

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Defaults and bounds of SourceConfig.
const (
	// LeaseDefault is how long a delivered record stays with its handler before the Source
	// hands it out again, when SourceConfig.Lease is zero. Kafka has no broker-side lease: this
	// one lives in the Source's process, and the consumer extends it at a third while a handler
	// runs.
	LeaseDefault = 30 * time.Second
	// MaxBufferedDefault bounds the records fetched but not yet settled, over all partitions,
	// when SourceConfig.MaxBuffered is zero; past it the Source stops fetching.
	MaxBufferedDefault = 10_000
	// CommitIntervalDefault is how long the Source gathers settled records before committing
	// their offsets, when SourceConfig.CommitInterval is zero.
	CommitIntervalDefault = 100 * time.Millisecond
	// RevokeWaitDefault is how long a revoked partition's in-flight records may still settle
	// (and so commit) before the partition is given up, when SourceConfig.RevokeWait is zero.
	RevokeWaitDefault = 5 * time.Second
)

// Order says which earlier records of its partition a record waits for before it is delivered.
// Kafka keeps a partition in order; how much of that order reaches the handlers is a choice
// between order and parallelism, since the consumer runs several handlers at once.
type Order int

const (
	// OrderKey (the default) delivers a record once every earlier record of its partition with
	// the same key settled: a key's events are handled one at a time and in order (the guarantee
	// idem gives per key), while the partition's other keys go on in parallel.
	OrderKey Order = iota
	// OrderPartition delivers one record of a partition at a time, in offset order.
	OrderPartition
	// OrderNone delivers every fetched record at once; only the offset commits stay in order.
	OrderNone
)

// String names the order as in the docs.
func (o Order) String() string {
	switch o {
	case OrderKey:
		return "OrderKey"
	case OrderPartition:
		return "OrderPartition"
	case OrderNone:
		return "OrderNone"
	}
	return fmt.Sprintf("Order(%d)", int(o))
}

// RetryTiersDefault are the delay tiers of the retry topics when SourceConfig.RetryTiers is nil.
var RetryTiersDefault = []time.Duration{time.Second, 10 * time.Second, time.Minute, 10 * time.Minute, time.Hour}

// SourceConfig configures a Source: which topic and consumer group it reads, and how it retries.
type SourceConfig struct {
	// Topic is the topic to consume (required).
	Topic string
	// Group is the consumer group (required). Sources with the same Group share the topic's
	// partitions; a reopened source resumes from the group's committed offsets.
	Group string
	// ClientOptions are the connection options of the Source's own kgo client: seed brokers,
	// TLS, SASL, timeouts. The Source adds the group, topics, manual commits and rebalance
	// callbacks itself; an option that sets them again is refused by kgo or overridden.
	ClientOptions []kgo.Opt
	// Lease is how long a delivered record stays with one handler before the Source hands it
	// out again as the next attempt (default LeaseDefault). It is held in this process only.
	Lease time.Duration
	// RetryTiers are the delays of the group's retry topics "<Topic>.retry.<Group>.<tier>ms"
	// (see RetryTopic):
	// Nak(delay) produces a copy to the topic of the largest tier not above delay (the smallest
	// tier for shorter delays) and the copy is delivered once its own delay has passed. Nil means
	// RetryTiersDefault; an empty, non-nil slice disables retry topics: a Nak with delay then
	// holds the record in this process, ahead of the records it holds back (see Order), for the delay. Each retry
	// topic must exist (RetryTopics lists them); the Source consumes them with Topic. With retry
	// tiers, Topic and Group must make legal topic names.
	RetryTiers []time.Duration
	// Order is which records of a partition wait for earlier ones to settle before they are
	// delivered (default OrderKey). Offsets are committed in order whatever it is.
	Order Order
	// MaxBuffered bounds the fetched records not yet settled (default MaxBufferedDefault).
	MaxBuffered int
	// CommitInterval is how long settled offsets gather before a commit (default
	// CommitIntervalDefault). A crash loses at most this much commit progress, which only means
	// redeliveries the consumer's claims recognise.
	CommitInterval time.Duration
	// RevokeWait is how long, when the group takes a partition away, the Source waits for the
	// partition's in-flight records to settle before giving it up (default RevokeWaitDefault);
	// records that settle later are redelivered to the new owner. It must stay well below the
	// group's rebalance timeout (kgo's default is a minute).
	RevokeWait time.Duration
	// StartAtEnd makes a group without committed offsets start at the end of the topic; the
	// default starts at the beginning, so nothing published before the group existed is missed.
	StartAtEnd bool
	// EventIDOf, when set, gives the event id of a record that carries no Idem-Event-Id (from a
	// producer that does not know idem). Derive it from the fields that define the event (for
	// example provider, payment id and status in the payload), never from the record's offset:
	// the same event published twice must get the same id. Nil leaves such records without id,
	// and the consumer dead-letters them as invalid_payload.
	EventIDOf func(r *kgo.Record) string
	// Logger receives fetch errors and failed commits (default slog.Default()).
	Logger *slog.Logger
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SourceConfig) WithDefaults() SourceConfig {
	if c.Lease == 0 {
		c.Lease = LeaseDefault
	}
	if c.RetryTiers == nil {
		c.RetryTiers = slices.Clone(RetryTiersDefault)
	}
	if c.MaxBuffered == 0 {
		c.MaxBuffered = MaxBufferedDefault
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = CommitIntervalDefault
	}
	if c.RevokeWait == 0 {
		c.RevokeWait = RevokeWaitDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate reports every invalid field of a config with defaults applied, naming each.
func (c SourceConfig) validate() error {
	var errs []error
	if c.Topic == "" {
		errs = append(errs, errors.New("Topic is empty"))
	}
	if c.Group == "" {
		errs = append(errs, errors.New("Group is empty"))
	}
	if c.Lease < 0 {
		errs = append(errs, fmt.Errorf("Lease is %v, want > 0", c.Lease))
	}
	for i, d := range c.RetryTiers {
		if d <= 0 || d%time.Millisecond != 0 {
			errs = append(errs, fmt.Errorf("RetryTiers[%d] is %v, want a positive whole number of milliseconds", i, d))
		} else if i > 0 && d <= c.RetryTiers[i-1] {
			errs = append(errs, fmt.Errorf("RetryTiers[%d] is %v, want more than RetryTiers[%d] (%v): tiers ascend", i, d, i-1, c.RetryTiers[i-1]))
		}
	}
	if c.Order < OrderKey || c.Order > OrderNone {
		errs = append(errs, fmt.Errorf("Order is %d, want OrderKey, OrderPartition or OrderNone", c.Order))
	}
	if c.Topic != "" && c.Group != "" && len(c.RetryTiers) > 0 {
		if err := checkTopicName(RetryTopic(c.Topic, c.Group, c.RetryTiers[len(c.RetryTiers)-1])); err != nil {
			errs = append(errs, fmt.Errorf("retry topic %q: %w", RetryTopic(c.Topic, c.Group, c.RetryTiers[len(c.RetryTiers)-1]), err))
		}
	}
	if c.MaxBuffered < 0 {
		errs = append(errs, fmt.Errorf("MaxBuffered is %d, want > 0", c.MaxBuffered))
	}
	if c.CommitInterval < 0 {
		errs = append(errs, fmt.Errorf("CommitInterval is %v, want > 0", c.CommitInterval))
	}
	if c.RevokeWait < 0 {
		errs = append(errs, fmt.Errorf("RevokeWait is %v, want >= 0", c.RevokeWait))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("idemkafka: invalid SourceConfig for topic %q group %q: %w", c.Topic, c.Group, err)
	}
	return nil
}

// retryInfix separates a topic's name from the group and tier in a retry topic's name.
const retryInfix = ".retry."

// maxTopicName is Kafka's limit on a topic name's length.
const maxTopicName = 249

// RetryTopic is the name of group's retry topic of tier on topic:
// "<topic>.retry.<group>.<ms>ms". Retry topics belong to one consumer group: a copy carries
// that group's attempt count and is meant for that group's handler alone, so another group
// reading the same topic never sees it.
func RetryTopic(topic, group string, tier time.Duration) string {
	return topic + retryInfix + group + "." + strconv.FormatInt(tier.Milliseconds(), 10) + "ms"
}

// RetryTopics lists the retry topics a Source on topic in group with the given tiers consumes
// and produces to; create them with the partitions and replication of topic.
func RetryTopics(topic, group string, tiers []time.Duration) []string {
	out := make([]string, len(tiers))
	for i, d := range tiers {
		out[i] = RetryTopic(topic, group, d)
	}
	return out
}

// checkTopicName reports why name is not a legal Kafka topic name, or nil.
func checkTopicName(name string) error {
	if len(name) > maxTopicName {
		return fmt.Errorf("%d bytes, more than Kafka's %d", len(name), maxTopicName)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("contains %q; Kafka topic names take only letters, digits, '.', '_' and '-'", c)
		}
	}
	return nil
}

// RetryTier returns the tier a Nak(delay) goes to: the largest tier not above delay, or the
// smallest tier for a shorter delay. The copy carries its own due time (HeaderRetryAt), so the
// tier only groups copies of similar delay: within one retry partition the Source delivers each
// copy when it is due, whatever its place.
func RetryTier(tiers []time.Duration, delay time.Duration) time.Duration {
	i, found := slices.BinarySearch(tiers, delay)
	switch {
	case found:
		return tiers[i]
	case i == 0:
		return tiers[0]
	default:
		return tiers[i-1]
	}
}
