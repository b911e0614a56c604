package cli

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestQueueSubscriptionCommands(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := kind.dsn(t)
			st := openMigrated(t, dsn)

			r := idemCLI(t, "queue", "subscriptions", "--store", dsn, "--topic", "orders")
			requireOK(t, r)
			require.Equal(t, "orders has no subscriptions: its consumers compete for one copy of each message\n", r.stdout)

			for _, name := range []string{"ledger", "email", "ledger"} {
				r = idemCLI(t, "queue", "subscribe", "--store", dsn, "--topic", "orders", "--name", name)
				requireOK(t, r)
				require.Equal(t, "subscribed "+name+" to orders: its queue is orders#"+name+"\n", r.stdout)
			}
			require.NoError(t, st.Queue.QueuePublish(ctx, "orders", idem.Message{EventID: "o1"}, idem.Message{EventID: "o2"}))

			r = idemCLI(t, "queue", "subscriptions", "--store", dsn, "--topic", "orders", "--json")
			requireOK(t, r)
			var subs []subscriptionStatus
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &subs), r.stdout)
			require.Len(t, subs, 2)
			require.Equal(t, "email", subs[0].Name)
			require.Equal(t, "orders#email", subs[0].Queue)
			require.EqualValues(t, 2, subs[0].Backlog)
			require.NotNil(t, subs[0].OldestAt)
			require.Equal(t, "ledger", subs[1].Name)
			require.EqualValues(t, 2, subs[1].Backlog)

			// Without --yes: only how many jobs would go.
			r = idemCLI(t, "queue", "unsubscribe", "--store", dsn, "--topic", "orders", "--name", "email")
			requireOneLineError(t, r, ExitUsage, "unsubscribing email from orders would delete 2 jobs of its queue orders#email; add --yes to do it")
			r = idemCLI(t, "queue", "unsubscribe", "--store", dsn, "--topic", "orders", "--name", "email", "--yes")
			requireOK(t, r)
			require.Equal(t, "unsubscribed email from orders and deleted 2 jobs\n", r.stdout)
			r = idemCLI(t, "queue", "subscriptions", "--store", dsn, "--topic", "orders")
			requireOK(t, r)
			require.Regexp(t, `^ledger\s+orders#ledger\s+2 jobs\n$`, r.stdout)
		})
	}
}

func TestQueueSubscriptionFlags(t *testing.T) {
	t.Parallel()
	dsn := sqliteDSN(t)
	openMigrated(t, dsn)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "subscriptions", "--store", dsn}, "--topic is required"},
		{[]string{"queue", "subscribe", "--store", dsn, "--topic", "orders"}, "--name is required"},
		{[]string{"queue", "subscribe", "--store", dsn, "--topic", "orders", "--name", "a#b"}, `the name may not contain "#"`},
		{[]string{"queue", "unsubscribe", "--store", dsn, "--topic", "x#y", "--name", "a", "--yes"}, `a topic with subscriptions may not contain "#"`},
		{[]string{"queue", "subscribe", "--store", dsn, "--topic", "orders", "--name", "a", "extra"}, "takes no arguments"},
	} {
		requireOneLineError(t, idemCLI(t, tc.args...), ExitUsage, tc.want)
	}
	r := idemCLI(t, "queue", "--help")
	requireOK(t, r)
	for _, c := range []string{"subscriptions", "subscribe", "unsubscribe"} {
		require.Contains(t, r.stdout, "\n  "+c+" ")
	}
}
