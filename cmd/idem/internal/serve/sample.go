package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/inspect"
)

// scrapeMax bounds the body read from one metrics endpoint.
const scrapeMax = 8 << 20

// sample is one point of the charts: backlogs from the store and the consumers' counters from
// their metrics endpoints.
type sample struct {
	At           time.Time
	Queues       map[string]int64
	Outbox       int64
	DeadLetters  int64
	Consumers    map[string]consumerMetrics
	ScrapeErrors []string
}

// consumerMetrics is one consumer's idemprom counters, summed over queues and endpoints.
type consumerMetrics struct {
	Processed  float64
	Retries    float64
	Duplicates float64
	// Errors counts deliveries that did not end processed or duplicate, by error class.
	Errors map[string]float64
	Paused bool
	// Owner is the team the consumer's metrics name (ConsumerConfig.Owner), "" when none.
	Owner string
}

// errorsTotal sums Errors.
func (c consumerMetrics) errorsTotal() float64 {
	var n float64
	for _, v := range c.Errors {
		n += v
	}
	return n
}

// Sample takes one point for the charts now: Run calls it on its ticker; tests call it directly.
func (s *Server) Sample(ctx context.Context) error {
	st := s.cfg.Stores
	sm := sample{At: s.cfg.Now().UTC(), Queues: map[string]int64{}, Consumers: map[string]consumerMetrics{}}
	stats, err := st.DeadLetters.DeadLetterStats(ctx)
	if err != nil {
		return fmt.Errorf("dead-letter stats: %w", err)
	}
	sm.DeadLetters = stats.Pending
	queues, err := s.queues(ctx)
	if err != nil {
		return err
	}
	for _, q := range queues {
		qs, err := st.Queue.QueueStats(ctx, q)
		if err != nil {
			return fmt.Errorf("stats of queue %s: %w", q, err)
		}
		sm.Queues[q] = qs.Backlog
	}
	ob, err := st.Outbox.OutboxStats(ctx)
	if err != nil {
		return fmt.Errorf("outbox stats: %w", err)
	}
	sm.Outbox = ob.Backlog
	for _, u := range s.cfg.MetricsURLs {
		if err := s.scrape(ctx, u, sm.Consumers); err != nil {
			sm.ScrapeErrors = append(sm.ScrapeErrors, err.Error())
		}
	}
	s.mu.Lock()
	s.history = append(s.history, sm)
	if len(s.history) > historyLen {
		s.history = slices.Delete(s.history, 0, len(s.history)-historyLen)
	}
	s.mu.Unlock()
	return nil
}

// queues returns the configured queues, or the queues pending dead letters came from.
func (s *Server) queues(ctx context.Context) ([]string, error) {
	if len(s.cfg.Queues) > 0 {
		return s.cfg.Queues, nil
	}
	sources, err := inspect.PendingSources(ctx, s.cfg.Stores)
	if err != nil {
		return nil, fmt.Errorf("sources of pending dead letters: %w", err)
	}
	var queues []string
	for _, src := range sources {
		if q, ok := strings.CutPrefix(src, "queue:"); ok && q != "" {
			queues = append(queues, q)
		}
	}
	return queues, nil
}

// snapshot returns a copy of the samples, oldest first.
func (s *Server) snapshot() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.history)
}

// scrape reads one idemprom endpoint and adds its consumers' counters to into.
func (s *Server) scrape(ctx context.Context, u string, into map[string]consumerMetrics) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("metrics %s: %w", u, err)
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("metrics %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("metrics %s: HTTP %s", u, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, scrapeMax))
	if err != nil {
		return fmt.Errorf("metrics %s: %w", u, err)
	}
	addConsumerMetrics(fams, into)
	return nil
}

// addConsumerMetrics adds idemprom's per-consumer series in fams to into.
func addConsumerMetrics(fams map[string]*dto.MetricFamily, into map[string]consumerMetrics) {
	each := func(name string, fn func(c *consumerMetrics, labels map[string]string, v float64)) {
		f := fams[name]
		if f == nil {
			return
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			name := labels["consumer"]
			if name == "" {
				continue
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
			c := into[name]
			if c.Errors == nil {
				c.Errors = map[string]float64{}
			}
			if o := labels["owner"]; o != "" {
				c.Owner = o
			}
			fn(&c, labels, v)
			into[name] = c
		}
	}
	each("idem_messages_total", func(c *consumerMetrics, l map[string]string, v float64) {
		if l["outcome"] == string(idem.OutcomeProcessed) {
			c.Processed += v
		}
	})
	each("idem_errors_total", func(c *consumerMetrics, l map[string]string, v float64) { c.Errors[l["class"]] += v })
	each("idem_retries_total", func(c *consumerMetrics, _ map[string]string, v float64) { c.Retries += v })
	each("idem_duplicates_ignored_total", func(c *consumerMetrics, _ map[string]string, v float64) { c.Duplicates += v })
	each("idem_consumer_paused", func(c *consumerMetrics, _ map[string]string, v float64) { c.Paused = c.Paused || v > 0 })
}
