package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/cmd/idem/internal/testdb"
	"github.com/idemkit/idem/idemnats"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/internal/testenv"
)

// startRelay runs `idem relay args…` until the returned stop is called; stop returns the exit
// code and what the relay logged.
func startRelay(t *testing.T, args ...string) (logs *syncBuffer, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout syncBuffer
	logs = &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"relay"}, args...), testEnv(&stdout, logs, nil)) }()
	stopped := false
	var code int
	stop = func() int {
		if !stopped {
			stopped = true
			cancel()
			select {
			case code = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("relay did not stop within 30s; logs:\n%s", logs)
			}
		}
		return code
	}
	t.Cleanup(func() { stop() })
	return logs, stop
}

// logValue finds the first JSON log line with msg and returns its attribute key.
func logValue(logs string, msg, key string) string {
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != msg {
			continue
		}
		s, _ := rec[key].(string)
		return s
	}
	return ""
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestRelaySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	seedOutbox(t, st,
		idem.Outgoing{EventID: "o1", Tenant: "acme", Topic: "payments", Key: "order-1", Payload: []byte(`{"n":1}`), Headers: map[string]string{"X-A": "1"}},
		idem.Outgoing{EventID: "o2", Tenant: "acme", Topic: "payments", Key: "order-1", Payload: []byte(`{"n":2}`)})

	logs, stop := startRelay(t, "--store", dsn, "--broker", "sql", "--metrics-addr", "127.0.0.1:0",
		"--poll", "20ms", "--queue", "payments", "--log-format", "json", "--id", "relay-test")

	var addr string
	require.Eventually(t, func() bool {
		addr = logValue(logs.String(), "idem relay: serving /metrics and /healthz", "addr")
		return addr != ""
	}, 10*time.Second, 10*time.Millisecond, "no metrics address logged:\n%s", logs)

	require.Eventually(t, func() bool {
		qs, err := st.Queue.QueueStats(ctx, "payments")
		require.NoError(t, err)
		return qs.Backlog == 2
	}, 10*time.Second, 10*time.Millisecond, "relay did not publish; logs:\n%s", logs)
	jobs, err := st.Queue.QueueFetch(ctx, idemstore.QueueFetchParams{Queue: "payments", Max: 10, Lease: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	require.Len(t, jobs, 2)
	require.Equal(t, "o1", jobs[0].Message.EventID, "per-key order")
	require.Equal(t, "acme", jobs[0].Message.Tenant)
	require.Equal(t, "1", jobs[0].Message.Headers["X-A"])
	require.Equal(t, "o2", jobs[1].Message.EventID)

	code, body := httpGet(t, "http://"+addr+"/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	require.Eventually(t, func() bool {
		_, body = httpGet(t, "http://"+addr+"/metrics")
		return strings.Contains(body, "idem_outbox_published_total") && strings.Contains(body, "idem_outbox_backlog 0")
	}, 10*time.Second, 50*time.Millisecond)
	require.Contains(t, body, `idem_queue_backlog{queue="payments"} 2`)
	require.Contains(t, body, "idem_dead_letters_oldest_age_seconds")
	require.Contains(t, body, "go_goroutines")

	require.Equal(t, ExitOK, stop(), "logs:\n%s", logs)
	require.Equal(t, "relay-test", logValue(logs.String(), "idem relay: stopped", "relay"), "logs:\n%s", logs)
	require.NotContains(t, logs.String(), `"level":"ERROR"`)
}

func TestRelayNATS(t *testing.T) {
	t.Parallel()
	natsURL := testenv.NATS(t)
	js, subject := testStream(t, natsURL)
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	seedOutbox(t, st, idem.Outgoing{EventID: "n1", Tenant: "acme", Topic: subject, Type: "payment.captured", Payload: []byte(`{"n":1}`)})

	logs, stop := startRelay(t, "--store", dsn, "--broker", natsURL, "--poll", "20ms")
	cons := streamConsumer(t, js, subject)
	msg := nextMsg(t, cons)
	require.Equal(t, "n1", msg.Headers().Get(idemnats.HeaderEventID))
	require.Equal(t, idemnats.BrokerMsgID(subject, idem.Message{EventID: "n1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"n":1}`)}),
		msg.Headers().Get(jetstream.MsgIDHeader), "the broker id is the event id scoped by subject and content")
	require.Equal(t, `{"n":1}`, string(msg.Data()))
	require.Equal(t, ExitOK, stop(), "logs:\n%s", logs)
	require.Contains(t, logs.String(), "level=INFO")
}

// TestReplayNATS: replay to JetStream keeps the event id as Nats-Msg-Id and the original
// headers, and adds the replay headers.
func TestReplayNATS(t *testing.T) {
	t.Parallel()
	natsURL := testenv.NATS(t)
	js, subject := testStream(t, natsURL)
	dsn := sqliteDSN(t)
	st := openMigrated(t, dsn)
	dl := seedDeadLetter(t, st, "evt-nats", idem.ReasonPermanentError, time.Hour)

	r := idemCLI(t, "dlq", "replay", "--id", strconv.FormatInt(dl.ID, 10), "--broker", natsURL, "--topic", subject, "--store", dsn, "--actor", "carol")
	requireOK(t, r)
	require.Contains(t, r.stdout, "replayed 1 dead letter to "+subject)

	msg := nextMsg(t, streamConsumer(t, js, subject))
	h := msg.Headers()
	require.Equal(t, "evt-nats", h.Get(idemnats.HeaderEventID))
	// A replay gets its own Nats-Msg-Id, so the stream's duplicate window does not drop it.
	require.Equal(t, "evt-nats/replay/"+strconv.FormatInt(dl.ID, 10), h.Get(jetstream.MsgIDHeader))
	require.Equal(t, "acme", h.Get(idemnats.HeaderTenant))
	require.Equal(t, "Bearer s3cr3t-token", h.Get("Authorization"))
	require.Equal(t, strconv.FormatInt(dl.ID, 10), h.Get(idem.HeaderReplayOf))
	require.Equal(t, "carol (os:tester)", h.Get(idem.HeaderReplayedBy))
	require.JSONEq(t, string(dl.Message.Payload), string(msg.Data()))
}

// testStream creates a memory stream for this test over a fresh subject, deleted at cleanup.
func testStream(t *testing.T, url string) (jetstream.JetStream, string) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	name := testdb.Name("CLITEST_")
	subject := strings.ToLower(name) + ".events"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage, MaxAge: 10 * time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return js, subject
}

func streamConsumer(t *testing.T, js jetstream.JetStream, subject string) jetstream.Consumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.StreamNameBySubject(ctx, subject)
	require.NoError(t, err)
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	require.NoError(t, err)
	return cons
}

func nextMsg(t *testing.T, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	for m := range batch.Messages() {
		return m
	}
	require.NoError(t, batch.Error())
	t.Fatal("no message in the stream")
	return nil
}
