package serve

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemqueue"
)

const testToken = "0123456789abcdef0123"

// newServer starts a dashboard over st with cfg's guards, replaying into the queue table.
func newServer(t *testing.T, st *connect.Stores, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	cfg.Stores = st
	if cfg.Replayer == nil {
		cfg.Replayer = idemdlq.NewReplayer(st.DeadLetters, idemqueue.NewSink(st.Queue), idemdlq.ReplayerConfig{})
	}
	s, err := New(cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return s, hs
}

func status(t *testing.T, st *connect.Stores, id int64) idem.DeadLetterStatus {
	t.Helper()
	dl, err := st.DeadLetters.GetDeadLetter(context.Background(), id)
	require.NoError(t, err)
	return dl.Status
}

func TestPagesRender(t *testing.T) {
	t.Parallel()
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			st := k.open(t)
			now := time.Now()
			sd := seed(t, st, now)
			s, hs := newServer(t, st, Config{Queues: []string{"payments"}})
			require.NoError(t, s.Sample(context.Background()))
			require.NoError(t, s.Sample(context.Background()))
			b := newBrowser(t, hs)

			code, body := b.get("/")
			require.Equal(t, http.StatusOK, code, body)
			for _, want := range []string{"ledger@v1", "mailer@v2", "<svg class=\"spark\"", "permanent_error", "payments", "Outbox", "actions disabled"} {
				require.Contains(t, body, want)
			}
			// ledger@v1 has 4 claims, 3 of them in the last 5 minutes.
			require.Regexp(t, `ledger@v1</a></td>\s*<td class="n">4</td>`, body)
			require.Contains(t, body, "0.6/min")
			// The outbox: 3 rows waiting, the first one's partition held by relay-a.
			require.Contains(t, body, `3 waiting`)
			require.Contains(t, body, `id="partitions"`)
			require.Contains(t, body, `relay-a`)

			code, body = b.get("/deadletters")
			require.Equal(t, http.StatusOK, code)
			for _, id := range []int64{sd.ledgerOld, sd.ledgerNew, sd.mailer} {
				require.Contains(t, body, fmt.Sprintf(`data-id="%d"`, id))
			}
			require.NotContains(t, body, `type="checkbox"`, "no actions without a token")

			code, body = b.get("/deadletters/" + strconv.FormatInt(sd.mailer, 10))
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, body, "mailer@v2")
			require.Contains(t, body, "v2", "consumer version")
			require.Contains(t, body, "team-mail", "owner")
			require.Contains(t, body, "wallet evt-mail is closed")
			require.Contains(t, body, "a@example.com")
			require.NotContains(t, body, "hunter2", "payload secrets are masked")
			require.NotContains(t, body, "s3cr3t-token", "header secrets are masked")

			code, _ = b.get("/deadletters/999999")
			require.Equal(t, http.StatusNotFound, code)
			code, body = b.get("/audit")
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, body, "No operator action yet")
			code, body = b.get("/static/style.css")
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, body, "svg.spark")
		})
	}
}

func TestFilters(t *testing.T) {
	t.Parallel()
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			st := k.open(t)
			sd := seed(t, st, time.Now())
			_, hs := newServer(t, st, Config{})
			b := newBrowser(t, hs)
			all := []int64{sd.ledgerOld, sd.ledgerNew, sd.mailer}
			for _, tc := range []struct {
				query string
				want  []int64
			}{
				{"", all},
				{"consumer=mailer@v2", []int64{sd.mailer}},
				{"consumer=ledger@v1", []int64{sd.ledgerOld, sd.ledgerNew}},
				{"reason=retries_exhausted", []int64{sd.ledgerNew}},
				{"tenant=acme", []int64{sd.ledgerOld, sd.mailer}},
				{"age=1h", []int64{sd.ledgerOld}},
				{"age=1h&tenant=globex", nil},
				{"status=replayed", nil},
				{"status=all&consumer=ledger@v1&reason=permanent_error", []int64{sd.ledgerOld}},
			} {
				code, body := b.get("/deadletters?" + tc.query)
				require.Equal(t, http.StatusOK, code, tc.query)
				for _, id := range all {
					has := strings.Contains(body, fmt.Sprintf(`data-id="%d"`, id))
					require.Equal(t, contains(tc.want, id), has, "query %q, dead letter %d", tc.query, id)
				}
			}
			for _, bad := range []string{"reason=nope", "age=soon", "age=-1h", "age=99999999999d", "status=lost", "limit=0", "limit=1001"} {
				code, body := b.get("/deadletters?" + bad)
				require.Equal(t, http.StatusBadRequest, code, bad)
				require.Contains(t, body, `id="filter-error"`, bad)
			}
		})
	}
}

func contains(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func TestGuards(t *testing.T) {
	t.Parallel()
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			st := k.open(t)
			sd := seed(t, st, time.Now())
			id := strconv.FormatInt(sd.ledgerOld, 10)
			replay := func(csrf string) url.Values {
				return url.Values{"csrf": {csrf}, "id": {id}, "confirm": {"yes"}}
			}

			// No token, no header: actions are disabled.
			_, open := newServer(t, st, Config{})
			b := newBrowser(t, open)
			code, body := b.post("/deadletters/replay", replay(b.csrf()))
			require.Equal(t, http.StatusForbidden, code)
			require.Contains(t, body, "Actions are disabled")

			// Read-only wins over a token.
			_, ro := newServer(t, st, Config{Token: testToken, ReadOnly: true})
			b = newBrowser(t, ro)
			code, body = b.post("/deadletters/discard", url.Values{"csrf": {b.csrf()}, "id": {id}, "reason": {"x"}, "confirm": {"yes"}})
			require.Equal(t, http.StatusForbidden, code)
			require.Contains(t, body, "read-only")

			// Behind a proxy: the header names the user; without it nobody may act, and the
			// token login is not available.
			_, px := newServer(t, st, Config{TrustHeader: "X-Forwarded-User"})
			b = newBrowser(t, px)
			code, body = b.post("/deadletters/replay", url.Values{"csrf": {b.csrf()}, "id": {id}})
			require.Equal(t, http.StatusForbidden, code)
			require.Contains(t, body, "not logged in")
			code, _ = b.login(testToken, "mallory")
			require.Equal(t, http.StatusForbidden, code)
			b.header.Set("X-Forwarded-User", "carol")
			code, body = b.post("/deadletters/replay", url.Values{"csrf": {b.csrf()}, "id": {id}})
			require.Equal(t, http.StatusOK, code, "a preview")
			require.Contains(t, body, "1 pending dead letter will be replayed")
			b.header.Set("X-Forwarded-User", strings.Repeat("c", nameMax+1))
			code, _ = b.post("/deadletters/replay", url.Values{"csrf": {b.csrf()}, "id": {id}})
			require.Equal(t, http.StatusForbidden, code, "a name over the limit is nobody")

			_, hs := newServer(t, st, Config{Token: testToken})
			b = newBrowser(t, hs)
			// Not logged in.
			code, body = b.post("/deadletters/replay", replay(b.csrf()))
			require.Equal(t, http.StatusForbidden, code)
			require.Contains(t, body, "not logged in")
			// A wrong token does not log in.
			code, _ = b.login("wrong-token-wrong-token", "mallory")
			require.Equal(t, http.StatusForbidden, code)
			code, _ = b.login(testToken, "alice")
			require.Equal(t, http.StatusOK, code) // redirected to the list
			// Bad or missing CSRF token, or a foreign Origin.
			for _, csrf := range []string{"", "00", strings.Repeat("a", 64)} {
				code, body = b.post("/deadletters/replay", replay(csrf))
				require.Equal(t, http.StatusForbidden, code, csrf)
				require.Contains(t, body, "CSRF")
			}
			good := b.csrf()
			b.header.Set("Origin", "http://evil.example")
			code, _ = b.post("/deadletters/replay", replay(good))
			require.Equal(t, http.StatusForbidden, code)
			b.header.Del("Origin")
			// The bearer token without the form's CSRF token is refused too.
			b.header.Set("Authorization", "Bearer "+testToken)
			code, _ = b.post("/deadletters/replay", replay(""))
			require.Equal(t, http.StatusForbidden, code)
			b.header.Del("Authorization")
			// A discard without a reason (or a blank one) is refused, at preview and at confirm.
			for _, reason := range []string{"", "   "} {
				for _, confirm := range []string{"", "yes"} {
					code, body = b.post("/deadletters/discard", url.Values{"csrf": {good}, "id": {id}, "reason": {reason}, "confirm": {confirm}})
					require.Equal(t, http.StatusBadRequest, code)
					require.Contains(t, body, "needs a reason")
				}
			}
			// No selection, a bad id, too many.
			tooMany := make([]string, batchMax+1)
			for i := range tooMany {
				tooMany[i] = strconv.Itoa(i + 1)
			}
			for _, ids := range [][]string{nil, {"x"}, {"-1"}, {strings.Join(tooMany, ",")}} {
				code, _ = b.post("/deadletters/replay", url.Values{"csrf": {good}, "id": ids})
				require.Equal(t, http.StatusBadRequest, code, ids)
			}
			require.Equal(t, idem.DeadLetterPending, status(t, st, sd.ledgerOld), "nothing was touched")
			rows, err := st.DeadLetters.ListAudit(context.Background(), 10)
			require.NoError(t, err)
			require.Empty(t, rows)
		})
	}
}

func TestReplayAndDiscard(t *testing.T) {
	t.Parallel()
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := k.open(t)
			sd := seed(t, st, time.Now())
			_, hs := newServer(t, st, Config{Token: testToken, TrustHeader: "X-Forwarded-User"})
			b := newBrowser(t, hs)
			_, _ = b.login(testToken, "alice")
			csrf := b.csrf()
			ids := []string{strconv.FormatInt(sd.ledgerOld, 10), strconv.FormatInt(sd.ledgerNew, 10)}

			// "Replay all shown" offers the filtered list's pending ids.
			_, body := b.get("/deadletters?consumer=ledger@v1")
			require.Contains(t, body, fmt.Sprintf(`name="id" value="%d,%d"`, sd.ledgerOld, sd.ledgerNew))
			require.Contains(t, body, "Replay all 2 pending shown")

			// Preview: counts, changes nothing.
			code, body := b.post("/deadletters/replay", url.Values{"csrf": {csrf}, "id": ids})
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, "2 pending dead letters will be replayed")
			require.Contains(t, body, "to the queue each one came from")
			require.Equal(t, idem.DeadLetterPending, status(t, st, sd.ledgerOld))

			// Confirm.
			code, body = b.post("/deadletters/replay", url.Values{"csrf": {csrf}, "id": {strings.Join(ids, ",")}, "confirm": {"yes"}, "note": {"fixed wallet"}})
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, "Replayed 2 dead letters")
			require.Contains(t, body, "alice (idem serve)")
			require.Equal(t, idem.DeadLetterReplayed, status(t, st, sd.ledgerOld))
			require.Equal(t, idem.DeadLetterReplayed, status(t, st, sd.ledgerNew))
			qs, err := st.Queue.QueueStats(ctx, "payments")
			require.NoError(t, err)
			require.EqualValues(t, 2, qs.Backlog, "the replays are back in their queue")

			// Replaying again previews nothing pending.
			code, body = b.post("/deadletters/replay", url.Values{"csrf": {csrf}, "id": ids[:1]})
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, body, "0 pending dead letters will be replayed")

			// Discard through the proxy's header, with a reason.
			b2 := newBrowser(t, hs)
			_, body = b2.get("/deadletters")
			require.NotContains(t, body, `type="checkbox"`, "no actions before the proxy names the user")
			b2.header.Set("X-Forwarded-User", "bob")
			_, body = b2.get("/deadletters")
			require.Contains(t, body, `acting as <b id="actor">bob (idem serve)</b>`)
			mid := strconv.FormatInt(sd.mailer, 10)
			code, body = b2.post("/deadletters/discard", url.Values{"csrf": {b2.csrf()}, "id": {mid}, "reason": {"test mail from staging"}, "confirm": {"yes"}})
			require.Equal(t, http.StatusOK, code, body)
			require.Contains(t, body, "Discarded 1 dead letter")
			require.Equal(t, idem.DeadLetterDiscarded, status(t, st, sd.mailer))

			rows, err := st.DeadLetters.ListAudit(ctx, 10)
			require.NoError(t, err)
			require.Len(t, rows, 3)
			require.Equal(t, "bob (idem serve)", rows[0].Actor)
			require.Equal(t, "discard", rows[0].Action)
			require.Equal(t, "test mail from staging", rows[0].Reason)
			require.Equal(t, "alice (idem serve)", rows[1].Actor)
			require.Equal(t, "replay", rows[1].Action)

			_, body = b.get("/audit")
			require.Contains(t, body, "test mail from staging")
			require.NotContains(t, body, `id="flash"`)
			_, body = b.get("/audit?" + url.Values{"done": {"Replayed everything"}, "sig": {"00"}}.Encode())
			require.NotContains(t, body, "Replayed everything", "an unsigned result is not shown")
			_, body = b.get("/deadletters/" + mid)
			require.Contains(t, body, "bob (idem serve)")
		})
	}
}

func TestScrapedMetrics(t *testing.T) {
	t.Parallel()
	st := sqliteStores(t)
	seed(t, st, time.Now())
	m := idemprom.New(idemprom.Config{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)
	ev := func(o idem.Outcome, c idem.Class) idem.Observation {
		return idem.Observation{Consumer: "ledger@v1", Owner: "team-ledger", Queue: "payments", Outcome: o, Class: c}
	}
	now := time.Now()
	s, hs := newServer(t, st, Config{MetricsURLs: []string{metrics.URL, "http://127.0.0.1:1/metrics"},
		Now: func() time.Time { return now }})
	require.NoError(t, s.Sample(context.Background()))
	for _, e := range []idem.Observation{ev(idem.OutcomeProcessed, idem.ClassUnknown), ev(idem.OutcomeRetried, idem.ClassTransient),
		ev(idem.OutcomeRetried, idem.ClassTransient), ev(idem.OutcomeDuplicate, idem.ClassUnknown), ev(idem.OutcomeDeadLettered, idem.ClassPermanent)} {
		m.Observe(e)
	}
	m.Paused("ledger@v1")
	require.NoError(t, s.Sample(context.Background()))

	_, body := newBrowser(t, hs).get("/")
	for _, want := range []string{"transient 2", "permanent 1", ">paused<", "http://127.0.0.1:1/metrics", "· team-ledger"} {
		require.Contains(t, body, want)
	}
	hist := s.snapshot()
	require.Len(t, hist, 2)
	c := hist[1].Consumers["ledger@v1"]
	require.Equal(t, consumerMetrics{Processed: 1, Retries: 2, Duplicates: 1, Paused: true, Owner: "team-ledger",
		Errors: map[string]float64{"unknown": 0, "transient": 2, "permanent": 1}}, c)
	require.Equal(t, []float64{3}, deltas(hist, func(sm sample) float64 { return sm.Consumers["ledger@v1"].errorsTotal() }))
}

// TestRunWhileServing: the sampler appends to the history while pages read it.
func TestRunWhileServing(t *testing.T) {
	t.Parallel()
	st := sqliteStores(t)
	seed(t, st, time.Now())
	s, hs := newServer(t, st, Config{SampleInterval: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	b := newBrowser(t, hs)
	for range 10 {
		code, _ := b.get("/")
		require.Equal(t, http.StatusOK, code)
	}
	require.Eventually(t, func() bool { return len(s.snapshot()) >= 3 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	<-done
	n := len(s.snapshot())
	_, body := b.get("/")
	require.Contains(t, body, fmt.Sprintf("Charts over time: %d samples", n))
	require.NotContains(t, body, `aria-label="not enough samples yet"`, "every chart has points")
}
