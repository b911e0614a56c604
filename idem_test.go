package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/retry"
)

type sqlState string

func (s sqlState) Error() string    { return "pg error " + string(s) }
func (s sqlState) SQLState() string { return string(s) }

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	t.Parallel()
	var syn *json.SyntaxError
	synErr := json.Unmarshal([]byte(`{`), &struct{}{})
	require.True(t, errors.As(synErr, &syn) || synErr != nil)
	typErr := json.Unmarshal([]byte(`{"a":"x"}`), &struct{ A int }{})
	for _, tc := range []struct {
		name string
		err  error
		want idem.Class
	}{
		{"permanent mark", idem.Permanent(errors.New("x")), idem.ClassPermanent},
		{"transient mark", idem.Transient(errors.New("x")), idem.ClassTransient},
		{"retry after", idem.RetryAfter(errors.New("x"), time.Second), idem.ClassTransient},
		{"mark wins over sqlstate", idem.Transient(sqlState("23505")), idem.ClassTransient},
		{"deadline", fmt.Errorf("wrapped: %w", context.DeadlineExceeded), idem.ClassTransient},
		{"net timeout", &net.OpError{Op: "read", Err: timeoutErr{}}, idem.ClassTransient},
		{"timeout interface", timeoutErr{}, idem.ClassTransient},
		{"conn refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), idem.ClassTransient},
		{"conn reset", fmt.Errorf("read: %w", syscall.ECONNRESET), idem.ClassTransient},
		{"unexpected eof", io.ErrUnexpectedEOF, idem.ClassTransient},
		{"pg connection class 08", sqlState("08006"), idem.ClassTransient},
		{"pg serialization", sqlState("40001"), idem.ClassTransient},
		{"pg deadlock", sqlState("40P01"), idem.ClassTransient},
		{"pg resources class 53", sqlState("53300"), idem.ClassTransient},
		{"pg admin shutdown", sqlState("57P01"), idem.ClassTransient},
		{"pg unique violation", sqlState("23505"), idem.ClassPermanent},
		{"pg syntax", sqlState("42601"), idem.ClassPermanent},
		{"json syntax", synErr, idem.ClassPermanent},
		{"json type", typErr, idem.ClassPermanent},
		{"key reuse", &idem.KeyReuseError{}, idem.ClassPermanent},
		{"no rows", idem.ExpectRows(0, 1), idem.ClassPermanent},
		{"unknown", errors.New("mystery"), idem.ClassUnknown},
		{"nil", nil, idem.ClassUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, idem.Classify(tc.err))
		})
	}
}

func TestRetryHint(t *testing.T) {
	t.Parallel()
	d, ok := idem.RetryHint(fmt.Errorf("x: %w", idem.RetryAfter(errors.New("429"), 2*time.Second)))
	require.True(t, ok)
	require.Equal(t, 2*time.Second, d)
	_, ok = idem.RetryHint(idem.Transient(errors.New("x")))
	require.False(t, ok)
	require.Nil(t, idem.Permanent(nil))
	require.Nil(t, idem.Transient(nil))
	require.Nil(t, idem.RetryAfter(nil, time.Second))
}

func TestExpectRows(t *testing.T) {
	t.Parallel()
	require.NoError(t, idem.ExpectRows(1, 1))
	require.NoError(t, idem.ExpectRows(3, 1))
	err := idem.ExpectRows(0, 1)
	require.ErrorIs(t, err, idem.ErrNoRows)
	require.Contains(t, err.Error(), "affected 0, want 1")
}

func TestKeyReuseError(t *testing.T) {
	t.Parallel()
	a, err := idem.ComputeFingerprint(idem.Message{Type: "t", Payload: []byte(`{"a":1}`)}, idem.FingerprintConfig{})
	require.NoError(t, err)
	b, err := idem.ComputeFingerprint(idem.Message{Type: "t", Payload: []byte(`{"a":2}`)}, idem.FingerprintConfig{})
	require.NoError(t, err)
	e := &idem.KeyReuseError{Key: idem.Key{Tenant: "acme", Consumer: "ledger@v1", EventID: "evt-9"}, Claimed: a, Received: b}
	require.ErrorIs(t, fmt.Errorf("wrap: %w", e), idem.ErrKeyReuse)
	for _, want := range []string{`tenant "acme"`, "consumer ledger@v1", a.Short(), b.Short()} {
		require.Contains(t, e.Error(), want)
	}
	require.NotContains(t, e.Error(), "evt-9", "the consumer adds the event id, once")
	require.Equal(t, `acme\n/ledger@v1/`+strings.Repeat("x", 64)+"…",
		idem.Key{Tenant: "acme\n", Consumer: "ledger@v1", EventID: strings.Repeat("x", 100)}.String(), "keys print bounded")
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(typ, payload string, cfg idem.FingerprintConfig) idem.Fingerprint {
		t.Helper()
		f, err := idem.ComputeFingerprint(idem.Message{Type: typ, Payload: []byte(payload)}, cfg)
		require.NoError(t, err)
		return f
	}
	none := idem.FingerprintConfig{}
	base := fp("payment.captured", `{"order":{"id":7,"cents":100},"ts":"a"}`, none)
	require.Equal(t, base, fp("payment.captured", "{ \"ts\":\"a\", \"order\": {\"cents\":100, \"id\":7} }", none), "key order and whitespace")
	require.NotEqual(t, base, fp("payment.refunded", `{"order":{"id":7,"cents":100},"ts":"a"}`, none), "type takes part")
	require.NotEqual(t, base, fp("payment.captured", `{"order":{"id":7,"cents":101},"ts":"a"}`, none), "content takes part")
	require.NotEqual(t, base, fp("payment.captured", `{"order":{"id":7.0,"cents":100},"ts":"a"}`, none), "numbers as written")

	excl := idem.FingerprintConfig{Exclude: []string{"ts"}}
	require.Equal(t, fp("e", `{"a":1,"ts":"x"}`, excl), fp("e", `{"a":1,"ts":"y"}`, excl))
	only := idem.FingerprintConfig{Fields: []string{"order.id"}}
	require.Equal(t, fp("e", `{"order":{"id":7,"cents":1}}`, only), fp("e", `{"order":{"id":7,"cents":2}}`, only))
	require.NotEqual(t, fp("e", `{"order":{"id":7}}`, only), fp("e", `{"order":{"id":8}}`, only))

	rawCfg := idem.FingerprintConfig{Raw: true}
	raw := fp("e", "\x00\x01binary", rawCfg)
	require.NotEqual(t, raw, fp("e", "\x00\x01binarz", rawCfg))
	require.NotEqual(t, fp("e", `"x"`, rawCfg), fp("e", `x`, rawCfg), "a JSON string and raw bytes differ")
	require.Equal(t, base, fp("payment.captured", `{"order":{"id":7,"cents":100},"ts":"a"}`, rawCfg), "Raw keeps JSON fingerprints")

	_, err := idem.ComputeFingerprint(idem.Message{EventID: "evt-1", Payload: []byte(`{"a":1,"a":2}`)}, none)
	require.ErrorIs(t, err, idem.ErrInvalidPayload)
	require.NotContains(t, err.Error(), "evt-1", "the consumer adds the event id, once")
}

func TestConsumerConfigValidate(t *testing.T) {
	t.Parallel()
	h := func(context.Context, struct{}, idem.Message) error { return nil }
	for _, tc := range []struct {
		name string
		cfg  idem.ConsumerConfig[struct{}]
		want []string
	}{
		{"empty name and handler", idem.ConsumerConfig[struct{}]{}, []string{"Name is empty", "Handler is nil"}},
		{"bad name", idem.ConsumerConfig[struct{}]{Name: "ledger v1", Handler: h}, []string{`Name "ledger v1"`}},
		{"two ats", idem.ConsumerConfig[struct{}]{Name: "a@b@c", Handler: h}, []string{"Name"}},
		{"retention too short", idem.ConsumerConfig[struct{}]{Name: "ledger@v1", Handler: h, Claims: idem.ClaimConfig{Retention: time.Hour, RedeliveryWindow: 2 * time.Hour}},
			[]string{"Claims.Retention (1h0m0s)", "Claims.RedeliveryWindow (2h0m0s)"}},
		{"bad retry", idem.ConsumerConfig[struct{}]{Name: "ledger@v1", Handler: h, Failure: idem.FailureConfig{Retry: retry.Policy{Base: time.Second, Cap: time.Millisecond}}}, []string{"Retry", "Cap"}},
		{"negative workers", idem.ConsumerConfig[struct{}]{Name: "ledger@v1", Handler: h, Workers: -1}, []string{"Workers is -1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.WithDefaults().Validate()
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
	require.NoError(t, idem.ConsumerConfig[struct{}]{Name: "ledger@v2", Handler: h}.WithDefaults().Validate())
}

func TestCheckRetentionIncludesRetryWorstCase(t *testing.T) {
	t.Parallel()
	p := retry.Policy{}.WithDefaults() // worst case 61.5s
	require.NoError(t, idem.CheckRetention(time.Hour+62*time.Second, time.Hour, p, 0))
	err := idem.CheckRetention(time.Hour+30*time.Second, time.Hour, p, 0)
	require.Error(t, err)
	require.Contains(t, err.Error(), "retry worst case (1m1.5s)")
	err = idem.CheckRetention(time.Hour+62*time.Second, time.Hour, p, 30*time.Second)
	require.ErrorContains(t, err, "lease (30s)")
}

func TestConsumerName(t *testing.T) {
	t.Parallel()
	n, v := idem.ConsumerName("ledger@v2")
	require.Equal(t, "ledger", n)
	require.Equal(t, "v2", v)
	n, v = idem.ConsumerName("ledger")
	require.Equal(t, "ledger", n)
	require.Equal(t, "", v)
}

func TestOutboxPartitionStable(t *testing.T) {
	t.Parallel()
	a := idemstore.OutboxPartition(idem.Outgoing{EventID: "1", Key: "order-7"}, 16)
	b := idemstore.OutboxPartition(idem.Outgoing{EventID: "2", Key: "order-7"}, 16)
	require.Equal(t, a, b, "same key, same partition")
	seen := map[int]bool{}
	for i := range 200 {
		p := idemstore.OutboxPartition(idem.Outgoing{EventID: fmt.Sprint(i)}, 16)
		require.True(t, p >= 0 && p < 16)
		seen[p] = true
	}
	require.Greater(t, len(seen), 12, "keys spread over partitions")
	require.Equal(t, 0, idemstore.OutboxPartition(idem.Outgoing{EventID: "x"}, 1))
	require.True(t, strings.Contains(idem.Outgoing{Topic: "t"}.Validate().Error(), "EventID is empty"))
}

// bucketedStore is a partitioned store for config checks only (no method of Store is called).
type bucketedStore struct {
	idemstore.Store[struct{}]
	bucket, retention time.Duration
}

func (b bucketedStore) ClaimBucket() time.Duration    { return b.bucket }
func (b bucketedStore) ClaimRetention() time.Duration { return b.retention }

func TestConsumerRetentionWithinPartitions(t *testing.T) {
	t.Parallel()
	h := func(context.Context, struct{}, idem.Message) error { return nil }
	day := 24 * time.Hour
	_, err := idem.NewConsumer[struct{}](bucketedStore{bucket: day, retention: 3 * day}, idem.ConsumerConfig[struct{}]{Name: "ledger@v1", Handler: h})
	require.ErrorContains(t, err, "Retention (168h0m0s) is longer than the store's partition retention (72h0m0s)")
	_, err = idem.NewConsumer[struct{}](bucketedStore{bucket: day, retention: 3 * day}, idem.ConsumerConfig[struct{}]{Name: "ledger@v1", Handler: h, Claims: idem.ClaimConfig{Retention: 3 * day}})
	require.NoError(t, err)
	_, err = idem.NewConsumer[struct{}](bucketedStore{}, idem.ConsumerConfig[struct{}]{Name: "ledger@v1", Handler: h})
	require.NoError(t, err, "a plain inbox has no partition retention")
	_, err = idem.NewConsumer[struct{}](bucketedStore{}, idem.ConsumerConfig[struct{}]{Name: "ledger@v1", Handler: h, Batch: idem.BatchConfig{Enabled: true}})
	require.ErrorContains(t, err, "does not implement idemstore.BatchStore")
}

// TestFingerprintIsStable pins the hash layout: stored claims hold these values, so a change
// would turn every redelivery of an in-flight event into key reuse.
func TestFingerprintIsStable(t *testing.T) {
	t.Parallel()
	for payload, want := range map[string]string{
		`{"b":1,"a":[1,2]}`: "eb436f5472983578ea58e9e4907e2fe7d82f0f950b9582a7beae6e99172a5497",
		"raw\x00bytes":      "44892e476d98d6acf4954a66733f1f73990793ddc591a67796eca78ec6c6956b",
		`{"x":"y"}`:         "a083ca06abaa97a3b506b49c993140b3e89eed04ce4df9c7a8d4e119e2986ee2",
	} {
		fp, err := idem.ComputeFingerprint(idem.Message{Type: "t", Payload: []byte(payload)}, idem.FingerprintConfig{Raw: true})
		require.NoError(t, err)
		require.Equal(t, want, fp.String(), "payload %q", payload)
	}
}

// TestPayloadMustBeJSONByDefault: a payload meant to be JSON that does not parse (truncated, a
// byte-order mark in front, binary, empty) is invalid_payload by default, and the handler never
// sees it; a consumer that declares FingerprintConfig.Raw takes such payloads as raw bytes.
func TestPayloadMustBeJSONByDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, payload string
	}{
		{"truncated", `{"wallet":"w1","amount":`},
		{"byte-order mark", "\ufeff" + `{"wallet":"w1","amount":1}`},
		{"binary", "\x00\x01\x02"},
		{"plain text", "hello"},
		{"empty", ""},
		{"two documents", `{"a":1}{"a":2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var handled int
			for _, raw := range []bool{false, true} {
				store := newMemStore()
				c := memConsumer(t, store, func(cfg *idem.ConsumerConfig[*memTx]) {
					cfg.Input.Fingerprint.Raw = raw
					cfg.Handler = func(context.Context, *memTx, idem.Message) error { handled++; return nil }
				})
				res := c.Process(context.Background(), idem.Message{EventID: "evt-1", Type: "t", Payload: []byte(tc.payload)})
				err := res.Err
				if raw {
					require.NoError(t, err, "Raw takes any payload")
					require.Equal(t, idem.OutcomeProcessed, res.Outcome)
					continue
				}
				require.ErrorIs(t, err, idem.ErrInvalidPayload)
				require.ErrorContains(t, err, "payload is not JSON")
				require.ErrorContains(t, err, "FingerprintConfig.Raw")
				require.Equal(t, idem.ReasonInvalidPayload, res.Reason)
				require.Equal(t, idem.ClassPermanent, res.Class)
				require.Zero(t, handled, "the handler never sees it")
			}
			require.Equal(t, 1, handled)
		})
	}
}

// TestOutgoingRefusesWhatAConsumerWould: the outbox validates identity as the consumer's edge
// does, so an event that could never be applied fails in the producer's transaction.
func TestOutgoingRefusesWhatAConsumerWould(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		o    idem.Outgoing
		want string
	}{
		{"ok", idem.Outgoing{EventID: "e1", Tenant: "acme", Topic: "t"}, ""},
		{"blank id", idem.Outgoing{EventID: " \u00a0", Topic: "t"}, "event id"},
		{"long id", idem.Outgoing{EventID: strings.Repeat("x", 3<<10), Topic: "t"}, "event id"},
		{"NUL in id", idem.Outgoing{EventID: "a\x00b", Topic: "t"}, "event id"},
		{"invalid UTF-8 id", idem.Outgoing{EventID: "a\xff", Topic: "t"}, "event id"},
		{"long tenant", idem.Outgoing{EventID: "e1", Tenant: strings.Repeat("t", 10<<10), Topic: "t"}, "tenant"},
		{"no topic", idem.Outgoing{EventID: "e1"}, "Topic is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.o.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.Less(t, len(err.Error()), 400, "the error is bounded: %q", err)
			if tc.want != "Topic is empty" {
				require.ErrorIs(t, err, idem.ErrInvalidPayload)
			}
		})
	}
}

// TestOutgoingMessageCarriesKey: the ordering key reaches the sink as the Idem-Key header (the
// partitioned and grouped brokers order by it), a header the producer set wins, and the
// producer's map is left as it was.
func TestOutgoingMessageCarriesKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		out     idem.Outgoing
		want    map[string]string
		wantOut map[string]string
	}{
		{"no key", idem.Outgoing{EventID: "e1", Headers: map[string]string{"a": "1"}},
			map[string]string{"a": "1"}, map[string]string{"a": "1"}},
		{"key, no headers", idem.Outgoing{EventID: "e1", Key: "order-7"},
			map[string]string{idem.HeaderKey: "order-7"}, nil},
		{"key beside headers", idem.Outgoing{EventID: "e1", Key: "order-7", Headers: map[string]string{"a": "1"}},
			map[string]string{"a": "1", idem.HeaderKey: "order-7"}, map[string]string{"a": "1"}},
		{"producer's header wins", idem.Outgoing{EventID: "e1", Key: "order-7", Headers: map[string]string{idem.HeaderKey: "mine"}},
			map[string]string{idem.HeaderKey: "mine"}, map[string]string{idem.HeaderKey: "mine"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := tc.out.Message()
			if len(tc.want) == 0 {
				require.Empty(t, m.Headers)
			} else {
				require.Equal(t, tc.want, m.Headers)
			}
			require.Equal(t, tc.wantOut, tc.out.Headers, "the producer's headers are not changed")
		})
	}
}
