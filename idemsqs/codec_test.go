package idemsqs_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqs"
)

// received is the SQS message a receive returns for what Encode built.
func received(e idemsqs.Encoded, sys map[string]string) types.Message {
	return types.Message{Body: aws.String(e.Body), MessageAttributes: e.Attributes, Attributes: sys}
}

func TestEncodeDecode(t *testing.T) {
	t.Parallel()
	occurred := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	cases := []struct {
		name     string
		msg      idem.Message
		encoding string // the AttrBodyEncoding the body needs ("" for none)
		binary   []string
	}{
		{name: "json", msg: idem.Message{EventID: "e-1", Tenant: "t", Type: "order.created", Payload: []byte(`{"a":"é"}`), OccurredAt: occurred, Headers: map[string]string{"Trace-Id": "x", "x.req_id": "1"}}},
		{name: "binary payload", msg: idem.Message{EventID: "e-2", Payload: []byte{0, 1, 0xfe, 0xff}}, encoding: "base64"},
		{name: "control characters", msg: idem.Message{EventID: "e-3", Payload: []byte("a\x01b")}, encoding: "base64"},
		{name: "noncharacter", msg: idem.Message{EventID: "e-4", Payload: []byte("a\uFFFEb")}, encoding: "base64"},
		{name: "tabs and newlines", msg: idem.Message{EventID: "e-5", Payload: []byte("a\tb\r\nc")}},
		{name: "empty payload", msg: idem.Message{EventID: "e-6"}, encoding: "empty"},
		{name: "binary header", msg: idem.Message{EventID: "e-7", Payload: []byte("p"), Headers: map[string]string{"Raw": "\x00\xff"}}, binary: []string{"Raw"}},
		{name: "binary identity", msg: idem.Message{EventID: "e-\x01", Tenant: "t\x02", Payload: []byte("p")}, binary: []string{idemsqs.AttrEventID, idemsqs.AttrTenant}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, err := idemsqs.Encode(tc.msg)
			require.NoError(t, err)
			require.NotEmpty(t, e.Body, "SQS refuses an empty body")
			require.Equal(t, tc.encoding, aws.ToString(e.Attributes[idemsqs.AttrBodyEncoding].StringValue))
			for _, name := range tc.binary {
				require.Equal(t, "Binary", aws.ToString(e.Attributes[name].DataType), "attribute %s", name)
			}
			got, err := idemsqs.Decode(received(e, map[string]string{"ApproximateReceiveCount": "3", "SentTimestamp": "1767225600000"}))
			require.NoError(t, err)
			require.Equal(t, tc.msg.EventID, got.EventID)
			require.Equal(t, tc.msg.Tenant, got.Tenant)
			require.Equal(t, tc.msg.Type, got.Type)
			require.True(t, bytes.Equal(tc.msg.Payload, got.Payload), "payload %q, want %q", got.Payload, tc.msg.Payload)
			require.True(t, tc.msg.OccurredAt.Equal(got.OccurredAt))
			require.Equal(t, tc.msg.Headers, got.Headers)
			require.Equal(t, 3, got.Attempt)
			require.Equal(t, time.UnixMilli(1767225600000), got.PublishedAt)
		})
	}
}

func TestEncodeRefuses(t *testing.T) {
	t.Parallel()
	many := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		many[k] = "v"
	}
	cases := []struct {
		name string
		msg  idem.Message
		want string
	}{
		{"no event id", idem.Message{Payload: []byte("p")}, "no EventID"},
		{"too many attributes", idem.Message{EventID: "e", Payload: []byte("p"), Headers: many}, "11 message attributes"},
		{"space in a name", idem.Message{EventID: "e", Payload: []byte("p"), Headers: map[string]string{"Trace Id": "v"}}, "only letters, digits"},
		{"colon in a name", idem.Message{EventID: "e", Payload: []byte("p"), Headers: map[string]string{"a:b": "v"}}, "only letters, digits"},
		{"reserved prefix", idem.Message{EventID: "e", Payload: []byte("p"), Headers: map[string]string{"aws.trace": "v"}}, "reserved by SQS"},
		{"leading period", idem.Message{EventID: "e", Payload: []byte("p"), Headers: map[string]string{".a": "v"}}, "'.'"},
		{"doubled period", idem.Message{EventID: "e", Payload: []byte("p"), Headers: map[string]string{"a..b": "v"}}, "'.'"},
		{"long name", idem.Message{EventID: "e", Payload: []byte("p"), Headers: map[string]string{strings.Repeat("n", 257): "v"}}, "over 256 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := idemsqs.Encode(tc.msg)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestEncodeHeaders: mapped names never pass as headers, and a header with an empty value is
// left out (SQS refuses empty attribute values).
func TestEncodeHeaders(t *testing.T) {
	t.Parallel()
	e, err := idemsqs.Encode(idem.Message{EventID: "real", Payload: []byte("p"), Headers: map[string]string{
		idemsqs.AttrEventID: "forged", idemsqs.AttrBodyEncoding: "base64", idemsqs.AttrDecodeError: "x", "Empty": "", "Kept": "v",
	}})
	require.NoError(t, err)
	got, err := idemsqs.Decode(received(e, nil))
	require.NoError(t, err)
	require.Equal(t, "real", got.EventID)
	require.Equal(t, []byte("p"), got.Payload)
	require.Equal(t, map[string]string{"Kept": "v"}, got.Headers)
	require.Equal(t, 1, got.Attempt, "a message without ApproximateReceiveCount is on its first attempt")
}

func TestDecodeInvalid(t *testing.T) {
	t.Parallel()
	str := func(v string) types.MessageAttributeValue {
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	cases := []struct {
		name  string
		attrs map[string]types.MessageAttributeValue
		body  string
		want  string
		id    string // the event id kept in the AttrEventID header
	}{
		{"no event id", map[string]types.MessageAttributeValue{"Trace-Id": str("x")}, "{}", "no Idem-Event-Id attribute", ""},
		{"bad occurred-at", map[string]types.MessageAttributeValue{idemsqs.AttrEventID: str("e-1"), idemsqs.AttrOccurredAt: str("yesterday")}, "{}", "Idem-Occurred-At", "e-1"},
		{"bad base64", map[string]types.MessageAttributeValue{idemsqs.AttrEventID: str("e-2"), idemsqs.AttrBodyEncoding: str("base64")}, "!!", "illegal base64", "e-2"},
		{"unknown encoding", map[string]types.MessageAttributeValue{idemsqs.AttrEventID: str("e-3"), idemsqs.AttrBodyEncoding: str("gzip")}, "x", `"gzip" is none of`, "e-3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := idemsqs.Decode(types.Message{Body: aws.String(tc.body), MessageAttributes: tc.attrs})
			require.ErrorContains(t, err, tc.want)
			require.True(t, errors.Is(err, idem.ErrInvalidPayload), "error %v does not wrap idem.ErrInvalidPayload", err)
			require.Empty(t, m.EventID, "an undecodable message has no event id, so the consumer dead-letters it")
			require.Contains(t, m.Headers[idemsqs.AttrDecodeError], tc.want)
			require.Equal(t, tc.id, m.Headers[idemsqs.AttrEventID])
		})
	}
}

// TestBrokerIDs: the FIFO ids are what SQS accepts (1 to 128 printable ASCII characters), the
// same for a republish, and different for a reused event id with other content.
func TestBrokerIDs(t *testing.T) {
	t.Parallel()
	valid := func(t *testing.T, id string) {
		t.Helper()
		require.NotEmpty(t, id)
		require.LessOrEqual(t, len(id), 128)
		for _, c := range []byte(id) {
			require.True(t, c > 0x20 && c < 0x7f, "id %q has %q", id, c)
		}
	}
	base := idem.Message{EventID: "e-1", Tenant: "t", Type: "order.created", Payload: []byte(`{"n":1}`)}
	other := base
	other.Payload = []byte(`{"n":2}`)
	otherTenant := base
	otherTenant.Tenant = "u"
	require.Equal(t, idemsqs.DeduplicationID(base), idemsqs.DeduplicationID(base.Clone()))
	require.NotEqual(t, idemsqs.DeduplicationID(base), idemsqs.DeduplicationID(other))
	require.NotEqual(t, idemsqs.DeduplicationID(base), idemsqs.DeduplicationID(otherTenant))
	require.True(t, strings.HasPrefix(idemsqs.DeduplicationID(base), "e-1/"))
	for _, id := range []string{"e-1", strings.Repeat("x", 111), strings.Repeat("x", 112), "ünïcode", "with space", ""} {
		m := base
		m.EventID = id
		valid(t, idemsqs.DeduplicationID(m))
		valid(t, idemsqs.GroupID(id))
	}
	require.Equal(t, "order-1", idemsqs.GroupID("order-1"))
	require.NotEqual(t, idemsqs.GroupID("a b"), idemsqs.GroupID("a c"))
	require.Equal(t, "k", idemsqs.KeyOf(idem.Message{EventID: "e", Tenant: "t", Headers: map[string]string{idemsqs.AttrKey: "k"}}))
	require.Equal(t, "t/e", idemsqs.KeyOf(idem.Message{EventID: "e", Tenant: "t"}))
}
