// Package idemprom exposes idem's behaviour as Prometheus metrics.
//
// Two collectors cover DESIGN step 12 ("everything is observable"):
//
//   - Metrics counts what happens: it is the consumer's idem.Observer (one Event per settled
//     delivery, plus pauses and failed dead-letter writes, which count in
//     idem_dead_letter_write_failures_total: alert on any increase) and the outbox relay's hooks
//     (Published, PublishFailed).
//   - NewStoreCollector reads what is waiting: dead letters, queue-table backlog and outbox
//     backlog, with the age of the oldest item, queried from the store on every scrape.
//
// Neither registers itself anywhere: the application registers them on its own
// prometheus.Registry (never prometheus.DefaultRegisterer from inside a library), so two
// consumers in one process or two tests in one binary never clash.
//
// # Cardinality
//
// Every label value comes from a bounded set: consumer and queue names (from configuration),
// outcome, class and reason (closed enums in package idem), dead ("true"/"false") and outbox
// topic. Event ids, message ids, tenants and error text never become label values, because each
// distinct value is a new time series that lives in Prometheus's memory for hours; those belong
// in logs (idem logs them with stable slog fields) and in the dead-letter queue. Keep consumer,
// queue and topic names bounded too: a topic per tenant would defeat this.
//
// One label comes from handler code: the reason of idem.Ignore, in idem_ignored_total. idem
// bounds its length (idem.MaxIgnoreReasonBytes) but not its number of values, so give Ignore a
// small fixed set of reasons ("order_deleted", "account_closed"), never an id, a tenant or an
// error text: put those in a log line.
package idemprom
