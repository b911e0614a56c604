package idemprom

import (
	"context"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/idemkey"
)

// KeyMetrics turns the Idempotency-Key middleware's observations into Prometheus metrics:
// requests by route and outcome (processed, replayed, in_flight, mismatch, refused,
// rolled_back, unavailable) and their duration. Set its Observe as idemkey.Config.Observe and
// register it on your registry; one KeyMetrics may serve every middleware of a process.
type KeyMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

var _ prometheus.Collector = (*KeyMetrics)(nil)

// NewKeyMetrics returns KeyMetrics under cfg's Namespace, with cfg's Buckets for the duration
// (the same defaults as New). It panics on an invalid cfg, as New does.
func NewKeyMetrics(cfg Config) *KeyMetrics {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		panic(err)
	}
	return &KeyMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: cfg.Namespace, Name: "http_key_requests_total",
			Help: "Requests that needed an Idempotency-Key, by route, outcome and status. A rising share of replayed or in_flight means clients retry faster than requests complete."},
			[]string{"route", "outcome", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: cfg.Namespace, Name: "http_key_request_seconds",
			Help: "Time from the middleware's first look at a request that needed a key to its answer, by route and outcome.", Buckets: cfg.Buckets},
			[]string{"route", "outcome"}),
	}
}

// Observe records one observation; use it as idemkey.Config.Observe. The route label is the
// middleware's route: a pattern when the middleware sits behind a router that sets r.Pattern or
// Config.Route returns one (with the escaped-path fallback every id would be a series). A
// refusal before the route was known is recorded under route "".
func (k *KeyMetrics) Observe(_ context.Context, o idemkey.Observation) {
	status := "aborted" // a handler's panic: net/http cut the connection
	if o.Status != 0 {
		status = strconv.Itoa(o.Status)
	}
	k.requests.WithLabelValues(o.Route, string(o.Outcome), status).Inc()
	k.duration.WithLabelValues(o.Route, string(o.Outcome)).Observe(seconds(o.Duration))
}

// Describe sends the descriptors of both metrics, for registration.
func (k *KeyMetrics) Describe(ch chan<- *prometheus.Desc) {
	k.requests.Describe(ch)
	k.duration.Describe(ch)
}

// Collect sends the current value of every series, on scrape.
func (k *KeyMetrics) Collect(ch chan<- prometheus.Metric) {
	k.requests.Collect(ch)
	k.duration.Collect(ch)
}
