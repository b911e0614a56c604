// Package serve is the dashboard of idem serve: server-rendered pages over a store (consumers,
// queues, the outbox, dead letters and the audit trail) and the dead-letter actions (replay and
// discard), guarded by a token or a reverse proxy's authenticated header, CSRF checks on every
// POST, and an optional read-only mode. Templates and CSS are embedded; there is no JavaScript.
package serve

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/connect"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemredact"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Defaults of Config.
const (
	// SampleIntervalDefault is how often the dashboard samples backlogs and scrapes metrics.
	SampleIntervalDefault = 15 * time.Second
	// historyLen is how many samples the charts keep (an hour at the default interval).
	historyLen = 240
	// listLimitDefault bounds the dead-letter list unless the page asks for fewer.
	listLimitDefault = 100
	// listLimitMax bounds what a page may ask for.
	listLimitMax = 1000
	// batchMax bounds the dead letters one replay or discard from the page touches.
	batchMax = 100
	// payloadShowMax bounds the payload the detail page shows.
	payloadShowMax = 64 << 10
	// recoveryWindow is how many of the latest recoveries the median and longest are taken over.
	recoveryWindow = 10000
)

// Config configures a Server. Stores is required; everything else has a default.
type Config struct {
	Stores *connect.Stores
	// Replayer replays and discards dead letters; nil means only discard is possible (a
	// Replayer without a sink refuses replay).
	Replayer *idemdlq.Replayer
	// Topic is where replays go; empty means the queue each dead letter came from.
	Topic string
	// ArrivalTopic, with an empty Topic, sends each replay to the subject its dead letter
	// arrived on (NATS records it) instead of the queue it came from.
	ArrivalTopic bool
	// Token enables actions for a browser that logs in with it (or sends it as a bearer token).
	Token string
	// TrustHeader names a request header set by an authenticating reverse proxy to the user's
	// name; a request carrying it may act, as that user. The proxy must strip the header from
	// client requests.
	TrustHeader string
	// ReadOnly refuses every action, whatever Token and TrustHeader say.
	ReadOnly bool
	// MetricsURLs are consumers' Prometheus endpoints (idemprom metrics) to scrape for errors by
	// class, retries, duplicates and the paused state.
	MetricsURLs []string
	// Queues are the queue-table queues to chart; default: the queues pending dead letters came
	// from.
	Queues []string
	// SampleInterval is how often Run samples (default SampleIntervalDefault).
	SampleInterval time.Duration
	// Client scrapes MetricsURLs (default a client with a 5 s timeout).
	Client *http.Client
	// Now returns the current time (default time.Now).
	Now func() time.Time
	// Logger receives errors of the sampler (default: discarded).
	Logger *slog.Logger
}

// Server serves the dashboard. Create it with New, serve Handler, and call Run for the charts.
type Server struct {
	cfg      Config
	pages    map[string]*template.Template
	key      []byte // signs sessions and CSRF tokens; new at every start
	redactor *idemredact.Redactor

	mu      sync.Mutex
	history []sample
}

// New checks cfg and builds a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Stores == nil {
		return nil, errors.New("serve: Config.Stores is nil")
	}
	if cfg.SampleInterval <= 0 {
		cfg.SampleInterval = SampleIntervalDefault
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 5 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.TrustHeader = strings.TrimSpace(cfg.TrustHeader)
	s := &Server{cfg: cfg, pages: map[string]*template.Template{}, key: make([]byte, 32),
		redactor: idemredact.New(idemredact.Config{})}
	if _, err := rand.Read(s.key); err != nil {
		return nil, fmt.Errorf("serve: session key: %w", err)
	}
	for _, page := range []string{"consumers", "deadletters", "deadletter", "confirm", "audit", "login", "message"} {
		t, err := template.New("layout.html").Funcs(s.funcs()).ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("serve: template %s: %w", page, err)
		}
		s.pages[page] = t
	}
	return s, nil
}

// Handler returns the dashboard's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", s.consumersPage)
	mux.HandleFunc("GET /deadletters", s.deadLettersPage)
	mux.HandleFunc("GET /deadletters/{id}", s.deadLetterPage)
	mux.HandleFunc("GET /audit", s.auditPage)
	mux.HandleFunc("GET /login", s.loginPage)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.logout)
	mux.HandleFunc("POST /deadletters/replay", s.action(actReplay))
	mux.HandleFunc("POST /deadletters/discard", s.action(actDiscard))
	return s.secure(mux)
}

// secure sets the headers every page gets: no framing, no inline scripts, no sniffing, and the
// CSRF cookie when the browser has none yet.
func (s *Server) secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// Run samples backlogs and metrics every SampleInterval until ctx ends, for the charts.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.SampleInterval)
	defer t.Stop()
	for {
		if err := s.Sample(ctx); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("idem serve: sample failed", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
