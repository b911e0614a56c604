package cli

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemauth"
	"github.com/idemkit/idem/idemdlq"
)

// selectFlags pick the dead letters replay and discard touch.
type selectFlags struct {
	ids     []int64
	filter  dlFilterFlags
	limit   int
	all     bool
	yes     bool
	actor   string
	jsonOut bool
}

func (s *selectFlags) add(cmd *cobra.Command, verb, reasonFlag string) {
	fl := cmd.Flags()
	fl.Var(idsValue{&s.ids}, "id", "the dead letter to "+verb+" (repeatable, or comma-separated)")
	s.filter.add(cmd, reasonFlag, false)
	fl.IntVar(&s.limit, "limit", idemdlq.ReplayLimitDefault, "touch at most this many pending dead letters, oldest first")
	fl.BoolVar(&s.all, "all", false, "lift --limit: every matching pending dead letter (needs --yes)")
	fl.BoolVar(&s.yes, "yes", false, "confirm --all")
	actorFlag(cmd, &s.actor)
	jsonFlag(cmd, &s.jsonOut)
}

// selection validates the flags and builds the Replayer selection.
func (s *selectFlags) selection(e *env) (idemdlq.Selection, error) {
	var sel idemdlq.Selection
	if err := checkLimit(s.limit); err != nil {
		return sel, err
	}
	filter, err := s.filter.filter(e.now())
	if err != nil {
		return sel, err
	}
	switch {
	case len(s.ids) > 0 && (s.filter.any() || s.all):
		return sel, usagef("--id selects dead letters by id: do not combine it with filters or --all")
	case len(s.ids) == 0 && !s.filter.any() && !s.all:
		return sel, usagef("say which dead letters: --id N, a filter (--consumer, --owner, --%s, --tenant, --older-than), or --all", s.filter.reasonFlag)
	}
	ids := slices.Clone(s.ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) > s.limit {
		return sel, usagef("%d ids given but --limit is %d: raise --limit to touch them all", len(ids), s.limit)
	}
	actor, err := e.resolveActor(s.actor)
	if err != nil {
		return sel, err
	}
	return idemdlq.Selection{IDs: ids, Filter: filter, Limit: s.limit, All: s.all, Actor: actor}, nil
}

// confirmAll refuses --all without --yes, saying how many dead letters it would touch.
func (s *selectFlags) confirmAll(ctx context.Context, st *connect.Stores, sel idemdlq.Selection, verb string) error {
	if !s.all || s.yes {
		return nil
	}
	f := sel.Filter
	f.Status, f.Limit = idem.DeadLetterPending, countLimit
	dls, err := st.DeadLetters.ListDeadLetters(ctx, f)
	if err != nil {
		return storeErr(st, "count dead letters", err)
	}
	return exitError{code: ExitUsage, err: fmt.Errorf("--all would %s %s%s; add --yes to do it",
		verb, plural(len(dls), "pending dead letter", "pending dead letters"), s.filter.describe())}
}

// checkIDs reports the first of ids that does not exist, in the words of dlq show.
func checkIDs(ctx context.Context, st *connect.Stores, ids []int64) error {
	for _, id := range ids {
		_, err := st.DeadLetters.GetDeadLetter(ctx, id)
		if errors.Is(err, idem.ErrNotFound) {
			return fmt.Errorf("dead letter %d does not exist in store %s (see idem dlq list)", id, st.URL)
		}
		if err != nil {
			return storeErr(st, fmt.Sprintf("read dead letter %d", id), err)
		}
	}
	return nil
}

// selectErr rewrites the Replayer's errors for an unknown id into one clear sentence.
func selectErr(st *connect.Stores, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, idem.ErrNotFound) {
		return fmt.Errorf("%w (store %s; see idem dlq list)", err, st.URL)
	}
	return err
}

// replayJSON and discardJSON are the --json outputs of replay and discard.
type replayJSON struct {
	Replayed  []int64 `json:"replayed"`
	Remaining int     `json:"remaining"`
}

type discardJSON struct {
	Discarded []int64 `json:"discarded"`
	Remaining int     `json:"remaining"`
}

// reportRemaining tells the operator that the limit left dead letters untouched.
func reportRemaining(e *env, remaining int) {
	switch {
	case remaining == 1:
		fmt.Fprintln(e.stdout, "1 more pending dead letter matches: run the same command again for it, or add --all --yes next time")
	case remaining > 1:
		fmt.Fprintf(e.stdout, "%d more pending dead letters match: run the same command again for the next batch, or add --all --yes for all of them\n", remaining)
	}
}

func newDLQReplayCmd(e *env) *cobra.Command {
	var (
		store, broker, topic, note, keyFile string
		asNew                               bool
		sf                                  selectFlags
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Republish dead letters with their original identity and mark them replayed",
		Long: `replay republishes pending dead letters — same event id, tenant, type, payload and headers,
plus Idem-Replay-Of (the dead letter's id) and Idem-Replayed-By (--actor) — and marks them replayed,
with an audit row each. The consumer that processes the replay records the recovery time.

A dead letter whose payload no longer matches the fingerprint stored with it (edited in the
database) is refused; --as-new-event sends it instead under the new event id
"<event id>~edit-<dead letter id>", and the audit row names the original.

With --replay-key-file (or $IDEM_REPLAY_KEY), each replay is signed with that operator key
("<key id>:<hex secret>", at least 32 bytes), so that a consumer whose idemauth verifier lists it
in ReplayKeys accepts a signed dead letter older than its tolerance.

Select by --id, or by filter (--consumer, --reason, --tenant, --older-than). At most --limit
(default 10) are replayed per run, oldest first: replay a small batch, watch it, then go on. More
than the limit takes --all --yes; --all alone only says how many it would touch.

--broker sql republishes into the queue table the dead letter came from (its source queue:NAME),
or into --topic. --broker nats://HOST:PORT publishes to JetStream subject --topic, by default the
subject the message arrived on (recorded with dead letters from NATS);
--broker amqp://… publishes to RabbitMQ queue --topic (required) through the default exchange;
--broker redis://… adds to the Redis stream idem:<--topic> (--topic required).`,
		Example: `  idem dlq replay --id 42
  idem dlq replay --consumer ledger@v1 --reason retries_exhausted --limit 5
  idem dlq replay --reason permanent_error --all --yes
  idem dlq replay --id 42 --broker nats://127.0.0.1:4222 --topic payments.captured`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			sel, err := sf.selection(e)
			if err != nil {
				return err
			}
			sel.Reason = note
			bu, err := checkReplayTarget(broker, topic)
			if err != nil {
				return err
			}
			st, err := e.openStore(ctx, store, true)
			if err != nil {
				return err
			}
			defer st.Close()
			if err := sf.confirmAll(ctx, st, sel, "replay"); err != nil {
				return err
			}
			if err := checkIDs(ctx, st, sel.IDs); err != nil {
				return err
			}
			rp, b, err := e.openReplayer(ctx, st, broker, keyFile, "idem dlq replay", false)
			if err != nil {
				return err
			}
			defer b.Close()
			res, rerr := rp.Replay(ctx, idemdlq.ReplayParams{Selection: sel, Topic: strings.TrimSpace(topic), AsNewEvent: asNew,
				ArrivalTopic: bu.Kind == connect.BrokerNATS})
			if sf.jsonOut {
				// Also after an error: the dead letters replayed before it are marked.
				if err := writeJSON(e.stdout, replayJSON{Replayed: nonNil(res.Replayed), Remaining: res.Remaining}); err != nil {
					return err
				}
				return selectErr(st, rerr)
			}
			if len(res.Replayed) > 0 {
				dest := "to the queues they came from"
				if bu.Kind == connect.BrokerNATS {
					dest = "to the subjects they arrived on"
				}
				if topic != "" {
					dest = "to " + topic
				}
				fmt.Fprintf(e.stdout, "replayed %s %s via %s: %s\n",
					plural(len(res.Replayed), "dead letter", "dead letters"), dest, b.URL, idList(res.Replayed))
			} else if rerr == nil {
				fmt.Fprintf(e.stdout, "no pending dead letters%s to replay\n", sf.filter.describe())
			}
			if rerr != nil {
				return selectErr(st, rerr)
			}
			reportRemaining(e, res.Remaining)
			return nil
		},
	}
	storeFlag(cmd, &store)
	brokerFlag(cmd, &broker)
	cmd.Flags().StringVar(&topic, "topic", "", "where to republish: a queue name (sql) or JetStream subject (nats); default: the dead letter's source queue")
	cmd.Flags().StringVar(&note, "note", "", "why, recorded in the audit trail")
	cmd.Flags().StringVar(&keyFile, "replay-key-file", "", "sign replays with the operator replay key in this file (\"<key id>:<hex secret>\"; default $IDEM_REPLAY_KEY)")
	cmd.Flags().BoolVar(&asNew, "as-new-event", false, "send a dead letter whose payload was edited as a new event (otherwise it is refused)")
	sf.add(cmd, "replay", "reason")
	return cmd
}

func newDLQDiscardCmd(e *env) *cobra.Command {
	var (
		store, note string
		sf          selectFlags
	)
	cmd := &cobra.Command{
		Use:   "discard",
		Short: "Retire dead letters for good, saying why",
		Long: `discard marks pending dead letters discarded, with --note (required: why) recorded in one
audit row per dead letter. Nothing is published. Select as for list and replay: --id, or filters
(--consumer, --reason, --tenant, --older-than); at most --limit (default 10) per run unless
--all --yes.`,
		Example: `  idem dlq discard --id 42 --note "test event from staging"
  idem dlq discard --reason key_reuse --consumer ledger@v1 --note "producer bug #123, fixed"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if r := strings.TrimSpace(sf.filter.reason); r != "" && !idem.Reason(r).Valid() {
				// --reason used to be the explanation here: say so rather than only refuse.
				return usagef("--reason %q is not a dead-letter reason (want one of %s): as in list and replay, --reason selects dead letters; say why they are discarded with --note",
					sf.filter.reason, reasonList())
			}
			if strings.TrimSpace(note) == "" {
				return usagef("--note is required: say why these dead letters are discarded (it goes into the audit trail)")
			}
			sel, err := sf.selection(e)
			if err != nil {
				return err
			}
			sel.Reason = strings.TrimSpace(note)
			st, err := e.openStore(ctx, store, true)
			if err != nil {
				return err
			}
			defer st.Close()
			if err := sf.confirmAll(ctx, st, sel, "discard"); err != nil {
				return err
			}
			if err := checkIDs(ctx, st, sel.IDs); err != nil {
				return err
			}
			res, err := idemdlq.NewReplayer(st.DeadLetters, nil, idemdlq.ReplayerConfig{}).Discard(ctx, sel)
			if err != nil {
				return selectErr(st, err)
			}
			ids, remaining := res.Discarded, res.Remaining
			if sf.jsonOut {
				return writeJSON(e.stdout, discardJSON{Discarded: nonNil(ids), Remaining: remaining})
			}
			if len(ids) == 0 {
				fmt.Fprintf(e.stdout, "no pending dead letters%s to discard\n", sf.filter.describe())
			} else {
				fmt.Fprintf(e.stdout, "discarded %s: %s\n", plural(len(ids), "dead letter", "dead letters"), idList(ids))
			}
			reportRemaining(e, remaining)
			return nil
		},
	}
	storeFlag(cmd, &store)
	cmd.Flags().StringVar(&note, "note", "", "why they are discarded, recorded in the audit trail (required)")
	sf.add(cmd, "discard", "reason")
	cmd.Flags().StringVar(&sf.filter.reason, "with-reason", "", "old name of --reason")
	_ = cmd.Flags().MarkDeprecated("with-reason", "use --reason")
	return cmd
}

// checkReplayTarget refuses a --broker that names no place to republish to without --topic
// (the dead letter's source queue is only known for the queue table).
func checkReplayTarget(broker, topic string) (connect.BrokerURL, error) {
	bu, err := connect.ParseBroker(broker)
	if err != nil {
		return bu, usageError{fmt.Errorf("--broker: %w", err)}
	}
	if (bu.Kind == connect.BrokerAMQP || bu.Kind == connect.BrokerRedis || bu.Kind == connect.BrokerSQS) && strings.TrimSpace(topic) == "" {
		return bu, usagef("--topic is required with --broker %s: name the queue or stream to republish to", bu)
	}
	return bu, nil
}

// openReplayer opens the broker replays go through and returns a Replayer over st that
// republishes there, signed with the operator replay key when one is configured (see
// replaySigner). dlq replay and serve share it; the caller closes the broker.
func (e *env) openReplayer(ctx context.Context, st *connect.Stores, broker, keyFile, name string, reconnect bool) (*idemdlq.Replayer, *connect.Broker, error) {
	signer, err := e.replaySigner(keyFile)
	if err != nil {
		return nil, nil, err
	}
	b, err := connect.OpenBroker(ctx, broker, st, connect.BrokerOptions{Name: name, Reconnect: reconnect})
	if err != nil {
		return nil, nil, err
	}
	return idemdlq.NewReplayer(st.DeadLetters, b.Sink, idemdlq.ReplayerConfig{Signer: signer}), b, nil
}

// nonNil makes an empty id list encode as [] rather than be omitted.
func nonNil(ids []int64) []int64 {
	if ids == nil {
		return []int64{}
	}
	return ids
}

// replaySigner reads the operator replay key from file (or $IDEM_REPLAY_KEY): "<key id>:<hex
// secret>". No key means replays go out unsigned. The secret never appears in an error.
func (e *env) replaySigner(file string) (idemdlq.ReplaySigner, error) {
	raw, from := e.getenv("IDEM_REPLAY_KEY"), "$IDEM_REPLAY_KEY"
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, usageError{fmt.Errorf("--replay-key-file: %w", err)}
		}
		raw, from = string(b), "--replay-key-file "+file
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return nil, nil
	}
	id, hexSecret, ok := strings.Cut(raw, ":")
	secret, err := hex.DecodeString(strings.TrimSpace(hexSecret))
	if !ok || err != nil {
		return nil, usagef("%s: want \"<key id>:<hex secret>\"", from)
	}
	s, err := idemauth.NewReplaySigner(idemauth.ReplayKey{ID: strings.TrimSpace(id), Secret: secret}, e.now)
	if err != nil {
		return nil, usageError{fmt.Errorf("%s: %w", from, err)}
	}
	return s, nil
}
