package cli

import (
	"encoding/json"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestVersion(t *testing.T) {
	t.Parallel()
	r := idemCLI(t, "version")
	requireOK(t, r)
	require.True(t, strings.HasPrefix(r.stdout, "idem "), "stdout: %q", r.stdout)
	require.Contains(t, r.stdout, runtime.Version())

	r = idemCLI(t, "version", "--json")
	requireOK(t, r)
	var v buildVersion
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
	require.NotEmpty(t, v.Version)
	require.Equal(t, runtime.Version(), v.Go)

	requireOneLineError(t, idemCLI(t, "version", "extra"), ExitUsage, "extra")
}

// TestJSONLogDurationsAreReadable: a JSON log line says "1.5s", not 1500000000.
func TestJSONLogDurationsAreReadable(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	logger, err := newLogger(&b, "json", "info")
	require.NoError(t, err)
	logger.Info("published", slog.Duration("lag", 1500*time.Millisecond))
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(b.String()), &line))
	require.Equal(t, "1.5s", line["lag"])
}
