package serve

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/inspect"
	"github.com/idemkit/idem/idemrelay"
	"github.com/idemkit/idem/idemstore"
)

// page is what every page shows around its content.
type page struct {
	Title, Nav string
	CSRF       string
	// Actor is who the request acts as ("" when nobody is logged in).
	Actor string
	// CanAct is true when the actions are enabled and the request may use them.
	CanAct   bool
	ReadOnly bool
	// Login is true when a token login is possible.
	Login bool
	// Proxy is true when an authenticating proxy's header may carry the user.
	Proxy bool
	Store string
	Flash string
	Now   time.Time
	Data  any
}

func (s *Server) base(w http.ResponseWriter, r *http.Request, title, nav string) page {
	a := s.actor(r)
	return page{Title: title, Nav: nav, CSRF: s.csrfToken(w, r), Actor: a, CanAct: s.actionsEnabled() && a != "",
		ReadOnly: s.cfg.ReadOnly, Login: s.cfg.Token != "" && !s.cfg.ReadOnly, Proxy: s.cfg.TrustHeader != "" && !s.cfg.ReadOnly, Store: s.cfg.Stores.URL.String(),
		Now: s.cfg.Now().UTC()}
}

// render executes a page into a buffer first, so that a template error is a clean 500.
func (s *Server) render(w http.ResponseWriter, _ *http.Request, code int, name string, p page, data any) {
	p.Data = data
	var buf bytes.Buffer
	if err := s.pages[name].Execute(&buf, p); err != nil {
		s.cfg.Logger.Error("idem serve: render "+name, "error", err.Error())
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// fail renders a message page with code.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	title := http.StatusText(code)
	s.render(w, r, code, "message", s.base(w, r, title, ""), msg)
}

// storeFail reports a store error without its details' secrets (the store URL is masked).
func (s *Server) storeFail(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.cfg.Logger.Error("idem serve: "+what, "error", err.Error())
	s.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("%s failed (store %s): %v", what, s.cfg.Stores.URL, err))
}

// Consumers page.

type consumerRow struct {
	Name          string
	Processed     int64
	LastProcessed time.Time
	// PerMinute is the claims of each of the last 60 minutes, oldest first.
	PerMinute []float64
	// RecentRate is the claims per minute over the last 5 minutes.
	RecentRate    float64
	DLPending     int64
	OldestPending time.Time
	// Ignored counts the events its handler ignored (idem.Ignore), from the audit trail.
	Ignored int64
	// Metrics is from the scraped endpoints, nil when none reports this consumer.
	Metrics *consumerMetrics
	// ErrorRate is errors per sample interval, oldest first.
	ErrorRate, RetryRate []float64
	ErrorClasses         []classCount
}

type classCount struct {
	Class string
	N     float64
}

type backlogRow struct {
	Name    string
	Backlog int64
	Oldest  time.Time
	Series  []float64
	Holder  string
}

type consumersData struct {
	Consumers    []consumerRow
	Queues       []backlogRow
	Outbox       backlogRow
	Partitions   []backlogRow
	DeadLetters  backlogRow
	ByReason     []reasonCount
	Recovered    int
	RecoveryMed  time.Duration
	RecoveryMax  time.Duration
	Scraped      bool
	ScrapeErrors []string
	Samples      int
	Interval     time.Duration
}

type reasonCount struct {
	Reason string
	N      int64
}

func (s *Server) consumersPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	p := s.base(w, r, "Overview", "consumers")
	d, err := s.consumersData(ctx, p.Now)
	if err != nil {
		s.storeFail(w, r, "read the consumers", err)
		return
	}
	s.render(w, r, http.StatusOK, "consumers", p, d)
}

func (s *Server) consumersData(ctx context.Context, now time.Time) (consumersData, error) {
	st := s.cfg.Stores
	d := consumersData{Interval: s.cfg.SampleInterval}
	rows := map[string]*consumerRow{}
	get := func(n string) *consumerRow {
		if rows[n] == nil {
			rows[n] = &consumerRow{Name: n}
		}
		return rows[n]
	}
	claims, err := inspect.ClaimCounts(ctx, st)
	if err != nil {
		return d, fmt.Errorf("count claims: %w", err)
	}
	for _, c := range claims {
		row := get(c.Consumer)
		row.Processed, row.LastProcessed = c.Count, c.Last
	}
	ignored, err := inspect.IgnoredCounts(ctx, st)
	if err != nil {
		return d, fmt.Errorf("count ignored events: %w", err)
	}
	for name, n := range ignored {
		get(name).Ignored = n
	}
	start := now.Truncate(time.Minute).Add(-59 * time.Minute)
	rate, err := inspect.ClaimRate(ctx, st, start, time.Minute)
	if err != nil {
		return d, fmt.Errorf("claims per minute: %w", err)
	}
	for _, p := range rate {
		row := get(p.Consumer)
		if row.PerMinute == nil {
			row.PerMinute = make([]float64, 60)
		}
		if i := int(p.Start.Sub(start) / time.Minute); i >= 0 && i < 60 {
			row.PerMinute[i] += float64(p.Count)
		}
	}
	pending, err := inspect.PendingDeadLetters(ctx, st)
	if err != nil {
		return d, fmt.Errorf("count pending dead letters: %w", err)
	}
	for _, p := range pending {
		row := get(p.Consumer)
		row.DLPending, row.OldestPending = p.Count, p.Oldest
	}
	hist := s.snapshot()
	d.Samples = len(hist)
	if len(hist) > 0 {
		last := hist[len(hist)-1]
		d.ScrapeErrors = last.ScrapeErrors
		d.Scraped = len(s.cfg.MetricsURLs) > 0
		for name, m := range last.Consumers {
			row := get(name)
			row.Metrics = &m
			for _, c := range slices.Sorted(maps.Keys(m.Errors)) {
				row.ErrorClasses = append(row.ErrorClasses, classCount{c, m.Errors[c]})
			}
			row.ErrorRate = deltas(hist, func(sm sample) float64 { return sm.Consumers[name].errorsTotal() })
			row.RetryRate = deltas(hist, func(sm sample) float64 { return sm.Consumers[name].Retries })
		}
	}
	for _, n := range slices.Sorted(maps.Keys(rows)) {
		row := rows[n]
		if row.PerMinute == nil {
			row.PerMinute = make([]float64, 60)
		}
		var recent float64
		for _, v := range row.PerMinute[55:] {
			recent += v
		}
		row.RecentRate = recent / 5
		d.Consumers = append(d.Consumers, *row)
	}

	queues, err := s.queues(ctx)
	if err != nil {
		return d, err
	}
	for _, q := range queues {
		qs, err := st.Queue.QueueStats(ctx, q)
		if err != nil {
			return d, fmt.Errorf("stats of queue %s: %w", q, err)
		}
		d.Queues = append(d.Queues, backlogRow{Name: q, Backlog: qs.Backlog, Oldest: qs.Oldest,
			Series: series(hist, func(sm sample) float64 { return float64(sm.Queues[q]) })})
	}
	ob, err := st.Outbox.OutboxStats(ctx)
	if err != nil {
		return d, fmt.Errorf("outbox stats: %w", err)
	}
	d.Outbox = backlogRow{Name: "outbox", Backlog: ob.Backlog, Oldest: ob.Oldest,
		Series: series(hist, func(sm sample) float64 { return float64(sm.Outbox) })}
	parts, err := inspect.OutboxPartitions(ctx, st)
	if err != nil {
		return d, fmt.Errorf("outbox partitions: %w", err)
	}
	leases, err := st.Outbox.LeaseList(ctx, idemrelay.PartitionLeasePrefix, now)
	if err != nil {
		return d, fmt.Errorf("relay leases: %w", err)
	}
	holders := map[string]string{}
	for _, l := range leases {
		holders[strings.TrimPrefix(l.Name, idemrelay.PartitionLeasePrefix)] = l.Owner
	}
	for _, p := range parts {
		k := strconv.Itoa(p.Partition)
		d.Partitions = append(d.Partitions, backlogRow{Name: k, Backlog: p.Backlog, Oldest: p.Oldest, Holder: holders[k]})
	}

	stats, err := st.DeadLetters.DeadLetterStats(ctx)
	if err != nil {
		return d, fmt.Errorf("dead-letter stats: %w", err)
	}
	d.DeadLetters = backlogRow{Name: "dead letters", Backlog: stats.Pending, Oldest: stats.OldestPending,
		Series: series(hist, func(sm sample) float64 { return float64(sm.DeadLetters) })}
	for reason, n := range stats.ByReason {
		d.ByReason = append(d.ByReason, reasonCount{string(reason), n})
	}
	slices.SortFunc(d.ByReason, func(a, b reasonCount) int { return cmp.Or(cmp.Compare(b.N, a.N), cmp.Compare(a.Reason, b.Reason)) })
	recov, err := inspect.RecoveryTimes(ctx, st, recoveryWindow)
	if err != nil {
		return d, fmt.Errorf("recovery times: %w", err)
	}
	if len(recov) > 0 {
		slices.Sort(recov)
		d.Recovered, d.RecoveryMed, d.RecoveryMax = len(recov), recov[len(recov)/2], recov[len(recov)-1]
	}
	return d, nil
}

// series picks one value per sample.
func series(hist []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(hist))
	for i, sm := range hist {
		out[i] = f(sm)
	}
	return out
}

// deltas is the increase of a counter between consecutive samples (a restart's reset counts
// as zero).
func deltas(hist []sample, f func(sample) float64) []float64 {
	if len(hist) < 2 {
		return nil
	}
	out := make([]float64, 0, len(hist)-1)
	for i := 1; i < len(hist); i++ {
		out = append(out, max(0, f(hist[i])-f(hist[i-1])))
	}
	return out
}

// Dead letters page.

// listFilter is the dead-letter list's query string.
type listFilter struct {
	Consumer, Reason, Tenant, Status, Age string
	Limit                                 int
}

// parseFilter reads the list's filters; an invalid one is an error for the page to show.
func parseFilter(q url.Values, now time.Time) (listFilter, idemstore.DeadLetterFilter, error) {
	f := listFilter{Consumer: strings.TrimSpace(q.Get("consumer")), Reason: strings.TrimSpace(q.Get("reason")),
		Tenant: q.Get("tenant"), Status: strings.TrimSpace(q.Get("status")), Age: strings.TrimSpace(q.Get("age")), Limit: listLimitDefault}
	if !q.Has("status") {
		f.Status = string(idem.DeadLetterPending)
	}
	out := idemstore.DeadLetterFilter{Consumer: f.Consumer, Tenant: f.Tenant}
	if f.Reason != "" {
		if out.Reason = idem.Reason(f.Reason); !out.Reason.Valid() {
			return f, out, fmt.Errorf("reason %q is not a dead-letter reason", f.Reason)
		}
	}
	if f.Status != "" && f.Status != "all" {
		if out.Status = idem.DeadLetterStatus(f.Status); !out.Status.Valid() {
			return f, out, fmt.Errorf("status %q is not pending, replayed or discarded", f.Status)
		}
	}
	if f.Age != "" {
		d, err := parseAge(f.Age)
		if err != nil {
			return f, out, err
		}
		out.OlderThan = now.Add(-d)
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > listLimitMax {
			return f, out, fmt.Errorf("limit %q is not a number from 1 to %d", l, listLimitMax)
		}
		f.Limit = n
	}
	out.Limit = f.Limit
	return f, out, nil
}

// parseAge reads "older than" durations: Go durations plus days ("7d").
func parseAge(s string) (time.Duration, error) {
	var (
		d   time.Duration
		err error
	)
	if n, ok := strings.CutSuffix(s, "d"); ok {
		var days int
		days, err = strconv.Atoi(n)
		if days > 36500 { // a century: beyond it the product overflows soon
			days = -1
		}
		d = time.Duration(days) * 24 * time.Hour
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("age %q is not a positive duration (30m, 12h, 7d)", s)
	}
	return d, nil
}

type deadLettersData struct {
	Filter    listFilter
	Error     string
	Rows      []idem.DeadLetter
	Truncated bool
	Reasons   []idem.Reason
	Consumers []string
	// PendingIDs are the pending dead letters shown, at most batchMax, for "replay all shown".
	PendingIDs []int64
}

func (s *Server) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	p := s.base(w, r, "Dead letters", "deadletters")
	f, filter, err := parseFilter(r.URL.Query(), p.Now)
	d := deadLettersData{Filter: f, Reasons: idem.Reasons()}
	code := http.StatusOK
	if err != nil {
		d.Error, code = err.Error(), http.StatusBadRequest
	} else {
		rows, err := s.cfg.Stores.DeadLetters.ListDeadLetters(r.Context(), filter)
		if err != nil {
			s.storeFail(w, r, "list dead letters", err)
			return
		}
		d.Rows, d.Truncated = rows, len(rows) == f.Limit
		for _, dl := range rows {
			if dl.Status == idem.DeadLetterPending && len(d.PendingIDs) < batchMax {
				d.PendingIDs = append(d.PendingIDs, dl.ID)
			}
		}
	}
	claims, err := inspect.ClaimCounts(r.Context(), s.cfg.Stores)
	if err == nil {
		for _, c := range claims {
			d.Consumers = append(d.Consumers, c.Consumer)
		}
	}
	s.render(w, r, code, "deadletters", p, d)
}

type deadLetterData struct {
	DL       idem.DeadLetter
	Version  string
	Error    string
	Headers  map[string]string
	Payload  string
	Cut      bool
	Recovery time.Duration
	Audit    []idemstore.AuditEntry
}

func (s *Server) deadLetterPage(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		s.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not a dead-letter id.", r.PathValue("id")))
		return
	}
	dl, err := s.cfg.Stores.DeadLetters.GetDeadLetter(r.Context(), id)
	if errors.Is(err, idem.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("Dead letter %d does not exist.", id))
		return
	}
	if err != nil {
		s.storeFail(w, r, fmt.Sprintf("read dead letter %d", id), err)
		return
	}
	audit, err := s.cfg.Stores.DeadLetters.ListAudit(r.Context(), 1000)
	if err != nil {
		s.storeFail(w, r, "list the audit trail", err)
		return
	}
	d := deadLetterData{DL: dl, Version: dl.ConsumerVersion(), Error: s.redactor.Text(dl.Error),
		Headers: s.redactor.Headers(dl.Message.Headers)}
	payload := string(s.redactor.JSON(dl.Message.Payload))
	if len(payload) > payloadShowMax {
		payload, d.Cut = strings.ToValidUTF8(payload[:payloadShowMax], ""), true
	}
	d.Payload = payload
	if !dl.RecoveredAt.IsZero() {
		d.Recovery = dl.RecoveredAt.Sub(dl.FirstFailed)
	}
	for _, a := range audit {
		if a.DeadLetterID == id {
			d.Audit = append(d.Audit, a)
		}
	}
	s.render(w, r, http.StatusOK, "deadletter", s.base(w, r, fmt.Sprintf("Dead letter %d", id), "deadletters"), d)
}

// Audit page.

// auditPage shows the audit trail, with the result of the action that redirected here when its
// signature holds.
func (s *Server) auditPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	flash := q.Get("done")
	if flash != "" && !hmac.Equal([]byte(q.Get("sig")), []byte(s.sign("flash", flash))) {
		flash = ""
	}
	limit := 200
	if l := r.URL.Query().Get("limit"); l != "" {
		if n, err := strconv.Atoi(l); err == nil && n > 0 && n <= listLimitMax {
			limit = n
		}
	}
	rows, err := s.cfg.Stores.DeadLetters.ListAudit(r.Context(), limit)
	if err != nil {
		s.storeFail(w, r, "list the audit trail", err)
		return
	}
	p := s.base(w, r, "Audit trail", "audit")
	p.Flash = flash
	s.render(w, r, http.StatusOK, "audit", p, rows)
}
