package idemnats

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSourceConfigValidate(t *testing.T) {
	t.Parallel()
	valid := SourceConfig{Stream: "S", Durable: "d"}
	tests := []struct {
		name    string
		mutate  func(*SourceConfig)
		wantErr []string
	}{
		{name: "defaults are valid", mutate: func(*SourceConfig) {}},
		{name: "unlimited deliveries", mutate: func(c *SourceConfig) { c.MaxDeliver = -1 }},
		{name: "missing stream", mutate: func(c *SourceConfig) { c.Stream = "" }, wantErr: []string{"Stream is empty"}},
		{name: "missing durable", mutate: func(c *SourceConfig) { c.Durable = "" }, wantErr: []string{"Durable is empty"}},
		{name: "negative ack wait", mutate: func(c *SourceConfig) { c.AckWait = -time.Second }, wantErr: []string{"AckWait is -1s"}},
		{name: "one delivery leaves no retry", mutate: func(c *SourceConfig) { c.MaxDeliver = 1 }, wantErr: []string{"MaxDeliver is 1, want -1 (unlimited) or at least 13"}},
		// A limit that leaves no room for deliveries without a verdict: the broker would drop
		// an event the policy still wants to retry.
		{name: "no room for give-backs", mutate: func(c *SourceConfig) { c.MaxDeliver = 12 }, wantErr: []string{"MaxDeliver is 12", "8 attempts"}},
		{name: "bounded above the policy", mutate: func(c *SourceConfig) { c.MaxDeliver = 13 }},
		{name: "bounded for a longer policy", mutate: func(c *SourceConfig) { c.MaxDeliver = 35; c.Retry.MaxAttempts = 30 }},
		{name: "bounded below a longer policy", mutate: func(c *SourceConfig) { c.MaxDeliver = 34; c.Retry.MaxAttempts = 30 },
			wantErr: []string{"MaxDeliver is 34, want -1 (unlimited) or at least 35"}},
		{name: "unlimited with any policy", mutate: func(c *SourceConfig) { c.MaxDeliver = -1; c.Retry.MaxAttempts = 1000 }},
		{name: "invalid policy", mutate: func(c *SourceConfig) { c.Retry.MaxAttempts = -1 }, wantErr: []string{"Retry: retry: MaxAttempts (-1) is negative"}},
		{name: "max deliver below -1", mutate: func(c *SourceConfig) { c.MaxDeliver = -2 }, wantErr: []string{"MaxDeliver is -2"}},
		{name: "max wait too short", mutate: func(c *SourceConfig) { c.MaxWait = time.Millisecond }, wantErr: []string{"MaxWait is 1ms"}},
		{
			name:    "every problem is reported",
			mutate:  func(c *SourceConfig) { *c = SourceConfig{AckWait: -1, MaxWait: -1} },
			wantErr: []string{"Stream is empty", "Durable is empty", "AckWait", "MaxWait"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := valid
			tt.mutate(&cfg)
			err := cfg.WithDefaults().validate()
			if len(tt.wantErr) == 0 {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, "idemnats: invalid SourceConfig")
			for _, want := range tt.wantErr {
				require.ErrorContains(t, err, want)
			}
		})
	}
}

func TestSourceConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg := SourceConfig{Stream: "S", Durable: "d"}.WithDefaults()
	require.Equal(t, AckWaitDefault, cfg.AckWait)
	require.Equal(t, MaxDeliverDefault, cfg.MaxDeliver)
	require.Equal(t, -1, cfg.MaxDeliver, "unlimited: the retry policy, not the broker, ends retries")
	require.Equal(t, MaxWaitDefault, cfg.MaxWait)
}

func TestNewSourceRefusesInvalidConfigBeforeCallingTheServer(t *testing.T) {
	t.Parallel()
	_, err := NewSource(context.Background(), nil, SourceConfig{})
	require.ErrorContains(t, err, "JetStream is nil")
}

func TestTermReasonSupported(t *testing.T) {
	t.Parallel()
	tests := []struct {
		version string
		want    bool
	}{
		{"2.9.10", false},
		{"2.10.3", false},
		{"2.10.4", true},
		{"2.10.22", true},
		{"2.11.0-RC.1", true},
		{"3.0.0", true},
		{"v2.12.1", true},
		{"", false},
		{"garbage", false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, termReasonSupported(tt.version), "version %q", tt.version)
	}
}
