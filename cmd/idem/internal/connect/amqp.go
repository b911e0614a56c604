package connect

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/idemkit/idem/idemamqp"
)

// BrokerAMQP is RabbitMQ (--broker amqp://USER:PASSWORD@HOST:PORT/VHOST, or amqps://).
const BrokerAMQP = "amqp"

// parseAMQP parses an amqp:// or amqps:// broker URL; ok is false for any other scheme.
func parseAMQP(raw string) (bu BrokerURL, ok bool, err error) {
	scheme, _, found := strings.Cut(raw, "://")
	if !found || !strings.EqualFold(scheme, "amqp") && !strings.EqualFold(scheme, "amqps") {
		return BrokerURL{}, false, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return BrokerURL{}, true, fmt.Errorf("broker URL %q is not a valid URL: %s", redactDSN(raw), urlErr(err))
	}
	if u.Host == "" {
		return BrokerURL{}, true, fmt.Errorf("broker URL %q has no host: use amqp://USER:PASSWORD@HOST:PORT/VHOST", redactDSN(raw))
	}
	return BrokerURL{Kind: BrokerAMQP, URL: raw}, true, nil
}

// openAMQP connects a publisher-confirm sink to RabbitMQ. The sink publishes to the default
// exchange with the outbox topic as routing key, so the topic names the queue; it dials again
// by itself after a lost connection, so Reconnect needs nothing more.
func openAMQP(ctx context.Context, bu BrokerURL, opts BrokerOptions) (*idemamqp.Sink, error) {
	name := opts.Name
	if name == "" {
		name = "idem"
	}
	sink, err := idemamqp.NewSink(ctx, idemamqp.DialURL(bu.URL, name), idemamqp.SinkConfig{})
	if err != nil {
		// The error names the broker already (with its password masked).
		if isAuthFailure(err) {
			return nil, fmt.Errorf("broker rejected the credentials (check the user and password in the URL): %s", redactErr(err))
		}
		return nil, fmt.Errorf("broker is unreachable: %s", redactErr(err))
	}
	return sink, nil
}
