package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
)

func newGCCmd(e *env) *cobra.Command {
	var (
		store                   string
		consumerArgs            []string
		retention, outboxRetain time.Duration
		batch                   int
		all, force, jsonOut     bool
	)
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete each consumer's claims older than its retention, old published outbox rows and expired idempotency keys",
		Long: `gc deletes the claims of each consumer named with --consumer NAME=RETENTION that were
created more than RETENTION ago, in batches of --batch rows so that no delete holds long locks,
and published outbox rows older than --outbox-retention (0 keeps them). It always deletes the
Idempotency-Key middleware's keys past their retention (package idemkey): each key carries its
own expiry, so no flag is needed.

A claim is what recognises a redelivery, and a consumer accepts events up to its own Retention
old: delete its claims sooner and an event that comes back inside that window applies twice. So
every consumer's claims live for that consumer's retention, which gc cannot read from the store:
name each consumer with the Retention it is configured with (--consumer ledger@v1=30d, repeated;
--consumer NAME alone takes --retention). Claims of consumers not named are kept. Only when every
consumer of the store is configured with at most one retention may --all-consumers --retention D
delete every consumer's claims older than D.

gc also refuses a retention shorter than idem's default redelivery window plus the default retry
policy's worst case (what a consumer with default settings requires); pass --force only when the
consumer is configured for the shorter window.`,
		Example: `  idem gc --consumer ledger@v1=30d --consumer mailer@v2=7d
  idem gc --consumer ledger@v1 --retention 30d
  idem gc --all-consumers --retention 30d   # every consumer's Retention is at most 30d
  idem gc --outbox-retention 1d            # published outbox rows only; claims are kept`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 1 {
				return usagef("--batch is %d, want at least 1", batch)
			}
			explicit := cmd.Flags().Changed("retention")
			if explicit && retention <= 0 {
				return usagef("--retention is %s, want a positive duration such as 7d", formatDuration(retention))
			}
			if outboxRetain < 0 {
				return usagef("--outbox-retention is %s, want 0 (keep) or a positive duration", formatDuration(outboxRetain))
			}
			targets, err := gcTargets(consumerArgs, all, retention, explicit)
			if err != nil {
				return err
			}
			if explicit && !force {
				if err := idem.CheckRetention(retention, idem.RedeliveryWindowDefault, retry.Policy{}, 0); err != nil {
					return usagef("--retention %s is too short for consumers with default settings: %v; pass --force if yours are configured for it",
						formatDuration(retention), err)
				}
			}
			if explicit && len(targets) == 0 {
				return usagef("--retention applies to --consumer NAME or --all-consumers; without them gc keeps every claim")
			}
			if !force {
				for _, t := range targets {
					if err := idem.CheckRetention(t.Retention, idem.RedeliveryWindowDefault, retry.Policy{}, 0); err != nil {
						return usagef("retention %s of %s is too short for consumers with default settings: %v; pass --force if it is configured for it",
							formatDuration(t.Retention), t.who(), err)
					}
				}
			}
			ctx := cmd.Context()
			s, err := e.openStore(ctx, store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			now := e.now()
			claims := 0
			for i := range targets {
				t := &targets[i]
				t.Before = now.Add(-t.Retention).UTC()
				n, err := idem.CollectGarbage(ctx, s.GC, t.Consumer, t.Before, batch)
				t.Deleted = n
				claims += n
				if err != nil {
					return storeErr(s, fmt.Sprintf("delete claims of %s (%d deleted before the failure)", t.who(), claims), err)
				}
			}
			outbox := 0
			var outboxBefore time.Time
			if outboxRetain > 0 {
				outboxBefore = now.Add(-outboxRetain)
				if outbox, err = deletePublished(ctx, s.Outbox, outboxBefore, batch); err != nil {
					return storeErr(s, fmt.Sprintf("delete published outbox rows (%d claims and %d rows deleted before the failure)", claims, outbox), err)
				}
			}
			keys, err := deleteExpiredKeys(ctx, s, now, batch)
			if err != nil {
				return storeErr(s, fmt.Sprintf("delete expired idempotency keys (%d claims, %d outbox rows and %d keys deleted before the failure)", claims, outbox, keys), err)
			}
			if jsonOut {
				return writeJSON(e.stdout, struct {
					ClaimsDeleted int          `json:"claims_deleted"`
					Consumers     []gcConsumer `json:"consumers"`
					OutboxDeleted int          `json:"outbox_deleted"`
					OutboxBefore  *time.Time   `json:"outbox_before"`
					KeysDeleted   int          `json:"idempotency_keys_deleted"`
				}{claims, targets, outbox, jsonTime(outboxBefore), keys})
			}
			if len(targets) == 0 {
				fmt.Fprintln(e.stdout, "kept every claim: name each consumer with its retention (--consumer ledger@v1=30d) to delete its old claims")
			}
			for _, t := range targets {
				fmt.Fprintf(e.stdout, "deleted %s of %s older than %s (created before %s)\n",
					plural(t.Deleted, "claim", "claims"), t.who(), formatDuration(t.Retention), timeText(t.Before))
			}
			if outboxRetain > 0 {
				fmt.Fprintf(e.stdout, "deleted %s older than %s\n",
					plural(outbox, "published outbox row", "published outbox rows"), formatDuration(outboxRetain))
			}
			fmt.Fprintf(e.stdout, "deleted %s\n", plural(keys, "expired idempotency key", "expired idempotency keys"))
			return nil
		},
	}
	storeFlag(cmd, &store)
	cmd.Flags().StringArrayVar(&consumerArgs, "consumer", nil,
		"NAME=RETENTION: delete claims of consumer NAME (with its effect version) older than its configured retention; repeatable (NAME alone takes --retention)")
	cmd.Flags().Var(newDuration(&retention, 0), "retention", "retention of every --consumer given without one, or of --all-consumers")
	cmd.Flags().BoolVar(&all, "all-consumers", false, "delete every consumer's claims older than --retention (only when no consumer is configured with a longer one)")
	cmd.Flags().IntVar(&batch, "batch", idem.GCBatchDefault, "rows per delete statement")
	cmd.Flags().Var(newDuration(&outboxRetain, idemrelay.RetentionDefault), "outbox-retention", "delete published outbox rows older than this (0 keeps them)")
	cmd.Flags().BoolVar(&force, "force", false, "allow a retention shorter than the default redelivery window and retry budget")
	jsonFlag(cmd, &jsonOut)
	return cmd
}

// gcConsumer is one consumer whose claims gc deletes, and what it did.
type gcConsumer struct {
	// Consumer is the full consumer name; empty means every consumer (--all-consumers).
	Consumer  string        `json:"consumer"`
	Retention time.Duration `json:"-"`
	// RetentionText is Retention as the flags write it ("30d").
	RetentionText string    `json:"retention"`
	Before        time.Time `json:"before"`
	Deleted       int       `json:"deleted"`
}

// who names the consumer in messages.
func (c gcConsumer) who() string {
	if c.Consumer == "" {
		return "all consumers"
	}
	return c.Consumer
}

// gcTargets turns --consumer NAME[=RETENTION] flags (and --all-consumers) into the consumers
// whose claims gc deletes, each with its own retention. A consumer without an explicit retention
// is refused rather than given a default: gc cannot know how long that consumer accepts events.
func gcTargets(args []string, all bool, retention time.Duration, explicit bool) ([]gcConsumer, error) {
	if all {
		if len(args) > 0 {
			return nil, usagef("--all-consumers and --consumer do not combine: name every consumer with its retention, or none")
		}
		if !explicit {
			return nil, usagef("--all-consumers needs --retention: the longest Retention any consumer of the store is configured with")
		}
		return []gcConsumer{{Retention: retention, RetentionText: formatDuration(retention)}}, nil
	}
	seen := make(map[string]bool, len(args))
	out := make([]gcConsumer, 0, len(args))
	for _, arg := range args {
		name, value, hasValue := strings.Cut(arg, "=")
		name = strings.TrimSpace(name)
		if name == "" {
			return nil, usagef("--consumer %q names no consumer (want NAME=RETENTION, e.g. ledger@v1=30d)", arg)
		}
		if seen[name] {
			return nil, usagef("--consumer %s is given twice", name)
		}
		seen[name] = true
		r := retention
		switch {
		case hasValue:
			d, err := parseDuration(value)
			if err != nil {
				return nil, usagef("--consumer %s: %v", name, err)
			}
			if d <= 0 {
				return nil, usagef("--consumer %s: retention is %s, want a positive duration such as 30d", name, formatDuration(d))
			}
			r = d
		case !explicit:
			return nil, usagef("--consumer %s has no retention: give the Retention it is configured with (%s=30d, or --retention); gc never guesses it", name, name)
		}
		out = append(out, gcConsumer{Consumer: name, Retention: r, RetentionText: formatDuration(r)})
	}
	return out, nil
}

// deletePublished deletes published outbox rows older than before in batches.
func deletePublished(ctx context.Context, o idemstore.OutboxRelayStore, before time.Time, batch int) (int, error) {
	total := 0
	for {
		n, err := o.OutboxDeletePublished(ctx, before, batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}

// deleteExpiredKeys deletes the idempotency keys (package idemkey) that expired before now, in
// batches, from whichever store s opened.
func deleteExpiredKeys(ctx context.Context, s *connect.Stores, now time.Time, batch int) (int, error) {
	var keys interface {
		DeleteExpiredIdempotencyKeys(ctx context.Context, before time.Time, limit int) (int, error)
	}
	switch {
	case s.SQLite != nil:
		keys = s.SQLite
	case s.Postgres != nil:
		keys = s.Postgres
	case s.MySQL != nil:
		keys = s.MySQL
	default:
		return 0, nil
	}
	total := 0
	for {
		n, err := keys.DeleteExpiredIdempotencyKeys(ctx, now, batch)
		total += n
		if err != nil || n < batch {
			return total, err
		}
		if err := ctx.Err(); err != nil {
			return total, err
		}
	}
}
