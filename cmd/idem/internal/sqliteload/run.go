package sqliteload

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/payments"
	"github.com/idemkit/idem/idemsqlite"
)

// Defaults for Options.
const (
	DurationDefault     = 3 * time.Minute
	DrainTimeoutDefault = 2 * time.Minute
	BacklogDefault      = 2000
	ProduceEveryDefault = 10 * time.Millisecond // 100 orders/s offered
	HandlerHoldDefault  = 2 * time.Millisecond
	WorkersDefault      = 4
	KillMinDefault      = time.Second
	KillMaxDefault      = 3 * time.Second
	// ProgressWindowDefault is the window in which every role must make progress.
	ProgressWindowDefault = 3 * time.Second
)

// Options configures a run. Zero fields take the defaults above.
type Options struct {
	// Path is the SQLite file; it must not exist yet (the run creates it and leaves it behind).
	Path string
	// Duration is how long the roles run (and are killed) before the drain.
	Duration time.Duration
	// DrainTimeout bounds the drain: the producer stopped, relay and consumer run until the
	// outbox and the queue are empty.
	DrainTimeout time.Duration
	// Backlog is how many jobs are queued before the start.
	Backlog int
	// ProduceEvery, HandlerHold and Workers shape the producer and the consumer.
	ProduceEvery, HandlerHold time.Duration
	Workers                   int
	// NoKills runs without SIGKILLs: the load alone.
	NoKills bool
	// KillMin and KillMax bound the time between two SIGKILLs of a random role, which is
	// restarted at once.
	KillMin, KillMax time.Duration
	// ProgressWindow is the window in which every role must make progress (counted from the
	// database's timestamps, so a killed process's work counts).
	ProgressWindow time.Duration
	// Seed drives the kills (0: random, reported).
	Seed int64
	// Command returns the command that runs one role process with args (from RoleArgs), which
	// ends in RoleMain.
	Command func(args []string) *exec.Cmd
	// Out, when set, gets a line per kill and per phase.
	Out io.Writer
}

// WithDefaults returns o with its zero fields set.
func (o Options) WithDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.Duration, DurationDefault)
	def(&o.DrainTimeout, DrainTimeoutDefault)
	def(&o.ProduceEvery, ProduceEveryDefault)
	def(&o.HandlerHold, HandlerHoldDefault)
	def(&o.KillMin, KillMinDefault)
	def(&o.KillMax, KillMaxDefault)
	def(&o.ProgressWindow, ProgressWindowDefault)
	if o.Backlog == 0 {
		o.Backlog = BacklogDefault
	}
	if o.Workers == 0 {
		o.Workers = WorkersDefault
	}
	if o.Seed == 0 {
		o.Seed = rand.Int64N(1<<31) + 1
	}
	return o
}

// Validate reports the first invalid option, naming it.
func (o Options) Validate() error {
	switch {
	case o.Path == "":
		return errors.New("sqliteload: Options.Path is empty")
	case o.Command == nil:
		return errors.New("sqliteload: Options.Command is nil")
	case o.Duration < time.Second:
		return fmt.Errorf("sqliteload: Options.Duration is %s, want at least 1s", o.Duration)
	case o.KillMin <= 0 || o.KillMax < o.KillMin:
		return fmt.Errorf("sqliteload: Options.KillMin/KillMax are %s/%s, want 0 < min <= max", o.KillMin, o.KillMax)
	case o.Backlog < 0:
		return fmt.Errorf("sqliteload: Options.Backlog is %d, want at least 0", o.Backlog)
	case o.Workers < 1:
		return fmt.Errorf("sqliteload: Options.Workers is %d, want at least 1", o.Workers)
	}
	if _, err := os.Stat(o.Path); err == nil {
		return fmt.Errorf("sqliteload: Options.Path %s exists; the run needs a file of its own", o.Path)
	}
	return nil
}

// RoleReport is what one role did.
type RoleReport struct {
	Role string `json:"role"`
	// Total counts its units of progress in the chaos window (orders committed, rows published,
	// events applied); PerSecond splits them by second since the start.
	Total     int   `json:"total"`
	PerSecond []int `json:"per_second"`
	// SlowestSecond is the smallest of PerSecond; Floor is the least progress in any window of
	// Options.ProgressWindow (the floor the run measured).
	SlowestSecond int `json:"slowest_second"`
	Floor         int `json:"floor"`
	// Kills counts the SIGKILLs it took, Starts its processes; StartupMax is the longest time
	// a process took from its start to ready (opened and migrated the file), StartupMedian the
	// median.
	Kills         int           `json:"kills"`
	Starts        int           `json:"starts"`
	StartupMax    time.Duration `json:"startup_max_ns"`
	StartupMedian time.Duration `json:"startup_median_ns"`
	startups      []time.Duration
	// Errors counts the error lines its processes wrote; Busy those about SQLITE_BUSY.
	Errors     int      `json:"errors"`
	Busy       int      `json:"busy"`
	FirstError []string `json:"first_errors,omitempty"`
}

// Report is the verdict of a run, read from the database after the drain.
type Report struct {
	Path     string        `json:"path"`
	Seed     int64         `json:"seed"`
	Duration time.Duration `json:"duration_ns"`
	Kills    int           `json:"kills"`
	// ProgressWindow is the window of RoleReport.Floor.
	ProgressWindow time.Duration `json:"progress_window_ns"`
	Roles          []RoleReport  `json:"roles"`
	// Orders counts committed orders; Seeded the backlog; Applied the rows of the applied table.
	Orders  int `json:"orders"`
	Seeded  int `json:"seeded"`
	Applied int `json:"applied"`
	// AppliedTwice counts events applied more than once, Lost those neither applied nor still
	// pending, Pending those still in the outbox or the queue after the drain, ClaimMismatch
	// claims without their effect or effects without their claim, DeadLetters dead letters.
	AppliedTwice  int           `json:"applied_twice"`
	Lost          int           `json:"lost"`
	Pending       int           `json:"pending"`
	ClaimMismatch int           `json:"claim_mismatch"`
	DeadLetters   int           `json:"dead_letters"`
	Integrity     string        `json:"integrity_check"`
	Drained       bool          `json:"drained"`
	DrainTime     time.Duration `json:"drain_ns"`
	// Violations lists every broken guarantee; OK is true when there is none.
	Violations []string `json:"violations,omitempty"`
	OK         bool     `json:"ok"`
	// Notes are findings that break no guarantee (SQLITE_BUSY reaching a role, a role without
	// progress in a window).
	Notes []string `json:"notes,omitempty"`
}

// maxErrorLines bounds the error lines kept per role.
const maxErrorLines = 5

// roleProc is one role: its current process and what its processes reported.
type roleProc struct {
	role  string
	opts  Options
	mu    sync.Mutex
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	rep   RoleReport
	lines sync.WaitGroup
}

// start starts a process of the role.
func (p *roleProc) start() error {
	cmd := p.opts.Command(RoleArgs(p.role, p.opts.Path, p.opts))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sqliteload: start %s: %w", p.role, err)
	}
	done := make(chan struct{})
	outDone := make(chan struct{})
	p.lines.Add(1)
	go func() {
		defer close(outDone)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == readyLine {
				p.mu.Lock()
				p.rep.startups = append(p.rep.startups, time.Since(began))
				p.mu.Unlock()
			}
		}
	}()
	go func() {
		defer p.lines.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.errorLine(sc.Text())
		}
		<-outDone // Wait closes the pipes: read both to the end first
		_ = cmd.Wait()
		close(done)
	}()
	p.mu.Lock()
	p.cmd, p.stdin, p.done = cmd, stdin, done
	p.rep.Starts++
	p.mu.Unlock()
	return nil
}

func (p *roleProc) errorLine(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rep.Errors++
	if strings.Contains(line, "SQLITE_BUSY") || strings.Contains(line, "database is locked") {
		p.rep.Busy++
	}
	if len(p.rep.FirstError) < maxErrorLines {
		p.rep.FirstError = append(p.rep.FirstError, line)
	}
}

// kill SIGKILLs the current process and waits for it.
func (p *roleProc) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.rep.Kills++
	p.mu.Unlock()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// stop closes the current process's stdin (it shuts down cleanly) and waits for it, killing it
// after timeout.
func (p *roleProc) stop(timeout time.Duration) {
	p.mu.Lock()
	cmd, stdin, done := p.cmd, p.stdin, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = stdin.Close()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// Run runs the scenario: seed the file with the backlog, start producer, relay and consumer
// as processes of their own, SIGKILL a random one every KillMin–KillMax and restart it at once,
// for Duration; then stop the producer, let relay and consumer drain the outbox and the queue,
// stop them, and check from the database. An error means the run could not be made; a broken
// guarantee is in the Report.
func Run(ctx context.Context, o Options) (*Report, error) {
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) {
		if o.Out != nil {
			fmt.Fprintf(o.Out, format+"\n", args...)
		}
	}
	if err := seed(ctx, o.Path, o.Backlog); err != nil {
		return nil, err
	}
	procs := make(map[string]*roleProc, len(Roles))
	defer func() {
		for _, p := range procs {
			p.stop(5 * time.Second)
		}
	}()
	start := time.Now()
	for _, role := range Roles {
		p := &roleProc{role: role, opts: o, rep: RoleReport{Role: role}}
		if err := p.start(); err != nil {
			return nil, err
		}
		procs[role] = p
	}
	logf("sqlite chaos: %s, seed %d, %d jobs queued, producer every %s, consumer %d workers holding %s, running %s",
		o.Path, o.Seed, o.Backlog, o.ProduceEvery, o.Workers, o.HandlerHold, o.Duration)

	rng := rand.New(rand.NewPCG(uint64(o.Seed), 0))
	end := start.Add(o.Duration)
	kills := 0
	for {
		wait := o.KillMin + time.Duration(rng.Int64N(int64(o.KillMax-o.KillMin)+1))
		if o.NoKills || time.Now().Add(wait).After(end) {
			wait = time.Until(end)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		if !time.Now().Before(end) {
			break
		}
		p := procs[Roles[rng.IntN(len(Roles))]]
		p.kill()
		kills++
		if err := p.start(); err != nil {
			return nil, err
		}
		logf("%6.1fs  killed and restarted %s", time.Since(start).Seconds(), p.role)
	}

	// Drain: no new orders; relay and consumer run until nothing is pending.
	procs[RoleProducer].stop(10 * time.Second)
	drainStart := time.Now()
	db, err := idemsqlite.Open(o.Path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	drained := false
	for time.Since(drainStart) < o.DrainTimeout {
		n, err := pending(ctx, db)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			drained = true
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	drainTime := time.Since(drainStart)
	logf("drain: %s (%s)", map[bool]string{true: "done", false: "TIMED OUT"}[drained], drainTime.Round(time.Millisecond))
	for _, role := range Roles[1:] {
		procs[role].stop(10 * time.Second)
	}
	for _, p := range procs {
		p.lines.Wait()
	}

	rep := &Report{Path: o.Path, Seed: o.Seed, Duration: o.Duration, Kills: kills, ProgressWindow: o.ProgressWindow,
		Drained: drained, DrainTime: drainTime}
	if err := check(ctx, db, rep, start, o); err != nil {
		return nil, err
	}
	for _, role := range Roles {
		r := procs[role].rep
		if n := len(r.startups); n > 0 {
			slices.Sort(r.startups)
			r.StartupMax, r.StartupMedian = r.startups[n-1], r.startups[n/2]
		}
		if err := progress(ctx, db, &r, start, o); err != nil {
			return nil, err
		}
		rep.Roles = append(rep.Roles, r)
		if r.Busy > 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: SQLITE_BUSY reached it %d times", role, r.Busy))
		}
		if r.Floor == 0 {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: no progress in some %s window: %v", role, o.ProgressWindow, r.PerSecond))
		}
	}
	rep.OK = len(rep.Violations) == 0
	return rep, nil
}

// seed creates the schema, the business tables and the backlog.
func seed(ctx context.Context, path string, backlog int) error {
	db, store, err := openMigrated(ctx, path)
	if err != nil {
		return err
	}
	defer db.Close()
	defer store.Close()
	if _, err := db.ExecContext(ctx, `
		CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL);
		CREATE TABLE applied (id INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL, at INTEGER NOT NULL);
		CREATE TABLE seeded (event_id TEXT PRIMARY KEY);`); err != nil {
		return fmt.Errorf("sqliteload: business tables: %w", err)
	}
	msgs := make([]idem.Message, backlog)
	for i := range msgs {
		msgs[i] = idem.Message{EventID: "seed-" + strconv.Itoa(i), Type: "order.placed", Payload: []byte(`{}`)}
	}
	err = store.InTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		for _, m := range msgs {
			if _, err := tx.ExecContext(ctx, `INSERT INTO seeded (event_id) VALUES (?)`, m.EventID); err != nil {
				return err
			}
		}
		return store.QueuePublishTx(ctx, tx, Topic, msgs...)
	})
	if err != nil {
		return fmt.Errorf("sqliteload: backlog: %w", err)
	}
	return nil
}

// pending counts the outbox rows not yet published and the jobs still queued.
func pending(ctx context.Context, db *sql.DB) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM idem_outbox WHERE published_at IS NULL)
		+ (SELECT count(*) FROM idem_queue)`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("sqliteload: pending: %w", err)
	}
	return n, nil
}

// check reads the verdict from the database into rep. The queries, to rerun by hand on the file
// a run leaves behind, are in verdictQueries.
func check(ctx context.Context, db *sql.DB, rep *Report, start time.Time, o Options) error {
	// Indexes for the checks (each probes the queue and the applied table by event id).
	if _, err := db.ExecContext(ctx, `CREATE INDEX IF NOT EXISTS check_queue_event ON idem_queue (event_id);
		CREATE INDEX IF NOT EXISTS check_applied_event ON applied (event_id)`); err != nil {
		return fmt.Errorf("sqliteload: check indexes: %w", err)
	}
	if err := db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&rep.Integrity); err != nil {
		return fmt.Errorf("sqliteload: integrity_check: %w", err)
	}
	for _, q := range verdictQueries {
		if err := db.QueryRowContext(ctx, q.query).Scan(q.dst(rep)); err != nil {
			return fmt.Errorf("sqliteload: %s: %w", q.name, err)
		}
	}
	if rep.Integrity != "ok" {
		rep.Violations = append(rep.Violations, "integrity_check: "+rep.Integrity)
	}
	for _, v := range []struct {
		n    int
		what string
	}{
		{rep.AppliedTwice, "events applied twice"},
		{rep.Lost, "events lost (neither applied nor pending)"},
		{rep.Pending, "events still pending after the drain"},
		{rep.ClaimMismatch, "claims without their effect or effects without their claim"},
		{rep.DeadLetters, "dead letters (no handler fails)"},
	} {
		if v.n > 0 {
			rep.Violations = append(rep.Violations, fmt.Sprintf("%d %s", v.n, v.what))
		}
	}
	return nil
}

// verdictQueries are the counts check reads, each into its field of Report.
var verdictQueries = []struct {
	name, query string
	dst         func(*Report) *int
}{
	{"orders", `SELECT count(*) FROM orders`, func(r *Report) *int { return &r.Orders }},
	{"seeded", `SELECT count(*) FROM seeded`, func(r *Report) *int { return &r.Seeded }},
	{"applied", `SELECT count(*) FROM applied`, func(r *Report) *int { return &r.Applied }},
	{"applied twice", `SELECT count(*) FROM (SELECT event_id FROM applied GROUP BY event_id HAVING count(*) > 1)`,
		func(r *Report) *int { return &r.AppliedTwice }},
	// Every order's event and every backlog job is applied, or still in the outbox or the queue.
	{"lost", `SELECT
		(SELECT count(*) FROM orders o WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.event_id = 'order-' || o.id)
			AND NOT EXISTS (SELECT 1 FROM idem_queue q WHERE q.event_id = 'order-' || o.id)
			AND NOT EXISTS (SELECT 1 FROM idem_outbox b WHERE b.event_id = 'order-' || o.id AND b.published_at IS NULL))
		+ (SELECT count(*) FROM seeded s WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.event_id = s.event_id)
			AND NOT EXISTS (SELECT 1 FROM idem_queue q WHERE q.event_id = s.event_id))`,
		func(r *Report) *int { return &r.Lost }},
	{"pending", `SELECT (SELECT count(*) FROM idem_outbox WHERE published_at IS NULL) + (SELECT count(*) FROM idem_queue)`,
		func(r *Report) *int { return &r.Pending }},
	{"claim mismatch", `SELECT abs((SELECT count(DISTINCT event_id) FROM applied)
		- (SELECT count(*) FROM idem_claims WHERE consumer = '` + ConsumerName + `'))`,
		func(r *Report) *int { return &r.ClaimMismatch }},
	{"dead letters", `SELECT count(*) FROM idem_dead_letters`, func(r *Report) *int { return &r.DeadLetters }},
}

// progressQueries give each role's progress as unix microsecond timestamps.
var progressQueries = map[string]string{
	RoleProducer: `SELECT at FROM orders WHERE at >= ?1 AND at < ?2`,
	RoleRelay:    `SELECT published_at FROM idem_outbox WHERE published_at >= ?1 AND published_at < ?2`,
	RoleConsumer: `SELECT at FROM applied WHERE at >= ?1 AND at < ?2`,
}

// progress fills r's per-second progress in the chaos window from the database's timestamps.
func progress(ctx context.Context, db *sql.DB, r *RoleReport, start time.Time, o Options) error {
	secs := int(o.Duration / time.Second)
	r.PerSecond = make([]int, secs)
	rows, err := db.QueryContext(ctx, progressQueries[r.Role], start.UnixMicro(), start.Add(time.Duration(secs)*time.Second).UnixMicro())
	if err != nil {
		return fmt.Errorf("sqliteload: progress of %s: %w", r.Role, err)
	}
	defer rows.Close()
	for rows.Next() {
		var at int64
		if err := rows.Scan(&at); err != nil {
			return err
		}
		if s := int(time.UnixMicro(at).Sub(start) / time.Second); s >= 0 && s < secs {
			r.PerSecond[s]++
			r.Total++
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	r.SlowestSecond, r.Floor = -1, -1
	w := max(int(o.ProgressWindow/time.Second), 1)
	for s, n := range r.PerSecond {
		if r.SlowestSecond < 0 || n < r.SlowestSecond {
			r.SlowestSecond = n
		}
		if s+w <= len(r.PerSecond) {
			sum := 0
			for _, m := range r.PerSecond[s : s+w] {
				sum += m
			}
			if r.Floor < 0 || sum < r.Floor {
				r.Floor = sum
			}
		}
	}
	r.SlowestSecond, r.Floor = max(r.SlowestSecond, 0), max(r.Floor, 0)
	return nil
}

// WriteTable writes r as aligned lines ending with "verdict: ok" or "verdict: FAILED" and the
// violations.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("file", "%s (seed %d)", r.Path, r.Seed)
	row("chaos", "%s, %d SIGKILLs, drain %s (%s)", r.Duration, r.Kills, r.DrainTime.Round(time.Millisecond), map[bool]string{true: "done", false: "timed out"}[r.Drained])
	for _, p := range r.Roles {
		row(p.Role, "%d in %s (%.0f/s), slowest second %d, least in any %s %d; %d kills, %d starts (start to ready: median %s, max %s); %d errors (%d SQLITE_BUSY)",
			p.Total, r.Duration, float64(p.Total)/r.Duration.Seconds(), p.SlowestSecond, r.ProgressWindow, p.Floor,
			p.Kills, p.Starts, p.StartupMedian.Round(time.Millisecond), p.StartupMax.Round(time.Millisecond), p.Errors, p.Busy)
	}
	for _, p := range r.Roles {
		for _, e := range p.FirstError {
			row(p.Role+" error", "%s", e)
		}
	}
	row("events", "%d orders + %d backlog, %d applied", r.Orders, r.Seeded, r.Applied)
	row("applied twice", "%d", r.AppliedTwice)
	row("lost", "%d", r.Lost)
	row("pending", "%d", r.Pending)
	row("claim mismatch", "%d", r.ClaimMismatch)
	row("dead letters", "%d", r.DeadLetters)
	row("integrity_check", "%s", r.Integrity)
	if err := tw.Flush(); err != nil {
		return err
	}
	return payments.WriteVerdict(w, r.Notes, r.OK, r.Violations)
}
