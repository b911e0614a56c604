package wire_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idem/wire"
)

// TestNamesAreTheContract pins every wire name: renaming one breaks producers and consumers
// running another version, so a change here must be deliberate (and documented).
func TestNamesAreTheContract(t *testing.T) {
	t.Parallel()
	names := map[string]string{
		"EventID": wire.EventID, "Tenant": wire.Tenant, "Type": wire.Type, "OccurredAt": wire.OccurredAt,
		"Key": wire.Key, "Attempt": wire.Attempt, "RetryAt": wire.RetryAt, "PublishedAt": wire.PublishedAt,
		"DecodeError": wire.DecodeError, "BrokerMsgID": wire.BrokerMsgID, "BodyEncoding": wire.BodyEncoding,
		"UntrustedTenant": wire.UntrustedTenant, "InvalidIdentity": wire.InvalidIdentity,
		"EventIDSHA256": wire.EventIDSHA256, "ReplayOf": wire.ReplayOf, "ReplayedBy": wire.ReplayedBy,
		"ReplayEventTime": wire.ReplayEventTime, "ReplayNewEventOf": wire.ReplayNewEventOf,
		"WebhookProvider": wire.WebhookProvider, "IdempotencyKey": wire.IdempotencyKey,
		"Signature": wire.Signature, "ReplaySignature": wire.ReplaySignature, "HTTPSignature": wire.HTTPSignature,
	}
	want := map[string]string{
		"EventID": "Idem-Event-Id", "Tenant": "Idem-Tenant", "Type": "Idem-Type", "OccurredAt": "Idem-Occurred-At",
		"Key": "Idem-Key", "Attempt": "Idem-Attempt", "RetryAt": "Idem-Retry-At", "PublishedAt": "Idem-Published-At",
		"DecodeError": "Idem-Decode-Error", "BrokerMsgID": "Idem-Broker-Msg-Id", "BodyEncoding": "Idem-Body-Encoding",
		"UntrustedTenant": "Idem-Untrusted-Tenant", "InvalidIdentity": "Idem-Invalid-Identity",
		"EventIDSHA256": "Idem-Event-Id-Sha256", "ReplayOf": "Idem-Replay-Of", "ReplayedBy": "Idem-Replayed-By",
		"ReplayEventTime": "Idem-Replay-Event-Time", "ReplayNewEventOf": "Idem-Replay-New-Event-Of",
		"WebhookProvider": "Idem-Webhook-Provider", "IdempotencyKey": "Idempotency-Key",
		"Signature": "Idem-Signature", "ReplaySignature": "Idem-Replay-Signature", "HTTPSignature": "Idem-Http-Signature",
	}
	assert.Equal(t, want, names)

	// Distinct names: two meanings never share one header, case-insensitively (HTTP and
	// some brokers canonicalise case).
	seen := map[string]string{}
	for id, name := range names {
		k := strings.ToLower(name)
		if other, ok := seen[k]; ok {
			t.Errorf("%s and %s are both %q", id, other, name)
		}
		seen[k] = id
	}
	for _, id := range []string{"ReplayOf", "ReplayedBy", "ReplayEventTime", "ReplayNewEventOf", "ReplaySignature"} {
		assert.True(t, strings.HasPrefix(names[id], wire.ReplayPrefix), "%s must start with ReplayPrefix: a replay signature covers the Idem-Replay* headers", id)
	}
}

// TestSignatureFormatsAreDistinct checks that no two signature kinds share a field tag or a MAC
// domain, so one kind can never parse, let alone verify, as another.
func TestSignatureFormatsAreDistinct(t *testing.T) {
	t.Parallel()
	assert.NotEqual(t, wire.Signature, wire.HTTPSignature)
	tags := []string{wire.SignatureFieldV1, wire.SignatureFieldV2, wire.HTTPSignatureFieldH1}
	domains := []string{wire.SignatureDomainV1, wire.SignatureDomainV2, wire.HTTPSignatureDomainH1}
	for i := range tags {
		for j := i + 1; j < len(tags); j++ {
			assert.NotEqual(t, tags[i], tags[j])
			assert.NotEqual(t, domains[i], domains[j])
		}
	}
}
