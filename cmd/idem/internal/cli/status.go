package cli

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/cmd/idem/internal/inspect"
	"github.com/idemkit/idem/idemstore"
)

// consumerStatus is one consumer in idem status.
type consumerStatus struct {
	Consumer string `json:"consumer"`
	// Processed counts the consumer's claims: events processed within the claim retention
	// (gc deletes older claims).
	Processed       int64      `json:"processed"`
	LastProcessedAt *time.Time `json:"last_processed_at"`
	// Ignored counts the events its handler ignored (idem.Ignore), from the audit trail.
	Ignored int64 `json:"ignored"`
	// DeadLettersPending and the oldest one's first failure.
	DeadLettersPending   int64      `json:"dead_letters_pending"`
	OldestDeadLetterAt   *time.Time `json:"oldest_dead_letter_at"`
	OldestDeadLetterAgeS float64    `json:"oldest_dead_letter_age_seconds"`
	oldestDeadLetter     time.Time
	lastProcessed        time.Time
}

type backlogStatus struct {
	Queue      string     `json:"queue,omitempty"`
	Backlog    int64      `json:"backlog"`
	OldestAt   *time.Time `json:"oldest_at"`
	OldestAgeS float64    `json:"oldest_age_seconds"`
	oldest     time.Time
}

type deadLetterStatus struct {
	Pending    int64            `json:"pending"`
	OldestAt   *time.Time       `json:"oldest_at"`
	OldestAgeS float64          `json:"oldest_age_seconds"`
	ByReason   map[string]int64 `json:"by_reason"`
}

type statusReport struct {
	Store       string           `json:"store"`
	At          time.Time        `json:"at"`
	Consumers   []consumerStatus `json:"consumers"`
	DeadLetters deadLetterStatus `json:"dead_letters"`
	Queues      []backlogStatus  `json:"queues"`
	Outbox      backlogStatus    `json:"outbox"`
}

func newStatusCmd(e *env) *cobra.Command {
	var (
		store   string
		queues  []string
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show processed events, dead letters and backlogs per consumer and queue",
		Long: `status reports, per consumer, the events it processed within the claim retention (its
claims) and its pending dead letters with the oldest one's age; per queue-table queue, the backlog
and the oldest job's age; and the outbox backlog and the oldest row's age.

status reports the queues named by --queue, or by default the queue-table queues that hold jobs
and those pending dead letters came from. A queue that is a topic with subscriptions is followed
by each subscription's own queue (TOPIC#NAME).

CLAIMS counts the consumer's claims: the events it processed within its claim retention (gc
deletes older claims, so it is not a lifetime total). IGNORED counts the events its handler
ignored (idem.Ignore), from the audit trail.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			s, err := e.openStore(ctx, store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			rep, err := buildStatus(ctx, s, queues, e.now())
			if err != nil {
				return err
			}
			if jsonOut {
				return writeJSON(e.stdout, rep)
			}
			return writeStatus(e, rep)
		},
	}
	storeFlag(cmd, &store)
	cmd.Flags().StringSliceVar(&queues, "queue", nil, "queue-table queues to report (repeatable; default: the queues that hold jobs or pending dead letters came from)")
	jsonFlag(cmd, &jsonOut)
	return cmd
}

func buildStatus(ctx context.Context, s *connect.Stores, queues []string, now time.Time) (statusReport, error) {
	rep := statusReport{Store: s.URL.String(), At: now.UTC()}
	byConsumer := map[string]*consumerStatus{}
	get := func(name string) *consumerStatus {
		c := byConsumer[name]
		if c == nil {
			c = &consumerStatus{Consumer: name}
			byConsumer[name] = c
		}
		return c
	}

	claims, err := inspect.ClaimCounts(ctx, s)
	if err != nil {
		return rep, storeErr(s, "count claims", err)
	}
	for _, cc := range claims {
		c := get(cc.Consumer)
		c.Processed, c.lastProcessed = cc.Count, cc.Last
	}

	ignored, err := inspect.IgnoredCounts(ctx, s)
	if err != nil {
		return rep, storeErr(s, "count ignored events", err)
	}
	for name, n := range ignored {
		get(name).Ignored = n
	}

	stats, err := s.DeadLetters.DeadLetterStats(ctx)
	if err != nil {
		return rep, storeErr(s, "dead-letter stats", err)
	}
	rep.DeadLetters = deadLetterStatus{
		Pending:    stats.Pending,
		OldestAt:   jsonTime(stats.OldestPending),
		OldestAgeS: ageSeconds(stats.OldestPending, now),
		ByReason:   map[string]int64{},
	}
	for r, n := range stats.ByReason {
		rep.DeadLetters.ByReason[string(r)] = n
	}
	// The stores count pending dead letters only in total; per consumer they are read.
	pending, err := s.DeadLetters.ListDeadLetters(ctx, idemstore.DeadLetterFilter{Status: idem.DeadLetterPending, Limit: countLimit})
	if err != nil {
		return rep, storeErr(s, "list pending dead letters", err)
	}
	seenQueues := map[string]bool{}
	if len(queues) == 0 {
		names, err := queueNames(ctx, s)
		if err != nil {
			return rep, storeErr(s, "list queues", err)
		}
		for _, q := range names {
			seenQueues[q] = true
		}
	}
	for _, dl := range pending {
		c := get(dl.Consumer)
		c.DeadLettersPending++
		if c.oldestDeadLetter.IsZero() || dl.FirstFailed.Before(c.oldestDeadLetter) {
			c.oldestDeadLetter = dl.FirstFailed
		}
		if q, ok := strings.CutPrefix(dl.Source, "queue:"); ok && q != "" {
			seenQueues[q] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byConsumer)) {
		c := byConsumer[name]
		c.LastProcessedAt = jsonTime(c.lastProcessed)
		c.OldestDeadLetterAt = jsonTime(c.oldestDeadLetter)
		c.OldestDeadLetterAgeS = ageSeconds(c.oldestDeadLetter, now)
		rep.Consumers = append(rep.Consumers, *c)
	}
	if rep.Consumers == nil {
		rep.Consumers = []consumerStatus{}
	}

	if len(queues) == 0 {
		queues = slices.Sorted(maps.Keys(seenQueues))
	}
	rep.Queues = []backlogStatus{}
	reported := map[string]bool{}
	report := func(q string) error {
		if reported[q] {
			return nil
		}
		reported[q] = true
		qs, err := s.Queue.QueueStats(ctx, q)
		if err != nil {
			return storeErr(s, "stats of queue "+q, err)
		}
		rep.Queues = append(rep.Queues, backlog(q, qs, now))
		return nil
	}
	subs, _ := s.Queue.(idemstore.QueueSubscriptionStore)
	for _, q := range queues {
		if err := report(q); err != nil {
			return rep, err
		}
		// A topic with subscriptions: each subscription's queue follows it.
		if subs == nil || strings.Contains(q, idemstore.SubscriptionSeparator) {
			continue
		}
		names, err := subs.QueueSubscriptions(ctx, q)
		if err != nil {
			return rep, storeErr(s, "subscriptions of queue "+q, err)
		}
		for _, name := range names {
			if err := report(q + idemstore.SubscriptionSeparator + name); err != nil {
				return rep, err
			}
		}
	}

	ob, err := s.Outbox.OutboxStats(ctx)
	if err != nil {
		return rep, storeErr(s, "outbox stats", err)
	}
	rep.Outbox = backlog("", ob, now)
	return rep, nil
}

func backlog(queue string, qs idemstore.QueueStats, now time.Time) backlogStatus {
	return backlogStatus{Queue: queue, Backlog: qs.Backlog, OldestAt: jsonTime(qs.Oldest),
		OldestAgeS: ageSeconds(qs.Oldest, now), oldest: qs.Oldest}
}

// queueNames lists the queue-table queues that hold jobs (acked jobs are deleted), so status
// reports the queues that exist rather than a guess.
func queueNames(ctx context.Context, s *connect.Stores) ([]string, error) {
	var out []string
	err := queryStore(ctx, s, "queue", func(table, _ string) string {
		return `SELECT DISTINCT queue FROM ` + table
	}, nil, func(scan func(...any) error) error {
		var q string
		if err := scan(&q); err != nil {
			return err
		}
		out = append(out, q)
		return nil
	})
	return out, err
}

// queryStore runs one read-only query on the concrete store's table (the store's prefix +
// table, in its schema on PostgreSQL; quoted), built by query from the quoted table name and
// the first placeholder, and calls row for each row.
func queryStore(ctx context.Context, s *connect.Stores, table string, query func(table, ph string) string, args []any, row func(scan func(...any) error) error) error {
	var rows interface {
		Next() bool
		Scan(...any) error
		Err() error
	}
	switch {
	case s.SQLite != nil:
		r, err := s.SQLite.DB().QueryContext(ctx, query(`"`+s.SQLite.Config().Prefix+table+`"`, "?"), args...)
		if err != nil {
			return err
		}
		defer r.Close()
		rows = r
	case s.MySQL != nil:
		r, err := s.MySQL.DB().QueryContext(ctx, query("`"+s.MySQL.Config().Prefix+table+"`", "?"), args...)
		if err != nil {
			return err
		}
		defer r.Close()
		rows = r
	case s.Postgres != nil:
		cfg := s.Postgres.Config()
		r, err := s.Postgres.Pool().Query(ctx, query(pgx.Identifier{cfg.Schema, cfg.Prefix + table}.Sanitize(), "$1"), args...)
		if err != nil {
			return err
		}
		defer r.Close()
		rows = r
	default:
		return fmt.Errorf("store %s: no SQL database to read %s from", s.URL, table)
	}
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

func writeStatus(e *env, rep statusReport) error {
	now := rep.At
	w := e.stdout
	fmt.Fprintf(w, "store %s at %s\n\n", rep.Store, timeText(now))

	if len(rep.Consumers) == 0 {
		fmt.Fprintln(w, "no consumer has processed anything or dead-lettered anything yet")
	} else {
		t := newTable(w, "CONSUMER", "CLAIMS", "LAST PROCESSED", "IGNORED", "DLQ PENDING", "OLDEST DEAD LETTER")
		for _, c := range rep.Consumers {
			t.row(c.Consumer, strconv.FormatInt(c.Processed, 10), timeAgo(c.lastProcessed, now), strconv.FormatInt(c.Ignored, 10),
				strconv.FormatInt(c.DeadLettersPending, 10), timeAgo(c.oldestDeadLetter, now))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)

	t := newTable(w, "QUEUE", "BACKLOG", "OLDEST")
	for _, q := range rep.Queues {
		t.row(q.Queue, strconv.FormatInt(q.Backlog, 10), timeAgo(q.oldest, now))
	}
	t.row("(outbox)", strconv.FormatInt(rep.Outbox.Backlog, 10), timeAgo(rep.Outbox.oldest, now))
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)

	dl := rep.DeadLetters
	if dl.Pending == 0 {
		_, err := fmt.Fprintln(w, "dead letters: none pending")
		return err
	}
	reasons := slices.SortedFunc(maps.Keys(dl.ByReason), func(a, b string) int {
		return cmp.Or(cmp.Compare(dl.ByReason[b], dl.ByReason[a]), cmp.Compare(a, b))
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%s %d", r, dl.ByReason[r])
	}
	var oldest time.Time
	if dl.OldestAt != nil {
		oldest = *dl.OldestAt
	}
	_, err := fmt.Fprintf(w, "dead letters: %d pending (%s), oldest failed %s\n", dl.Pending, strings.Join(parts, ", "), timeAgo(oldest, now))
	return err
}
