package cli

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemstore"
)

// Defaults of the dlq commands.
const (
	// listLimitDefault bounds dlq list unless --limit says otherwise.
	listLimitDefault = 100
	// auditLimitDefault bounds dlq audit unless --limit says otherwise.
	auditLimitDefault = 50
	// errorColumnWidth bounds the error summary in the dlq list table.
	errorColumnWidth = 60
	// countLimit bounds the dead letters read to count a selection (--all without --yes, status).
	countLimit = 1 << 30
)

func newDLQCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "dlq",
		Aliases: []string{"deadletters"},
		Short:   "Inspect, replay and discard dead letters",
		Long: `dlq operates the dead-letter queue: deliveries idem will not retry (permanent errors,
spent retry budgets, key reuse, handler panics, events past the retention horizon), each with its
original message, reason, redacted error and attempt count.

Replay republishes the original message (same event id, tenant, payload and headers, plus
Idem-Replay-Of and Idem-Replayed-By) and marks the dead letter replayed; when a consumer processes
it, the dead letter records its recovery time. Discard retires dead letters with a reason. Both
touch at most --limit (default 10) pending dead letters per run, oldest first, and write one audit
row per dead letter (see dlq audit).`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.AddCommand(newDLQListCmd(e), newDLQShowCmd(e), newDLQReplayCmd(e), newDLQDiscardCmd(e), newDLQAuditCmd(e))
	return cmd
}

// dlFilterFlags are the dead-letter filters shared by list, replay and discard.
type dlFilterFlags struct {
	consumer, tenant, reason, status string
	owner                            string
	olderThan                        time.Duration
	// reasonFlag is the name of the dead-letter reason filter ("reason" for every command).
	reasonFlag string
}

func (f *dlFilterFlags) add(cmd *cobra.Command, reasonFlag string, withStatus bool) {
	f.reasonFlag = reasonFlag
	fl := cmd.Flags()
	fl.StringVar(&f.consumer, "consumer", "", "only dead letters of this consumer, with its effect version (ledger@v1)")
	fl.StringVar(&f.tenant, "tenant", "", "only dead letters of this tenant")
	fl.StringVar(&f.owner, "owner", "", "only dead letters of consumers with this owner (ConsumerConfig.Owner)")
	fl.StringVar(&f.reason, reasonFlag, "", "only dead letters with this reason: "+reasonList())
	if withStatus {
		fl.StringVar(&f.status, "status", "", "only dead letters with this status: pending, replayed or discarded")
	}
	fl.Var(newDuration(&f.olderThan, 0), "older-than", "only dead letters whose last failure is older than this (30m, 12h, 7d)")
}

// any reports whether a filter is set.
func (f *dlFilterFlags) any() bool {
	return f.consumer != "" || f.tenant != "" || f.owner != "" || f.reason != "" || f.status != "" || f.olderThan != 0
}

// filter validates the flags and returns the store filter.
func (f *dlFilterFlags) filter(now time.Time) (idemstore.DeadLetterFilter, error) {
	var out idemstore.DeadLetterFilter
	out.Consumer = strings.TrimSpace(f.consumer)
	out.Tenant = f.tenant
	if f.owner != "" {
		if err := idem.ValidateOwner(strings.TrimSpace(f.owner)); err != nil {
			return out, usagef("--owner %q is not an owner (want lower-case letters, digits, '-' and '_', starting with a letter)", f.owner)
		}
		out.Owner = strings.TrimSpace(f.owner)
	}
	if f.reason != "" {
		r := idem.Reason(strings.TrimSpace(f.reason))
		if !r.Valid() {
			return out, usagef("--%s %q is not a dead-letter reason (want one of %s)", f.reasonFlag, f.reason, reasonList())
		}
		out.Reason = r
	}
	if f.status != "" {
		s := idem.DeadLetterStatus(strings.TrimSpace(f.status))
		if !s.Valid() {
			return out, usagef("--status %q is not a dead-letter status (want pending, replayed or discarded)", f.status)
		}
		out.Status = s
	}
	if f.olderThan < 0 {
		return out, usagef("--older-than is %s, want a positive duration", f.olderThan)
	}
	if f.olderThan > 0 {
		out.OlderThan = now.Add(-f.olderThan)
	}
	return out, nil
}

// describe says in words what the filter selects, for messages.
func (f *dlFilterFlags) describe() string {
	var parts []string
	if f.consumer != "" {
		parts = append(parts, "consumer "+f.consumer)
	}
	if f.tenant != "" {
		parts = append(parts, "tenant "+f.tenant)
	}
	if f.owner != "" {
		parts = append(parts, "owner "+f.owner)
	}
	if f.reason != "" {
		parts = append(parts, "reason "+f.reason)
	}
	if f.olderThan > 0 {
		parts = append(parts, "older than "+formatDuration(f.olderThan))
	}
	if len(parts) == 0 {
		return ""
	}
	return " with " + strings.Join(parts, ", ")
}

// reasonList is the valid reasons, comma-separated.
func reasonList() string {
	rs := idem.Reasons()
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// limitFlag validates a --limit value.
func checkLimit(n int) error {
	if n < 1 {
		return usagef("--limit is %d, want at least 1", n)
	}
	return nil
}

// deadLetterJSON is a dead letter in dlq list --json.
type deadLetterJSON struct {
	ID            int64                 `json:"id"`
	EventID       string                `json:"event_id"`
	Tenant        string                `json:"tenant"`
	Consumer      string                `json:"consumer"`
	Owner         string                `json:"owner"`
	Type          string                `json:"type"`
	Reason        idem.Reason           `json:"reason"`
	Error         string                `json:"error"`
	Attempts      int                   `json:"attempts"`
	Status        idem.DeadLetterStatus `json:"status"`
	Source        string                `json:"source"`
	FirstFailedAt time.Time             `json:"first_failed_at"`
	LastFailedAt  time.Time             `json:"last_failed_at"`
	RecoveredAt   *time.Time            `json:"recovered_at"`
}

// deadLetterDetailJSON is a dead letter in dlq show --json: everything, secrets masked.
type deadLetterDetailJSON struct {
	deadLetterJSON
	ConsumerVersion string            `json:"consumer_version"`
	Fingerprint     string            `json:"fingerprint"`
	PublishedAt     *time.Time        `json:"published_at"`
	OccurredAt      *time.Time        `json:"occurred_at"`
	Headers         map[string]string `json:"headers"`
	// Payload is the payload as JSON when it is JSON, else as a string, secrets masked.
	Payload json.RawMessage `json:"payload"`
}

func toJSON(dl idem.DeadLetter, r *idemredact.Redactor) deadLetterJSON {
	return deadLetterJSON{
		ID:            dl.ID,
		EventID:       dl.Message.EventID,
		Tenant:        dl.Message.Tenant,
		Consumer:      dl.Consumer,
		Owner:         dl.Owner,
		Type:          dl.Message.Type,
		Reason:        dl.Reason,
		Error:         r.Text(dl.Error),
		Attempts:      dl.Attempts,
		Status:        dl.Status,
		Source:        dl.Source,
		FirstFailedAt: dl.FirstFailed.UTC(),
		LastFailedAt:  dl.LastFailed.UTC(),
		RecoveredAt:   jsonTime(dl.RecoveredAt),
	}
}

func toDetailJSON(dl idem.DeadLetter, r *idemredact.Redactor) deadLetterDetailJSON {
	headers := r.Headers(dl.Message.Headers)
	if headers == nil {
		headers = map[string]string{}
	}
	var payload json.RawMessage
	masked, pretty := r.Render(dl.Message.Payload)
	if pretty && len(masked) > 0 && json.Valid(masked) {
		payload = masked
	} else {
		payload, _ = json.Marshal(string(masked)) // invalid UTF-8 becomes U+FFFD
	}
	return deadLetterDetailJSON{
		deadLetterJSON:  toJSON(dl, r),
		ConsumerVersion: dl.ConsumerVersion(),
		Fingerprint:     dl.Fingerprint.String(),
		PublishedAt:     jsonTime(dl.Message.PublishedAt),
		OccurredAt:      jsonTime(dl.Message.OccurredAt),
		Headers:         headers,
		Payload:         payload,
	}
}

func newDLQListCmd(e *env) *cobra.Command {
	var (
		store    string
		f        dlFilterFlags
		limit    int
		jsonOut  bool
		redactor = idemredact.New(idemredact.Config{})
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Example: `  idem dlq list
  idem dlq list --consumer ledger@v1 --reason permanent_error --status pending
  idem dlq list --older-than 2h --limit 20 --json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := e.now()
			filter, err := f.filter(now)
			if err != nil {
				return err
			}
			if err := checkLimit(limit); err != nil {
				return err
			}
			filter.Limit = limit
			s, err := e.openStore(cmd.Context(), store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			dls, err := s.DeadLetters.ListDeadLetters(cmd.Context(), filter)
			if err != nil {
				return storeErr(s, "list dead letters", err)
			}
			if jsonOut {
				out := make([]deadLetterJSON, 0, len(dls))
				for _, dl := range dls {
					out = append(out, toJSON(dl, redactor))
				}
				return writeJSON(e.stdout, out)
			}
			if len(dls) == 0 {
				_, err := fmt.Fprintln(e.stdout, "no dead letters match")
				return err
			}
			t := newTable(e.stdout, "ID", "CONSUMER", "OWNER", "TENANT", "EVENT ID", "REASON", "ATTEMPTS", "STATUS", "FIRST FAILED", "LAST FAILED", "ERROR")
			for _, dl := range dls {
				t.row(strconv.FormatInt(dl.ID, 10), dl.Consumer, cmp.Or(dl.Owner, "-"), dl.Message.Tenant, dl.Message.EventID, string(dl.Reason),
					strconv.Itoa(dl.Attempts), string(dl.Status), timeText(dl.FirstFailed), timeAgo(dl.LastFailed, now),
					truncate(redactor.Text(dl.Error), errorColumnWidth))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if len(dls) == limit {
				fmt.Fprintf(e.stderr, "idem: showing the oldest %d; more may match (raise --limit)\n", limit)
			}
			return nil
		},
	}
	storeFlag(cmd, &store)
	f.add(cmd, "reason", true)
	cmd.Flags().IntVar(&limit, "limit", listLimitDefault, "list at most this many")
	jsonFlag(cmd, &jsonOut)
	return cmd
}

func newDLQShowCmd(e *env) *cobra.Command {
	var (
		store    string
		jsonOut  bool
		idFlag   string
		redactor = idemredact.New(idemredact.Config{})
	)
	cmd := &cobra.Command{
		Use:   "show --id ID",
		Short: "Show one dead letter: message, headers and payload (secrets masked)",
		Long: `show prints one dead letter: its message, headers and payload (secrets masked, control
characters escaped, large payloads cut), reason, error, attempts and audit fields. Name it with
--id, as replay and discard do; "show ID" works too.`,
		Example: `  idem dlq show --id 42
  idem dlq show --id 42 --json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw string
			switch {
			case idFlag != "" && len(args) == 1:
				return usagef("%s takes the id once: --id %s or %s, not both", cmd.CommandPath(), idFlag, args[0])
			case idFlag != "":
				raw = idFlag
			case len(args) == 1:
				raw = args[0]
			default:
				return usagef("%s needs --id ID (one dead-letter id)", cmd.CommandPath())
			}
			id, err := parseID(raw)
			if err != nil {
				return err
			}
			s, err := e.openStore(cmd.Context(), store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			dl, err := s.DeadLetters.GetDeadLetter(cmd.Context(), id)
			if errors.Is(err, idem.ErrNotFound) {
				return fmt.Errorf("dead letter %d does not exist in store %s (see idem dlq list)", id, s.URL)
			}
			if err != nil {
				return storeErr(s, fmt.Sprintf("show dead letter %d", id), err)
			}
			if jsonOut {
				return writeJSON(e.stdout, toDetailJSON(dl, redactor))
			}
			return writeDeadLetter(e, dl, redactor)
		},
	}
	storeFlag(cmd, &store)
	jsonFlag(cmd, &jsonOut)
	cmd.Flags().StringVar(&idFlag, "id", "", "the dead letter to show")
	return cmd
}

// payloadShowMax bounds the payload dlq show prints, indentation and escapes included: a hostile
// payload costs no more screen or memory than a large real one.
const payloadShowMax = 64 << 10

// writeDeadLetter prints every field of dl for a person, secrets masked, control characters
// escaped, the payload bounded.
func writeDeadLetter(e *env, dl idem.DeadLetter, r *idemredact.Redactor) error {
	now := e.now()
	t := newTable(e.stdout)
	t.row("ID:", strconv.FormatInt(dl.ID, 10))
	t.row("Event ID:", dl.Message.EventID)
	t.row("Tenant:", dl.Message.Tenant)
	t.row("Consumer:", dl.Consumer)
	t.row("Owner:", cmp.Or(dl.Owner, "-"))
	t.row("Type:", dl.Message.Type)
	t.row("Source:", dl.Source)
	t.row("Status:", string(dl.Status))
	t.row("Reason:", string(dl.Reason))
	t.row("Attempts:", strconv.Itoa(dl.Attempts))
	t.row("First failed:", timeAgo(dl.FirstFailed, now))
	t.row("Last failed:", timeAgo(dl.LastFailed, now))
	t.row("Recovered:", timeAgo(dl.RecoveredAt, now))
	t.row("Published at:", timeText(dl.Message.PublishedAt))
	t.row("Occurred at:", timeText(dl.Message.OccurredAt))
	t.row("Fingerprint:", dl.Fingerprint.String())
	t.row("Error:", r.Text(dl.Error))
	if err := t.flush(); err != nil {
		return err
	}
	w := e.stdout
	headers := r.Headers(dl.Message.Headers)
	if len(headers) == 0 {
		fmt.Fprintln(w, "Headers:       -")
	} else {
		fmt.Fprintln(w, "Headers:")
		ht := newTable(w)
		for _, k := range slices.Sorted(maps.Keys(headers)) {
			ht.row("  "+k+":", headers[k]) // row escapes both
		}
		if err := ht.flush(); err != nil {
			return err
		}
	}
	payload := r.JSON(dl.Message.Payload)
	if len(payload) == 0 {
		_, err := fmt.Fprintln(w, "Payload:       -")
		return err
	}
	fmt.Fprintln(w, "Payload:")
	written := 0
	for line := range strings.SplitSeq(strings.TrimRight(string(payload), "\n"), "\n") {
		line = "  " + escapeControls(line)
		if written += len(line) + 1; written > payloadShowMax {
			_, err := fmt.Fprintf(w, "  … (truncated, payload of %d bytes)\n", len(dl.Message.Payload))
			return err
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// parseID parses a dead-letter id argument.
func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || id < 1 {
		return 0, usagef("%q is not a dead-letter id (want a positive number, as dlq list shows)", s)
	}
	return id, nil
}

func newDLQAuditCmd(e *env) *cobra.Command {
	var (
		store   string
		limit   int
		jsonOut bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show what operators did with dead letters, and the events handlers ignored, newest first",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkLimit(limit); err != nil {
				return err
			}
			s, err := e.openStore(cmd.Context(), store, true)
			if err != nil {
				return err
			}
			defer s.Close()
			rows, err := s.DeadLetters.ListAudit(cmd.Context(), limit)
			if err != nil {
				return storeErr(s, "list the audit trail", err)
			}
			if jsonOut {
				type auditJSON struct {
					ID           int64     `json:"id"`
					At           time.Time `json:"at"`
					Actor        string    `json:"actor"`
					Action       string    `json:"action"`
					DeadLetterID int64     `json:"dead_letter_id"`
					EventID      string    `json:"event_id"`
					Reason       string    `json:"reason"`
					Destination  string    `json:"destination"`
				}
				out := make([]auditJSON, 0, len(rows))
				for _, a := range rows {
					out = append(out, auditJSON{a.ID, a.At.UTC(), a.Actor, a.Action, a.DeadLetterID, a.EventID, a.Reason, a.Destination})
				}
				return writeJSON(e.stdout, out)
			}
			if len(rows) == 0 {
				_, err := fmt.Fprintln(e.stdout, "no audit rows yet")
				return err
			}
			t := newTable(e.stdout, "ID", "AT", "ACTOR", "ACTION", "DEAD LETTER", "EVENT ID", "DESTINATION", "REASON")
			for _, a := range rows {
				dl := strconv.FormatInt(a.DeadLetterID, 10)
				if a.DeadLetterID == 0 {
					dl = "-" // an ignored event (idem.Ignore) has no dead letter
				}
				t.row(strconv.FormatInt(a.ID, 10), timeText(a.At), a.Actor, a.Action, dl, a.EventID, cmp.Or(a.Destination, "-"), a.Reason)
			}
			return t.flush()
		},
	}
	storeFlag(cmd, &store)
	cmd.Flags().IntVar(&limit, "limit", auditLimitDefault, "show at most this many rows")
	jsonFlag(cmd, &jsonOut)
	return cmd
}
