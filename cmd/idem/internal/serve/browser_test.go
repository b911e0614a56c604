package serve

import (
	"context"
	"database/sql"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
)

// Environment of the browser test.
const (
	// chromiumVar overrides the browser's path (default /usr/bin/chromium, Debian's package).
	chromiumVar = "IDEM_CHROMIUM"
	// screenshotsVar names a directory to save the pages' screenshots in (docs/ keeps them).
	screenshotsVar = "IDEM_DASHBOARD_SCREENSHOTS"
)

// chromium returns the browser to drive, or skips (fails with IDEM_REQUIRE_SERVICES=1).
func chromium(t *testing.T) string {
	t.Helper()
	p := os.Getenv(chromiumVar)
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		if testenv.Required() {
			t.Fatalf("the browser test is required (%s=1) but %s is missing: apt-get install chromium, or set %s", testenv.RequireVar, p, chromiumVar)
		}
		t.Skipf("skipping: no headless browser at %s (apt-get install chromium, or set %s)", p, chromiumVar)
	}
	return p
}

// browserCtx starts a headless Chromium with a fresh profile, stopped at cleanup.
func browserCtx(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(bctx), "start the browser")
	return bctx
}

// screenshot saves the page as docs/dashboard-NAME.png when IDEM_DASHBOARD_SCREENSHOTS is set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(screenshotsVar)
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100 means PNG
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "dashboard-"+name+".png"), png, 0o644))
}

// TestBrowser drives the dashboard in headless Chromium: the pages load, a filter narrows the
// list, a discard without a reason is refused, and a dead letter replayed from the page reaches
// a consumer running over the queue table, which applies it, and shows in the audit trail.
func TestBrowser(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	bctx := browserCtx(t, ctx)

	st := sqliteStores(t)
	now := time.Now()
	sd := seed(t, st, now)
	db := st.SQLite.DB()
	_, err := db.ExecContext(ctx, `CREATE TABLE applied (event_id TEXT PRIMARY KEY)`)
	require.NoError(t, err)
	// An event ledger@v1's handler ignored (idem.Ignore): its order was deleted.
	require.NoError(t, st.SQLite.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return st.SQLite.RecordIgnoreTx(ctx, tx, idemstore.RecordIgnoreParams{
			Key: idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-gone"}, Reason: "order deleted", Now: now})
	}))

	// A consumer process's metrics, as idem serve --metrics would scrape them.
	m := idemprom.New(idemprom.Config{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	ms := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer ms.Close()

	s, hs := newServer(t, st, Config{Token: testToken, MetricsURLs: []string{ms.URL}, Queues: []string{"payments"}})
	for i := range 12 {
		for range i % 4 {
			m.Observe(idem.Observation{Consumer: "ledger@v1", Owner: "team-ledger", Queue: "payments", Outcome: idem.OutcomeProcessed})
		}
		if i%5 == 2 {
			m.Observe(idem.Observation{Consumer: "ledger@v1", Owner: "team-ledger", Queue: "payments", Outcome: idem.OutcomeRetried, Class: idem.ClassTransient})
		}
		require.NoError(t, s.Sample(ctx))
	}
	m.Observe(idem.Observation{Consumer: "mailer@v2", Owner: "team-mail", Queue: "mail", Outcome: idem.OutcomeDeadLettered, Class: idem.ClassPermanent, Reason: idem.ReasonPermanentError})
	require.NoError(t, s.Sample(ctx))
	u := hs.URL
	id := func(n int64) string { return strconv.FormatInt(n, 10) }

	do := func(steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...))
	}
	text := func(elem string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Text(chromedp.ID(elem)))
		require.NoError(t, err, "text of #%s", elem)
		return v
	}
	location := func() string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Location())
		require.NoError(t, err)
		return v
	}
	listed := func() []string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#deadletters tbody tr')].map(r => r.dataset.id)`))
		require.NoError(t, err)
		return v
	}
	visible := func(elem string) chromedp.Action[chromedp.Void] { return chromedp.WaitVisible(chromedp.ID(elem)) }

	// The consumers page loads, logged out, without actions.
	do(chromedp.Navigate(u+"/"), visible("consumers"))
	require.Contains(t, text("consumers"), "ledger@v1")
	require.Contains(t, text("consumers"), "mailer@v2")

	// Log in.
	do(chromedp.Navigate(u+"/login"), visible("token"),
		chromedp.SendKeys(chromedp.ID("name"), "alice"),
		chromedp.SendKeys(chromedp.ID("token"), testToken),
		chromedp.Click(chromedp.ID("login")),
		visible("deadletters"))
	require.Equal(t, "alice (idem serve)", text("actor"))
	screenshot(t, bctx, "deadletters")

	// A filter narrows the list.
	do(chromedp.SetValue(chromedp.ID("f-reason"), "retries_exhausted"),
		chromedp.Click(chromedp.ID("f-apply")))
	require.Eventually(t, func() bool { return strings.Contains(location(), "reason=retries_exhausted") },
		20*time.Second, 20*time.Millisecond, "the filter form was not submitted")
	do(visible("deadletters"))
	require.Equal(t, []string{id(sd.ledgerNew)}, listed())
	do(chromedp.Navigate(u+"/deadletters?tenant=acme"), visible("deadletters"))
	require.Equal(t, []string{id(sd.ledgerOld), id(sd.mailer)}, listed())

	// A discard with a blank reason is refused by the server (the browser's own check lets
	// spaces through), and the dead letter stays pending.
	do(chromedp.Navigate(u+"/deadletters/"+id(sd.mailer)), visible("payload"))
	screenshot(t, bctx, "detail")
	do(chromedp.SendKeys(chromedp.ID("discard-reason"), "   "),
		chromedp.Click(chromedp.ID("discard-one")),
		visible("message"))
	require.Contains(t, text("message"), "needs a reason")
	require.Equal(t, idem.DeadLetterPending, status(t, st, sd.mailer))
	// With the field left empty the browser does not even send the form.
	do(chromedp.Navigate(u+"/deadletters/"+id(sd.mailer)), visible("discard-one"),
		chromedp.Click(chromedp.ID("discard-one")),
		chromedp.Sleep(300*time.Millisecond))
	require.True(t, strings.HasSuffix(location(), "/deadletters/"+id(sd.mailer)), location())
	missing, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.getElementById('discard-reason').validity.valueMissing`))
	require.NoError(t, err)
	require.True(t, missing, "the empty reason field is what stopped the form")
	require.Equal(t, idem.DeadLetterPending, status(t, st, sd.mailer))

	// A consumer over the queue table, applying each event once.
	consumer, err := idem.NewConsumer(st.SQLite, idem.ConsumerConfig[*sql.Tx]{
		Name: "ledger@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO applied (event_id) VALUES (?)`, msg.EventID)
			return err
		},
	})
	require.NoError(t, err)
	src, err := idemqueue.NewSource(st.SQLite, idemqueue.SourceConfig{Queue: "payments", MaxWait: 20 * time.Millisecond})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx, src) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()

	// Replay one from the list: preview, confirm, audit.
	do(chromedp.Navigate(u+"/deadletters"), visible("deadletters"),
		chromedp.Click(chromedp.CSS(fmt.Sprintf(`input[name="id"][value="%d"]`, sd.ledgerOld))),
		chromedp.Click(chromedp.ID("replay-selected")),
		visible("preview-count"))
	require.Equal(t, "1 pending dead letter will be replayed.", text("preview-count"))
	require.Equal(t, idem.DeadLetterPending, status(t, st, sd.ledgerOld), "the preview changes nothing")
	do(chromedp.SendKeys(chromedp.ID("note"), "wallet w1 reopened"))
	screenshot(t, bctx, "confirm")
	do(chromedp.Click(chromedp.ID("confirm")), visible("audit"))
	require.Contains(t, text("flash"), "Replayed 1 dead letter (#"+id(sd.ledgerOld)+") as alice (idem serve)")
	audit := text("audit")
	require.Contains(t, audit, "alice (idem serve)")
	require.Contains(t, audit, "replay")
	require.Contains(t, audit, "evt-old")
	require.Contains(t, audit, "wallet w1 reopened")

	// The consumer applies the replayed event, once, and the dead letter records its recovery.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM applied WHERE event_id = 'evt-old'`).Scan(&n))
		return n == 1
	}, 20*time.Second, 20*time.Millisecond, "the replayed event was never applied")
	require.Eventually(t, func() bool {
		dl, err := st.DeadLetters.GetDeadLetter(ctx, sd.ledgerOld)
		require.NoError(t, err)
		return !dl.RecoveredAt.IsZero()
	}, 10*time.Second, 20*time.Millisecond, "the dead letter never recorded its recovery")
	do(chromedp.Navigate(u+"/deadletters/"+id(sd.ledgerOld)), visible("status"))
	detail := text("detail")
	require.Contains(t, detail, "replayed")
	require.Contains(t, detail, "after the first failure")
	do(chromedp.Navigate(u+"/"), visible("consumers"))
	require.Contains(t, text("recovery"), "1 recovered after replay")
	screenshot(t, bctx, "consumers")
	do(chromedp.Navigate(u+"/audit"), visible("audit"))
	screenshot(t, bctx, "audit")
}
