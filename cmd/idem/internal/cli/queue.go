package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemstore"
)

func newQueueCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "List, create and remove the queue table's subscriptions (fan-out)",
		Long: `queue operates the subscriptions of the queue table (see docs/queue.md). A topic with
subscriptions gives each subscription its own copy of every message published after the
subscription was created, in the queue TOPIC#NAME; a topic without any keeps one copy, shared by
its competing consumers.

Create subscriptions before producers start, so that they see every message (a consumer's
Source also creates its own when it starts). Remove one nobody consumes any more: every publish
to its topic still adds a copy for it.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newQueueSubscriptionsCmd(e), newQueueSubscribeCmd(e), newQueueUnsubscribeCmd(e))
	return cmd
}

// subscriptionStore returns the store's queue table as one with subscriptions.
func subscriptionStore(s *connect.Stores) (idemstore.QueueSubscriptionStore, error) {
	subs, ok := s.Queue.(idemstore.QueueSubscriptionStore)
	if !ok {
		return nil, fmt.Errorf("store %s: its queue table has no subscriptions", s.URL)
	}
	return subs, nil
}

// subscriptionFlags are --topic and --name, both required.
type subscriptionFlags struct{ topic, name string }

func (f *subscriptionFlags) register(cmd *cobra.Command, withName bool) {
	cmd.Flags().StringVar(&f.topic, "topic", "", "the topic (queue) subscribed to (required)")
	if withName {
		cmd.Flags().StringVar(&f.name, "name", "", "the subscription's name, one per consuming service (required)")
	}
}

// check validates the flags as the store would, as a usage error.
func (f *subscriptionFlags) check(withName bool) error {
	f.topic, f.name = strings.TrimSpace(f.topic), strings.TrimSpace(f.name)
	if f.topic == "" {
		return usagef("--topic is required")
	}
	if !withName {
		return nil
	}
	if f.name == "" {
		return usagef("--name is required")
	}
	if _, err := idemstore.SubscriptionQueue(f.topic, f.name); err != nil {
		return usageError{err}
	}
	return nil
}

// subscriptionStatus is one subscription in idem queue subscriptions.
type subscriptionStatus struct {
	Name  string `json:"name"`
	Queue string `json:"queue"`
	backlogStatus
}

func newQueueSubscriptionsCmd(e *env) *cobra.Command {
	var (
		store   string
		f       subscriptionFlags
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:     "subscriptions --topic TOPIC",
		Short:   "List a topic's subscriptions with each one's backlog",
		Example: `  idem queue subscriptions --topic payment.captured --json`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(false); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := e.openStore(ctx, store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			subs, err := subscriptionStore(s)
			if err != nil {
				return err
			}
			names, err := subs.QueueSubscriptions(ctx, f.topic)
			if err != nil {
				return storeErr(s, "subscriptions of "+f.topic, err)
			}
			now := e.now()
			out := []subscriptionStatus{}
			for _, n := range names {
				q := f.topic + idemstore.SubscriptionSeparator + n
				qs, err := s.Queue.QueueStats(ctx, q)
				if err != nil {
					return storeErr(s, "stats of queue "+q, err)
				}
				out = append(out, subscriptionStatus{Name: n, Queue: q, backlogStatus: backlog("", qs, now)})
			}
			if jsonOut {
				return writeJSON(e.stdout, out)
			}
			if len(out) == 0 {
				fmt.Fprintf(e.stdout, "%s has no subscriptions: its consumers compete for one copy of each message\n", f.topic)
				return nil
			}
			for _, o := range out {
				fmt.Fprintf(e.stdout, "%s\t%s\t%s\n", o.Name, o.Queue, plural(int(o.Backlog), "job", "jobs"))
			}
			return nil
		},
	}
	storeFlag(cmd, &store)
	f.register(cmd, false)
	jsonFlag(cmd, &jsonOut)
	return cmd
}

func newQueueSubscribeCmd(e *env) *cobra.Command {
	var (
		store string
		f     subscriptionFlags
	)
	cmd := &cobra.Command{
		Use:   "subscribe --topic TOPIC --name NAME",
		Short: "Create a subscription (idempotent): from now on it gets a copy of every message of the topic",
		Long: `subscribe creates the subscription NAME of TOPIC, or does nothing if it exists. Messages
published from then on get a copy in the queue TOPIC#NAME; messages published before do not. The
first subscription of a topic ends its competing-consumer queue for new messages: drain that one
with its old consumers (see docs/queue.md).`,
		Example: `  idem queue subscribe --topic payment.captured --name ledger`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(true); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := e.openStore(ctx, store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			subs, err := subscriptionStore(s)
			if err != nil {
				return err
			}
			if err := subs.QueueSubscribe(ctx, f.topic, f.name); err != nil {
				return storeErr(s, "subscribe "+f.name+" to "+f.topic, err)
			}
			fmt.Fprintf(e.stdout, "subscribed %s to %s: its queue is %s%s%s\n", f.name, f.topic, f.topic, idemstore.SubscriptionSeparator, f.name)
			return nil
		},
	}
	storeFlag(cmd, &store)
	f.register(cmd, true)
	return cmd
}

func newQueueUnsubscribeCmd(e *env) *cobra.Command {
	var (
		store string
		f     subscriptionFlags
		yes   bool
	)
	cmd := &cobra.Command{
		Use:   "unsubscribe --topic TOPIC --name NAME --yes",
		Short: "Remove a subscription and delete the jobs it has left",
		Long: `unsubscribe removes the subscription NAME of TOPIC, so that publishes stop copying to it,
and deletes the jobs left in its queue (in batches). Those events are then never processed by that
subscription's consumer: without --yes it only says how many jobs it would delete.`,
		Example: `  idem queue unsubscribe --topic payment.captured --name old-mailer --yes`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(true); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := e.openStore(ctx, store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			subs, err := subscriptionStore(s)
			if err != nil {
				return err
			}
			if !yes {
				q := f.topic + idemstore.SubscriptionSeparator + f.name
				qs, err := s.Queue.QueueStats(ctx, q)
				if err != nil {
					return storeErr(s, "stats of queue "+q, err)
				}
				return exitError{code: ExitUsage, err: fmt.Errorf("unsubscribing %s from %s would delete %s of its queue %s; add --yes to do it",
					f.name, f.topic, plural(int(qs.Backlog), "job", "jobs"), q)}
			}
			n, err := subs.QueueUnsubscribe(ctx, f.topic, f.name)
			if err != nil {
				return storeErr(s, fmt.Sprintf("unsubscribe %s from %s (%d jobs deleted before the failure)", f.name, f.topic, n), err)
			}
			fmt.Fprintf(e.stdout, "unsubscribed %s from %s and deleted %s\n", f.name, f.topic, plural(n, "job", "jobs"))
			return nil
		},
	}
	storeFlag(cmd, &store)
	f.register(cmd, true)
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm: delete the subscription's jobs")
	return cmd
}
