package idemsqs_test

import (
	"bytes"
	"maps"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsqs"
)

// FuzzDecode: Decode never panics on attributes from any producer, returns an event id exactly
// when it reports no error, and whatever Encode accepts decodes to the same message.
func FuzzDecode(f *testing.F) {
	f.Add("e-1", "t", "order.created", []byte(`{"a":1}`), "Trace-Id", "String", "x", "2", "1767225600000", int64(1700000000123456789))
	f.Add("", "", "", []byte{0, 0xff}, idemsqs.AttrEventID, "Binary", "forged", "x", "-1", int64(0))
	f.Add("é", "", "", []byte(nil), idemsqs.AttrBodyEncoding, "String", "base64", "", "", int64(-1))
	f.Add("e", "", "", []byte("!!"), idemsqs.AttrOccurredAt, "Number", "12", "0", "9999999999999999999", int64(1))
	f.Fuzz(func(t *testing.T, id, tenant, typ string, payload []byte, name, dataType, value, count, sent string, occurred int64) {
		// Anything a foreign producer or a broken broker could hand over.
		attr := types.MessageAttributeValue{DataType: aws.String(dataType), StringValue: aws.String(value)}
		if dataType == "Binary" {
			attr = types.MessageAttributeValue{DataType: aws.String(dataType), BinaryValue: []byte(value)}
		}
		raw := types.Message{
			Body:              aws.String(string(payload)),
			MessageAttributes: map[string]types.MessageAttributeValue{name: attr, idemsqs.AttrEventID: {DataType: aws.String("String"), StringValue: aws.String(id)}},
			Attributes:        map[string]string{"ApproximateReceiveCount": count, "SentTimestamp": sent},
		}
		m, err := idemsqs.Decode(raw)
		if (err == nil) != (m.EventID != "") {
			t.Fatalf("Decode = event id %q, error %v: an event id comes exactly with no error", m.EventID, err)
		}
		if m.Attempt < 1 {
			t.Fatalf("Decode: Attempt %d, want at least 1", m.Attempt)
		}

		msg := idem.Message{EventID: id, Tenant: tenant, Type: typ, Payload: payload, Headers: map[string]string{name: value}}
		if occurred != 0 {
			msg.OccurredAt = time.Unix(0, occurred).UTC()
		}
		e, err := idemsqs.Encode(msg)
		if err != nil {
			return
		}
		if !utf8Text(e.Body) {
			t.Fatalf("Encode body %q is not text SQS accepts", e.Body)
		}
		got, err := idemsqs.Decode(types.Message{Body: aws.String(e.Body), MessageAttributes: e.Attributes})
		if err != nil {
			t.Fatalf("Decode(Encode(%+v)): %v", msg, err)
		}
		if got.EventID != msg.EventID || got.Tenant != msg.Tenant || got.Type != msg.Type || !bytes.Equal(got.Payload, msg.Payload) || !got.OccurredAt.Equal(msg.OccurredAt) {
			t.Fatalf("round trip changed the message: sent %+v, got %+v", msg, got)
		}
		want := maps.Clone(msg.Headers)
		switch name {
		case idemsqs.AttrEventID, idemsqs.AttrTenant, idemsqs.AttrType, idemsqs.AttrOccurredAt, idemsqs.AttrBodyEncoding, idemsqs.AttrDecodeError:
			delete(want, name) // mapped names never pass as headers
		}
		if value == "" {
			delete(want, name) // SQS refuses empty values: the header is left out
		}
		if len(want) == 0 {
			want = nil
		}
		if !maps.Equal(got.Headers, want) {
			t.Fatalf("headers: sent %v, got %v", want, got.Headers)
		}
	})
}

// utf8Text reports whether s is valid UTF-8 without the control characters SQS refuses.
func utf8Text(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 && r != '\t' && r != '\n' && r != '\r' {
			return false
		}
	}
	return true
}
