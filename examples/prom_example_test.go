package examples_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemprom"
	"github.com/idemkit/idem/idemsqlite"
)

// ExampleNew registers the consumer metrics on the application's own registry (never the
// global one) and serves them with promhttp.
func Example_metrics() {
	reg := prometheus.NewRegistry()
	metrics := idemprom.New(idemprom.Config{})
	reg.MustRegister(metrics)

	// In a real program the consumer calls the observer: idem.Config{Observer: metrics, …}.
	// Here two settled deliveries stand in for it.
	var _ idem.Observer = metrics
	// Owner (ConsumerConfig.Owner) is the label alerts route on.
	metrics.Observe(idem.Observation{Consumer: "ledger@v1", Owner: "payments", Queue: "orders", EventID: "evt-1",
		Outcome: idem.OutcomeProcessed, Duration: 4 * time.Millisecond})
	metrics.Observe(idem.Observation{Consumer: "ledger@v1", Owner: "payments", Queue: "orders", EventID: "evt-1",
		Outcome: idem.OutcomeDuplicate, Duration: time.Millisecond})

	mux := http.NewServeMux()
	// ContinueOnError serves every healthy figure even when one store query fails.
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	// http.ListenAndServe(":9090", mux) in a real program; a recorder shows the page here.
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	printLines(rec.Body.String(), `idem_messages_total{consumer="ledger@v1",outcome="processed"`,
		`idem_messages_total{consumer="ledger@v1",outcome="duplicate"`, "idem_duplicates_ignored_total{")
	// Output:
	// idem_duplicates_ignored_total{consumer="ledger@v1",owner="payments",queue="orders"} 1
	// idem_messages_total{consumer="ledger@v1",outcome="duplicate",owner="payments",queue="orders"} 1
	// idem_messages_total{consumer="ledger@v1",outcome="processed",owner="payments",queue="orders"} 1
}

// ExampleNewStoreCollector reads the backlog of a SQLite store on every scrape.
func Example_storeCollector() {
	ctx := context.Background()
	db, err := idemsqlite.Open(":memory:")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := store.QueuePublish(ctx, "orders", idem.Message{EventID: "evt-1", Payload: []byte(`{}`)}); err != nil {
		log.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(idemprom.NewStoreCollector(idemprom.StoreCollectorConfig{
		DeadLetters: store,
		Queue:       store,
		Queues:      []string{"orders"},
		Outbox:      store,
	}))

	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	printLines(rec.Body.String(), "idem_queue_backlog{", "idem_outbox_backlog ", "idem_dead_letters_oldest_age_seconds ")
	// Output:
	// idem_dead_letters_oldest_age_seconds 0
	// idem_outbox_backlog 0
	// idem_queue_backlog{queue="orders"} 1
}

// printLines prints the lines of page that start with one of prefixes.
func printLines(page string, prefixes ...string) {
	sc := bufio.NewScanner(strings.NewReader(page))
	for sc.Scan() {
		for _, p := range prefixes {
			if strings.HasPrefix(sc.Text(), p) {
				fmt.Println(sc.Text())
				break
			}
		}
	}
}
