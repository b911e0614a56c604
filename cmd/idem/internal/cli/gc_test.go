package cli

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
)

// TestGC: claims live for their own consumer's retention. gc deletes a consumer's claims only
// when told that consumer's retention, each at its own; without one it keeps them (the old gc
// deleted every consumer's claims at one default of 7 days, under a consumer that accepts
// events for 30, so a redelivery on day 10 applied twice).
func TestGC(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := kind.dsn(t)
			st := openMigrated(t, dsn)
			now := time.Now()
			ledgerOld := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "old"}
			ledgerMid := idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "mid"}
			mailerOld := idem.Key{Tenant: "acme", Consumer: "mailer@v1", EventID: "old"}
			mailerRecent := idem.Key{Tenant: "acme", Consumer: "mailer@v1", EventID: "recent"}
			auditOld := idem.Key{Tenant: "acme", Consumer: "audit@v3", EventID: "old"}
			seedClaim(t, st, ledgerOld, now.Add(-40*day))
			seedClaim(t, st, ledgerMid, now.Add(-10*day)) // inside ledger's 30 days
			seedClaim(t, st, mailerOld, now.Add(-10*day))
			seedClaim(t, st, mailerRecent, now.Add(-6*day))
			seedClaim(t, st, auditOld, now.Add(-40*day))
			seedOutbox(t, st,
				idem.Outgoing{EventID: "o1", Topic: "payments"},
				idem.Outgoing{EventID: "o2", Topic: "payments"},
				idem.Outgoing{EventID: "o3", Topic: "payments"})
			rows, err := st.Outbox.OutboxFetch(ctx, idemstore.OutboxFetchParams{Partitions: allPartitions(st), Limit: 10})
			require.NoError(t, err)
			require.Len(t, rows, 3)
			require.NoError(t, st.Outbox.OutboxMarkPublished(ctx, []int64{rows[0].ID}, now.Add(-2*day)))
			require.NoError(t, st.Outbox.OutboxMarkPublished(ctx, []int64{rows[1].ID}, now.Add(-time.Hour)))

			// No consumer named: every claim is kept; published outbox rows still go.
			r := idemCLI(t, "gc", "--store", dsn)
			requireOK(t, r)
			require.Contains(t, r.stdout, "kept every claim")
			require.Contains(t, r.stdout, "deleted 1 published outbox row older than 1d")
			for _, k := range []idem.Key{ledgerOld, ledgerMid, mailerOld, mailerRecent, auditOld} {
				require.Equal(t, idemstore.ClaimDuplicate, claimStatus(t, st, k), "%s kept", k)
			}

			// Each consumer at its own retention, in batches of one; audit@v3 is not named.
			r = idemCLI(t, "gc", "--store", dsn, "--batch", "1", "--outbox-retention", "0", "--json",
				"--consumer", "ledger@v1=30d", "--consumer", "mailer@v1=7d")
			requireOK(t, r)
			var res struct {
				ClaimsDeleted int `json:"claims_deleted"`
				Consumers     []struct {
					Consumer  string `json:"consumer"`
					Retention string `json:"retention"`
					Deleted   int    `json:"deleted"`
				} `json:"consumers"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
			require.Equal(t, 2, res.ClaimsDeleted)
			require.Len(t, res.Consumers, 2)
			require.Equal(t, "ledger@v1", res.Consumers[0].Consumer)
			require.Equal(t, "30d", res.Consumers[0].Retention)
			require.Equal(t, 1, res.Consumers[0].Deleted)
			require.Equal(t, 1, res.Consumers[1].Deleted)
			require.Equal(t, idemstore.ClaimNew, claimStatus(t, st, ledgerOld))
			require.Equal(t, idemstore.ClaimDuplicate, claimStatus(t, st, ledgerMid), "10 days old is inside ledger's 30")
			require.Equal(t, idemstore.ClaimNew, claimStatus(t, st, mailerOld))
			require.Equal(t, idemstore.ClaimDuplicate, claimStatus(t, st, mailerRecent))
			require.Equal(t, idemstore.ClaimDuplicate, claimStatus(t, st, auditOld), "a consumer not named keeps its claims")

			// NAME alone takes --retention.
			r = idemCLI(t, "gc", "--store", dsn, "--consumer", "audit@v3", "--retention", "30d")
			requireOK(t, r)
			require.Contains(t, r.stdout, "deleted 1 claim of audit@v3 older than 30d")
			require.Equal(t, idemstore.ClaimNew, claimStatus(t, st, auditOld))

			// Every consumer at one retention, only when asked for explicitly; below the default
			// redelivery window it needs --force.
			requireOneLineError(t, idemCLI(t, "gc", "--store", dsn, "--all-consumers", "--retention", "1d"), ExitUsage, "too short")
			r = idemCLI(t, "gc", "--store", dsn, "--all-consumers", "--retention", "1d", "--force")
			requireOK(t, r)
			require.Contains(t, r.stdout, "deleted 2 claims of all consumers older than 1d")
			require.Equal(t, idemstore.ClaimNew, claimStatus(t, st, ledgerMid))
		})
	}
}

// TestGCRefusesUnknownRetention: gc never guesses how long a consumer accepts events.
func TestGCRefusesUnknownRetention(t *testing.T) {
	t.Parallel()
	dsn := sqliteDSN(t)
	requireOK(t, idemCLI(t, "migrate", "--store", dsn))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"consumer without retention", []string{"--consumer", "ledger@v1"}, "--consumer ledger@v1 has no retention"},
		{"all consumers without retention", []string{"--all-consumers"}, "--all-consumers needs --retention"},
		{"all consumers and named ones", []string{"--all-consumers", "--retention", "30d", "--consumer", "a@v1=30d"}, "do not combine"},
		{"retention alone", []string{"--retention", "30d"}, "--retention applies to --consumer NAME or --all-consumers"},
		{"consumer twice", []string{"--consumer", "a@v1=30d", "--consumer", "a@v1=40d"}, "--consumer a@v1 is given twice"},
		{"bad consumer retention", []string{"--consumer", "a@v1=soon"}, `--consumer a@v1: invalid duration "soon"`},
		{"zero consumer retention", []string{"--consumer", "a@v1=0s"}, "retention is 0s, want a positive duration"},
		{"empty consumer name", []string{"--consumer", "=30d"}, "names no consumer"},
		{"consumer retention too short", []string{"--consumer", "a@v1=1h"}, "retention 1h0m0s of a@v1 is too short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			requireOneLineError(t, idemCLI(t, append([]string{"gc", "--store", dsn}, tc.args...)...), ExitUsage, tc.want)
		})
	}
}
