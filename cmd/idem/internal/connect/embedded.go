package connect

import (
	"fmt"
	"net/url"
	"strings"
)

// Brokers that idem demo starts in-process when the URL's host is "embedded".
const (
	// BrokerPubSub is Google Cloud Pub/Sub, served by the in-process pstest server
	// (--broker pubsub://embedded).
	BrokerPubSub = "pubsub"
	// BrokerKafka is Apache Kafka, served by franz-go's in-process kfake cluster
	// (--broker kafka://embedded).
	BrokerKafka = "kafka"
	// EmbeddedHost is the host of a broker URL that asks idem demo to start the broker itself.
	EmbeddedHost = "embedded"
)

// embeddedSchemes are the schemes only accepted as SCHEME://embedded.
var embeddedSchemes = []string{BrokerPubSub, BrokerKafka}

// parseEmbedded parses SCHEME://embedded for the schemes of embeddedSchemes; ok is false for any
// other scheme. Other hosts are refused: the command connects to no real Pub/Sub or
// Kafka.
func parseEmbedded(raw string) (bu BrokerURL, ok bool, err error) {
	scheme, _, found := strings.Cut(raw, "://")
	if !found {
		return BrokerURL{}, false, nil
	}
	kind := ""
	for _, s := range embeddedSchemes {
		if strings.EqualFold(scheme, s) {
			kind = s
		}
	}
	if kind == "" {
		return BrokerURL{}, false, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return BrokerURL{}, true, fmt.Errorf("broker URL %q is not a valid URL: %s", redactDSN(raw), urlErr(err))
	}
	if !strings.EqualFold(u.Host, EmbeddedHost) || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return BrokerURL{}, true, fmt.Errorf("broker URL %q: only %s://%s is supported (an in-process server that idem demo starts)", redactDSN(raw), kind, EmbeddedHost)
	}
	return BrokerURL{Kind: kind, URL: kind + "://" + EmbeddedHost}, true, nil
}

// Embedded reports whether b is a broker that idem demo starts in-process.
func (b BrokerURL) Embedded() bool {
	for _, s := range embeddedSchemes {
		if b.Kind == s {
			return true
		}
	}
	return false
}
