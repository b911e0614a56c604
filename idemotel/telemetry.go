package idemotel

import (
	"errors"
	"fmt"
	"math"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemredact"
	"github.com/idemkit/idem/idemrelay"
)

// ScopeName is the instrumentation scope of idemotel's tracer and meter.
const ScopeName = "github.com/idemkit/idem/idemotel"

// NamespaceDefault prefixes every metric name unless Config.Namespace says otherwise; it is
// idemprom's, so dashboards and alerts work with either.
const NamespaceDefault = "idem"

// BucketsDefault returns the default bucket bounds of idem_handling_seconds, in seconds:
// idemprom's (0.5ms doubling up to about 16s).
func BucketsDefault() []float64 { return exponential(0.0005, 2, 16) }

// RecoveryBucketsDefault returns the default bucket bounds of idem_recovery_seconds, in
// seconds: idemprom's (a minute to a week).
func RecoveryBucketsDefault() []float64 {
	const minute, hour, day = 60, 3600, 86400
	return []float64{
		minute, 5 * minute, 15 * minute, 30 * minute,
		hour, 2 * hour, 4 * hour, 8 * hour, 12 * hour,
		day, 2 * day, 4 * day, 7 * day,
	}
}

// LagBucketsDefault returns the default bucket bounds of idem_outbox_publish_lag_seconds, in
// seconds: idemprom's (1ms growing by four up to about 70 minutes).
func LagBucketsDefault() []float64 { return exponential(0.001, 4, 12) }

func exponential(start, factor float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = start * math.Pow(factor, float64(i))
	}
	return b
}

// Config configures a Telemetry. Zero fields take the documented defaults (see WithDefaults).
type Config struct {
	// TracerProvider creates idemotel's tracer (default otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
	// MeterProvider creates idemotel's meter (default otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider
	// Propagator writes and reads the trace context in message headers (default W3C Trace
	// Context: traceparent and tracestate). The global propagator is not the default: it is a
	// no-op until the application sets one, and a trace that silently stops at the outbox is
	// worse than one in a known format.
	Propagator propagation.TextMapPropagator
	// RecordIdentities adds each event's id and tenant (in their bounded form, idem.BoundID) to
	// its spans as messaging.message.id and idem.tenant. Off by default: they may be personal
	// data, and a tracing backend is not always held to the same rules as the database. They
	// never become metric attributes.
	RecordIdentities bool
	// Redact masks secrets in the error text spans record (idem's defaults when zero).
	Redact idemredact.Config
	// Namespace prefixes every metric name (default NamespaceDefault, giving "idem_…").
	Namespace string
	// Buckets, RecoveryBuckets and LagBuckets are the bucket bounds, in seconds, of
	// idem_handling_seconds, idem_recovery_seconds and idem_outbox_publish_lag_seconds
	// (defaults BucketsDefault, RecoveryBucketsDefault, LagBucketsDefault).
	Buckets, RecoveryBuckets, LagBuckets []float64
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	if c.Namespace == "" {
		c.Namespace = NamespaceDefault
	}
	if len(c.Buckets) == 0 {
		c.Buckets = BucketsDefault()
	}
	if len(c.RecoveryBuckets) == 0 {
		c.RecoveryBuckets = RecoveryBucketsDefault()
	}
	if len(c.LagBuckets) == 0 {
		c.LagBuckets = LagBucketsDefault()
	}
	return c
}

// validate reports the invalid fields of a defaulted Config, naming each.
func (c Config) validate() error {
	var errs []error
	for i, r := range c.Namespace {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			errs = append(errs, fmt.Errorf("Namespace %q: want [a-zA-Z_][a-zA-Z0-9_]*", c.Namespace))
			break
		}
	}
	for _, f := range []struct {
		name string
		b    []float64
	}{{"Buckets", c.Buckets}, {"RecoveryBuckets", c.RecoveryBuckets}, {"LagBuckets", c.LagBuckets}} {
		for i, v := range f.b {
			if math.IsNaN(v) || i > 0 && v <= f.b[i-1] {
				errs = append(errs, fmt.Errorf("%s: want strictly increasing numbers, got %v", f.name, f.b))
				break
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("idemotel: config: %w", errors.Join(errs...))
	}
	return nil
}

// Telemetry traces and measures idem with OpenTelemetry. It is the consumer's idem.Tracer and
// idem.Observer, the relay's idemrelay.Observer, and wraps the producer's outbox (Outbox) and
// the relay's sink (Sink). One Telemetry may serve every consumer, relay and producer of a
// process; it is safe for concurrent use.
type Telemetry struct {
	cfg        Config
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	redactor   *idemredact.Redactor
	metrics    *instruments
	meter      metric.Meter
}

var (
	_ idem.Tracer        = (*Telemetry)(nil)
	_ idem.Observer      = (*Telemetry)(nil)
	_ idem.OwnerObserver = (*Telemetry)(nil)
	_ idemrelay.Observer = (*Telemetry)(nil)
)

// New returns a Telemetry for cfg (after WithDefaults), or an error naming the invalid field or
// the instrument the meter refused.
func New(cfg Config) (*Telemetry, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	meter := cfg.MeterProvider.Meter(ScopeName)
	m, err := newInstruments(meter, cfg)
	if err != nil {
		return nil, err
	}
	return &Telemetry{
		cfg:        cfg,
		tracer:     cfg.TracerProvider.Tracer(ScopeName),
		propagator: cfg.Propagator,
		redactor:   idemredact.New(cfg.Redact),
		metrics:    m,
		meter:      meter,
	}, nil
}
