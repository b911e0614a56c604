package idemredis

import (
	"errors"
	"fmt"
	"time"
)

// Defaults and bounds of the configurations.
const (
	// PrefixDefault is the key prefix when a config's Prefix is empty: a topic's stream is
	// Prefix+topic, and the source's and sink's own keys hang under it.
	PrefixDefault = "idem:"
	// LeaseDefault is the lease when SourceConfig.Lease is zero: how long a delivery stays with a
	// worker that neither settles nor extends it before another consumer of the group may claim
	// it. The consumer extends it at a third while a handler runs.
	LeaseDefault = 30 * time.Second
	// LeaseMax is the longest lease a Source accepts. Redis keeps one idle time per pending
	// entry, so the source stores a lease as LeaseMax minus the lease and every consumer claims
	// at LeaseMax: each delivery expires after its own owner's lease. A handler that runs longer
	// is extended, not given a longer lease.
	LeaseMax = 24 * time.Hour
	// LeaseMin is the shortest lease a Source accepts: the pending-entry idle time Redis keeps
	// is in milliseconds, and a shorter lease would be taken over between two extensions.
	LeaseMin = 100 * time.Millisecond
	// PollDefault is how long one blocking XREADGROUP waits when SourceConfig.Poll is zero.
	// Between two waits the source claims expired leases and moves due naks back, so it bounds
	// how late those are noticed.
	PollDefault = 500 * time.Millisecond
	// PollMin is the shortest Poll a Source accepts.
	PollMin = 10 * time.Millisecond
	// DedupWindowDefault is how long a Sink remembers a published BrokerMsgID when
	// SinkConfig.DedupWindow is zero (JetStream's default Duplicates window).
	DedupWindowDefault = 2 * time.Minute
	// MaxPayloadDefault is the largest payload a Sink publishes when SinkConfig.MaxPayload is
	// zero: every consumer group of the stream holds it in memory until the stream is trimmed.
	MaxPayloadDefault = 1 << 20
	// StartOldest and StartNewest are the positions a new consumer group starts from.
	StartOldest = "0"
	StartNewest = "$"
)

// SourceConfig configures a Source: the stream it reads, the consumer group it reads in, and
// the lease and polling of its deliveries.
type SourceConfig struct {
	// Prefix is the key prefix (default PrefixDefault); the stream read is Prefix+Stream. It
	// must match the sink's.
	Prefix string
	// Stream is the topic to consume (required): the stream key is Prefix+Stream.
	Stream string
	// Group is the consumer group (required): sources with the same group share the stream's
	// entries as competing consumers; each group gets every entry. The source creates it.
	Group string
	// Consumer names this source inside the group (default: a random name). Two live sources
	// must never share one: the lease fence tells owners apart by it.
	Consumer string
	// Start is where a group the source creates begins: StartOldest (default: every entry the
	// stream still holds) or StartNewest (only entries added after creation). An existing
	// group keeps its position.
	Start string
	// Lease is how long a delivery stays with its worker without Ack, Nak, Term or Extend
	// before another consumer of the group takes it over (default LeaseDefault, at least
	// LeaseMin). It is the pending entry's idle time: Extend resets it.
	Lease time.Duration
	// Poll bounds one blocking read (default PollDefault, at least PollMin).
	Poll time.Duration
	// Tenant, when set, is the tenant of every message from this source: the stream is bound to
	// one tenant by its credentials (Redis ACL key patterns). A different tenant claimed in the
	// Idem-Tenant field is kept in Headers under that name, so an Authenticator can refuse the
	// mismatch.
	Tenant string
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SourceConfig) WithDefaults() SourceConfig {
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.Start == "" {
		c.Start = StartOldest
	}
	if c.Lease == 0 {
		c.Lease = LeaseDefault
	}
	if c.Poll == 0 {
		c.Poll = PollDefault
	}
	return c
}

// validate reports the first invalid field of a config with defaults applied.
func (c SourceConfig) validate() error {
	switch {
	case c.Stream == "":
		return errors.New("SourceConfig.Stream is required")
	case c.Group == "":
		return errors.New("SourceConfig.Group is required")
	case c.Start != StartOldest && c.Start != StartNewest:
		return fmt.Errorf("SourceConfig.Start is %q; want %q (oldest) or %q (newest)", c.Start, StartOldest, StartNewest)
	case c.Lease < LeaseMin:
		return fmt.Errorf("SourceConfig.Lease %v is shorter than LeaseMin (%v)", c.Lease, LeaseMin)
	case c.Lease > LeaseMax:
		return fmt.Errorf("SourceConfig.Lease %v is longer than LeaseMax (%v)", c.Lease, LeaseMax)
	case c.Poll < PollMin:
		return fmt.Errorf("SourceConfig.Poll %v is shorter than PollMin (%v)", c.Poll, PollMin)
	}
	return nil
}

// SinkConfig configures a Sink.
type SinkConfig struct {
	// Prefix is the key prefix (default PrefixDefault): a message published to topic is added
	// to the stream Prefix+topic.
	Prefix string
	// DedupWindow is how long the sink remembers each BrokerMsgID it published and drops a
	// republish of it (default DedupWindowDefault; negative turns deduplication off). The
	// consumer's claims dedup anyway; this spares it the work after a relay's crash.
	DedupWindow time.Duration
	// MaxLen, when positive, caps the stream at about this many entries (XADD MAXLEN ~).
	// Entries trimmed before a group read them are lost to it: see docs/redis.md.
	MaxLen int64
	// MaxPayload is the largest payload the sink publishes (default MaxPayloadDefault); a larger
	// one fails Publish, naming its event.
	MaxPayload int
}

// WithDefaults returns c with zero fields set to their defaults.
func (c SinkConfig) WithDefaults() SinkConfig {
	if c.Prefix == "" {
		c.Prefix = PrefixDefault
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = DedupWindowDefault
	}
	if c.MaxPayload == 0 {
		c.MaxPayload = MaxPayloadDefault
	}
	return c
}

// validate reports the first invalid field of a config with defaults applied.
func (c SinkConfig) validate() error {
	switch {
	case c.DedupWindow > 0 && c.DedupWindow < time.Millisecond:
		return fmt.Errorf("SinkConfig.DedupWindow %v is shorter than a millisecond", c.DedupWindow)
	case c.MaxLen < 0:
		return fmt.Errorf("SinkConfig.MaxLen %d is negative", c.MaxLen)
	case c.MaxPayload < 0:
		return fmt.Errorf("SinkConfig.MaxPayload %d is negative", c.MaxPayload)
	}
	return nil
}
