package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// captured is one request the test server received.
type captured struct {
	method, path string
	header       http.Header
	body         []byte
	req          *http.Request // a clone, for idemhttp.Verify
}

// server records requests and answers with handle (200 when nil).
type server struct {
	mu     sync.Mutex
	got    []captured
	handle func(w http.ResponseWriter, r *http.Request)
}

func newServer(tb testing.TB, handle func(w http.ResponseWriter, r *http.Request)) (*server, *httptest.Server) {
	s := &server{handle: handle}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.got = append(s.got, captured{method: r.Method, path: r.URL.EscapedPath(), header: r.Header.Clone(), body: body, req: r.Clone(context.Background())})
		s.mu.Unlock()
		if s.handle != nil {
			r.Body = io.NopCloser(bytes.NewReader(body))
			s.handle(w, r)
		}
	}))
	tb.Cleanup(srv.Close)
	return s, srv
}

func (s *server) requests() []captured {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]captured(nil), s.got...)
}

func newSink(tb testing.TB, cfg idemhttp.SinkConfig) *idemhttp.Sink {
	tb.Helper()
	s, err := idemhttp.NewSink(cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, s.Close()) })
	return s
}

var fixedNow = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func TestSinkSendsHeadersAndSignature(t *testing.T) {
	t.Parallel()
	rec, srv := newServer(t, nil)
	secret := []byte("s3cret-of-at-least-32-random-bytes")
	sink := newSink(t, idemhttp.SinkConfig{BaseURL: srv.URL + "/hooks/", Secret: secret, KeyID: "key-2025", Now: func() time.Time { return fixedNow }})
	occurred := time.Date(2025, 3, 1, 11, 59, 0, 123, time.UTC)
	msgs := []idem.Message{
		{EventID: "evt-1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"amount":5}`), OccurredAt: occurred,
			Headers: map[string]string{"Traceparent": "00-abc-01", "Idempotency-Key": "forged", "Idem-Signature": "forged"}},
		{EventID: "evt-2", Payload: []byte("not json")},
	}
	require.NoError(t, sink.Publish(context.Background(), "payments captured", msgs...))

	got := rec.requests()
	require.Len(t, got, 2)
	for i, tc := range []struct {
		contentType, key, tenant, typ, occurred string
	}{
		{"application/json", "acme:evt-1", "acme", "payment.captured", "2025-03-01T11:59:00.000000123Z"},
		{"application/octet-stream", ":evt-2", "", "", ""},
	} {
		r := got[i]
		require.Equal(t, http.MethodPost, r.method)
		require.Equal(t, "/hooks/payments%20captured", r.path, "topic appended, path-escaped")
		require.Equal(t, msgs[i].Payload, r.body)
		require.Equal(t, tc.contentType, r.header.Get("Content-Type"))
		require.Equal(t, tc.key, r.header.Get(idemhttp.HeaderIdempotencyKey), "a message header cannot forge the key")
		require.Equal(t, msgs[i].EventID, r.header.Get(idemhttp.HeaderEventID))
		require.Equal(t, tc.tenant, r.header.Get(idemhttp.HeaderTenant))
		require.Equal(t, tc.typ, r.header.Get(idemhttp.HeaderType))
		require.Equal(t, tc.occurred, r.header.Get(idemhttp.HeaderOccurredAt))
		sig := r.header.Get(idemhttp.SignatureHeaderDefault)
		require.True(t, strings.HasPrefix(sig, "t=1740830400,kid=key-2025,h1="), sig)
		require.Equal(t, "key-2025", idemhttp.SignatureKeyID(sig))
		require.NoError(t, idemhttp.Verify(secret, r.req, r.body, fixedNow.Add(time.Minute), 0))
	}
	require.Equal(t, "00-abc-01", got[0].header.Get("Traceparent"), "the message's own headers are sent")
}

func TestSinkWithoutSecretDoesNotSign(t *testing.T) {
	t.Parallel()
	rec, srv := newServer(t, nil)
	sink := newSink(t, idemhttp.SinkConfig{
		URL:             func(topic string) (string, error) { return srv.URL + "/x/" + topic, nil },
		SignatureHeader: "X-Sig",
	})
	require.NoError(t, sink.Publish(context.Background(), "t1", idem.Message{EventID: "e", Payload: []byte(`{}`),
		Headers: map[string]string{"X-Sig": "forged", "Content-Type": "application/cloudevents+json"}}))
	got := rec.requests()
	require.Len(t, got, 1)
	require.Equal(t, "/x/t1", got[0].path)
	require.Empty(t, got[0].header.Get("X-Sig"), "no secret: no signature, and no forged one either")
	require.Equal(t, "application/cloudevents+json", got[0].header.Get("Content-Type"), "a message's content type is kept")
}

// classOf returns the class of err and its retry hint.
func classOf(err error) (idem.Class, time.Duration) {
	d, _ := idem.RetryHint(err)
	return idem.Classify(err), d
}

func TestSinkClassifiesResponses(t *testing.T) {
	t.Parallel()
	const secretBody = `{"error":"rejected","api_key":"sk_live_123","detail":"` // + padding
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		body       string
		wantClass  idem.Class // ClassUnknown means success
		wantHint   time.Duration
	}{
		{"200", 200, "", "", idem.ClassUnknown, 0},
		{"204", 204, "", "", idem.ClassUnknown, 0},
		{"429 delta-seconds", 429, "2", "", idem.ClassTransient, 2 * time.Second},
		{"503 http-date", 503, fixedNow.Add(5 * time.Second).Format(http.TimeFormat), "", idem.ClassTransient, 5 * time.Second},
		{"503 date in the past", 503, fixedNow.Add(-time.Minute).Format(http.TimeFormat), "", idem.ClassTransient, 0},
		{"503 without hint", 503, "", "", idem.ClassTransient, 0},
		{"429 malformed hint", 429, "soon", "", idem.ClassTransient, 0},
		{"500", 500, "", "boom", idem.ClassTransient, 0},
		{"502", 502, "", "", idem.ClassTransient, 0},
		{"408", 408, "", "", idem.ClassTransient, 0},
		{"400", 400, "", secretBody + strings.Repeat("x", 300) + `"}`, idem.ClassPermanent, 0},
		{"404", 404, "", "", idem.ClassPermanent, 0},
		{"409", 409, "", "", idem.ClassPermanent, 0},
		{"302 not followed", 302, "", "", idem.ClassPermanent, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				if tc.status == 302 {
					w.Header().Set("Location", "/elsewhere")
				}
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			})
			sink := newSink(t, idemhttp.SinkConfig{BaseURL: srv.URL + "?token=abc", Now: func() time.Time { return fixedNow }})
			err := sink.Publish(context.Background(), "orders", idem.Message{EventID: "evt-7", Payload: []byte(`{}`)})
			if tc.wantClass == idem.ClassUnknown {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			class, hint := classOf(err)
			require.Equal(t, tc.wantClass, class)
			require.Equal(t, tc.wantHint, hint)
			msg := err.Error()
			require.Contains(t, msg, "event evt-7")
			require.Contains(t, msg, srv.URL)
			require.Contains(t, msg, fmt.Sprintf("status %d", tc.status))
			require.NotContains(t, msg, "abc", "URL secrets are redacted")
			require.NotContains(t, msg, "sk_live_123", "body secrets are redacted")
			require.NotContains(t, msg, strings.Repeat("x", 200), "only the body's first 200 bytes")
		})
	}
}

func TestSinkNetworkErrorsAreTransient(t *testing.T) {
	t.Parallel()
	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		sink := newSink(t, idemhttp.SinkConfig{BaseURL: url})
		err := sink.Publish(context.Background(), "orders", idem.Message{EventID: "evt-1"})
		require.Error(t, err)
		require.Equal(t, idem.ClassTransient, idem.Classify(err))
		require.Contains(t, err.Error(), "evt-1")
	})
	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		release := make(chan struct{})
		_, srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		defer close(release)
		sink := newSink(t, idemhttp.SinkConfig{BaseURL: srv.URL, Client: &http.Client{Timeout: 50 * time.Millisecond}})
		err := sink.Publish(context.Background(), "orders", idem.Message{EventID: "evt-2"})
		require.Error(t, err)
		require.Equal(t, idem.ClassTransient, idem.Classify(err))
	})
	t.Run("caller cancels", func(t *testing.T) {
		t.Parallel()
		_, srv := newServer(t, nil)
		sink := newSink(t, idemhttp.SinkConfig{BaseURL: srv.URL})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := sink.Publish(ctx, "orders", idem.Message{EventID: "evt-3"})
		require.ErrorIs(t, err, context.Canceled)
	})
}

func TestSinkStopsAtFirstFailure(t *testing.T) {
	t.Parallel()
	rec, srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(idemhttp.HeaderEventID) == "b" {
			w.WriteHeader(http.StatusBadRequest)
		}
	})
	sink := newSink(t, idemhttp.SinkConfig{BaseURL: srv.URL})
	err := sink.Publish(context.Background(), "t", idem.Message{EventID: "a"}, idem.Message{EventID: "b"}, idem.Message{EventID: "c"})
	require.ErrorContains(t, err, "event b")
	require.Len(t, rec.requests(), 2)
}

func TestSinkRefusesUnsendableMessages(t *testing.T) {
	t.Parallel()
	rec, srv := newServer(t, nil)
	sink := newSink(t, idemhttp.SinkConfig{BaseURL: srv.URL})
	for _, tc := range []struct {
		name string
		msg  idem.Message
		want string
	}{
		{"no event id", idem.Message{Type: "x"}, "no event id"},
		{"bad header name", idem.Message{EventID: "e", Headers: map[string]string{"Bad Name": "v"}}, `header name "Bad Name"`},
		{"header injection", idem.Message{EventID: "e", Headers: map[string]string{"X-A": "v\r\nX-B: w"}}, `header "X-A"`},
		{"tenant injection", idem.Message{EventID: "e", Tenant: "a\nb"}, "has control characters"},
	} {
		err := sink.Publish(context.Background(), "t", tc.msg)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.Equal(t, idem.ClassPermanent, idem.Classify(err), tc.name)
	}
	urlErr := errors.New("no route for topic")
	bad := newSink(t, idemhttp.SinkConfig{URL: func(string) (string, error) { return "", urlErr }})
	err := bad.Publish(context.Background(), "t", idem.Message{EventID: "e"})
	require.ErrorIs(t, err, urlErr)
	require.Equal(t, idem.ClassPermanent, idem.Classify(err))
	require.Empty(t, rec.requests())
}

func TestNewSinkValidates(t *testing.T) {
	t.Parallel()
	url := func(string) (string, error) { return "http://x", nil }
	for _, tc := range []struct {
		name string
		cfg  idemhttp.SinkConfig
		want string
	}{
		{"ok base", idemhttp.SinkConfig{BaseURL: "https://hooks.example.com"}, ""},
		{"ok func", idemhttp.SinkConfig{URL: url, Secret: []byte("k-of-at-least-32-random-bytes-!!"), KeyID: "k1"}, ""},
		{"short secret", idemhttp.SinkConfig{URL: url, Secret: []byte("k"), KeyID: "k1"}, "Secret has 1 bytes, want at least 32"},
		{"neither", idemhttp.SinkConfig{}, "URL and BaseURL are both empty"},
		{"both", idemhttp.SinkConfig{URL: url, BaseURL: "http://x"}, "URL and BaseURL are both set"},
		{"relative base", idemhttp.SinkConfig{BaseURL: "/hooks"}, "BaseURL \"/hooks\": want an absolute http or https URL"},
		{"base password redacted", idemhttp.SinkConfig{BaseURL: "ftp://u:hunter2@x"}, "BaseURL \"ftp://u:[REDACTED]@x\""},
		{"unparseable base password not echoed", idemhttp.SinkConfig{BaseURL: "https://u:hunter2#x@h/hooks"}, "BaseURL \"https://[REDACTED]\": invalid port after host"},
		{"header", idemhttp.SinkConfig{BaseURL: "http://x", SignatureHeader: "Bad Header"}, "SignatureHeader \"Bad Header\""},
		{"key id", idemhttp.SinkConfig{BaseURL: "http://x", Secret: []byte("k"), KeyID: "a,b"}, "KeyID \"a,b\""},
		{"key id without secret", idemhttp.SinkConfig{BaseURL: "http://x", KeyID: "k1"}, "Secret is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := idemhttp.NewSink(tc.cfg)
			if tc.want == "" {
				require.NoError(t, err)
				require.NoError(t, s.Close())
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "idemhttp: sink config")
			require.NotContains(t, err.Error(), "hunter2")
		})
	}
}

// TestCapturedRequestReplayedUnderAnotherKeyIsRefused (finding 2): a receiver that verifies with
// Verify and deduplicates on Idempotency-Key. An attacker who captured a signed request re-sends
// it, within the tolerance, with a new key and another tenant. Before, only the body was signed
// and the copy was applied a second time.
func TestCapturedRequestReplayedUnderAnotherKeyIsRefused(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cret-shared-with-the-receiver-32")
	var (
		mu      sync.Mutex
		applied = map[string]bool{}
	)
	rec, srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := idemhttp.Verify(secret, r, body, time.Now(), time.Minute); err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		applied[r.Header.Get(idemhttp.HeaderIdempotencyKey)] = true
		mu.Unlock()
	})
	sink := newSink(t, idemhttp.SinkConfig{BaseURL: srv.URL, Secret: secret, KeyID: "k1"})
	require.NoError(t, sink.Publish(context.Background(), "payments", idem.Message{EventID: "pay-1", Tenant: "acme", Type: "payment.captured", Payload: []byte(`{"amount":5}`)}))
	captured := rec.requests()[0]

	resend := func(mod func(h http.Header)) int {
		req, err := http.NewRequest(captured.method, srv.URL+captured.path, strings.NewReader(string(captured.body)))
		require.NoError(t, err)
		req.Header = captured.header.Clone()
		mod(req.Header)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, resend(func(http.Header) {}), "the same request again verifies (and is deduplicated by its key)")
	require.Equal(t, http.StatusUnauthorized, resend(func(h http.Header) {
		h.Set(idemhttp.HeaderIdempotencyKey, "globex:pay-1")
		h.Set(idemhttp.HeaderTenant, "globex")
	}))
	require.Equal(t, http.StatusUnauthorized, resend(func(h http.Header) { h.Set(idemhttp.HeaderIdempotencyKey, "acme:pay-1-again") }))
	require.Equal(t, http.StatusUnauthorized, resend(func(h http.Header) { h.Set(idemhttp.HeaderType, "payment.refunded") }))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]bool{"acme:pay-1": true}, applied, "applied under one key only")
}

// TestSinkNeverFollowsRedirects (finding 9): with a caller's client that follows redirects, a 307
// to another host must not receive the body, the signature or the idempotency key.
func TestSinkNeverFollowsRedirects(t *testing.T) {
	t.Parallel()
	other, otherSrv := newServer(t, nil)
	_, srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, otherSrv.URL+"/steal", http.StatusTemporaryRedirect)
	})
	follows := &http.Client{Timeout: 5 * time.Second} // the zero CheckRedirect follows 307s with the body
	sink := newSink(t, idemhttp.SinkConfig{BaseURL: srv.URL, Secret: []byte("s3cret-of-at-least-32-random-bytes"), Client: follows})
	err := sink.Publish(context.Background(), "payments", idem.Message{EventID: "pay-1", Tenant: "acme", Payload: []byte(`{"amount":5}`)})
	require.ErrorContains(t, err, "status 307")
	require.Equal(t, idem.ClassPermanent, idem.Classify(err))
	require.Empty(t, other.requests(), "the other origin received nothing")
	require.Nil(t, follows.CheckRedirect, "the caller's client is not changed")
	follows.CloseIdleConnections()
}
