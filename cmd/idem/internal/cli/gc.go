package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/retry"
)

func newGCCmd(e *env) *cobra.Command {
	var (
		store, consumer         string
		retention, outboxRetain time.Duration
		batch                   int
		force, jsonOut          bool
	)
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete claims older than the retention, and old published outbox rows",
		Long: `gc deletes claims created more than --retention ago (of one --consumer, or of all), in
batches of --batch rows so that no delete holds long locks, and published outbox rows older than
--outbox-retention (0 keeps them).

A claim is what recognises a redelivery: delete it while its event can still come back and the
event applies twice. So gc refuses a --retention shorter than idem's default redelivery window
plus the default retry policy's worst case (what a consumer with default settings requires); pass
--force only when every consumer of the store is configured for the shorter window.`,
		Example: `  idem gc                       # claims older than 7d, published outbox rows older than 1d
  idem gc --retention 14d --consumer ledger@v1`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 1 {
				return usagef("--batch is %d, want at least 1", batch)
			}
			if retention <= 0 {
				return usagef("--retention is %s, want a positive duration such as 7d", formatDuration(retention))
			}
			if outboxRetain < 0 {
				return usagef("--outbox-retention is %s, want 0 (keep) or a positive duration", formatDuration(outboxRetain))
			}
			if !force {
				if err := idem.CheckRetention(retention, idem.RedeliveryWindowDefault, retry.Policy{}, 0); err != nil {
					return usagef("--retention %s is too short for consumers with default settings: %v; pass --force if yours are configured for it",
						formatDuration(retention), err)
				}
			}
			ctx := cmd.Context()
			s, err := e.openStore(ctx, store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			now := e.now()
			before := now.Add(-retention)
			claims, err := idem.CollectGarbage(ctx, s.GC, consumer, before, batch)
			if err != nil {
				return storeErr(s, fmt.Sprintf("delete claims (%d deleted before the failure)", claims), err)
			}
			outbox := 0
			var outboxBefore time.Time
			if outboxRetain > 0 {
				outboxBefore = now.Add(-outboxRetain)
				if outbox, err = deletePublished(ctx, s.Outbox, outboxBefore, batch); err != nil {
					return storeErr(s, fmt.Sprintf("delete published outbox rows (%d claims and %d rows deleted before the failure)", claims, outbox), err)
				}
			}
			if jsonOut {
				return writeJSON(e.stdout, struct {
					ClaimsDeleted int        `json:"claims_deleted"`
					ClaimsBefore  time.Time  `json:"claims_before"`
					Consumer      string     `json:"consumer,omitempty"`
					OutboxDeleted int        `json:"outbox_deleted"`
					OutboxBefore  *time.Time `json:"outbox_before"`
				}{claims, before.UTC(), consumer, outbox, jsonTime(outboxBefore)})
			}
			who := "of all consumers"
			if consumer != "" {
				who = "of " + consumer
			}
			fmt.Fprintf(e.stdout, "deleted %s %s older than %s (created before %s)\n",
				plural(claims, "claim", "claims"), who, formatDuration(retention), timeText(before))
			if outboxRetain > 0 {
				fmt.Fprintf(e.stdout, "deleted %s older than %s\n",
					plural(outbox, "published outbox row", "published outbox rows"), formatDuration(outboxRetain))
			}
			return nil
		},
	}
	storeFlag(cmd, &store)
	cmd.Flags().Var(newDuration(&retention, idem.RetentionDefault), "retention", "delete claims created longer ago than this")
	cmd.Flags().StringVar(&consumer, "consumer", "", "only claims of this consumer, with its effect version (default: all consumers)")
	cmd.Flags().IntVar(&batch, "batch", idem.GCBatchDefault, "rows per delete statement")
	cmd.Flags().Var(newDuration(&outboxRetain, idemrelay.RetentionDefault), "outbox-retention", "delete published outbox rows older than this (0 keeps them)")
	cmd.Flags().BoolVar(&force, "force", false, "allow a --retention shorter than the default redelivery window and retry budget")
	jsonFlag(cmd, &jsonOut)
	return cmd
}

// deletePublished deletes published outbox rows older than before in batches.
func deletePublished(ctx context.Context, o idem.OutboxRelayStore, before time.Time, batch int) (int, error) {
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
