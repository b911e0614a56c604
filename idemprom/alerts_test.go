package idemprom

import (
	"os"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestShippedAlertsUseExportedMetrics keeps ops/prometheus/alerts.yml in step with the metrics
// this package exports: an alert on a renamed or missing metric would never fire.
func TestShippedAlertsUseExportedMetrics(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile("../ops/prometheus/alerts.yml")
	require.NoError(t, err)

	exported := map[string]bool{}
	descs := make(chan *prometheus.Desc, 256)
	New(Config{}).Describe(descs)
	NewStoreCollector(StoreCollectorConfig{DeadLetters: &fakeDeadLetters{}, Outbox: &fakeOutbox{},
		Queue: &fakeQueue{}, Queues: []string{"q"}}).Describe(descs)
	close(descs)
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range descs {
		m := fq.FindStringSubmatch(d.String())
		require.NotNil(t, m, "descriptor %s", d)
		exported[m[1]] = true
	}

	used := regexp.MustCompile(`\bidem_[a-z_]+`).FindAllString(string(rules), -1)
	require.NotEmpty(t, used)
	for _, name := range used {
		require.True(t, exported[name], "alerts.yml uses %s, which idemprom does not export", name)
	}
}
