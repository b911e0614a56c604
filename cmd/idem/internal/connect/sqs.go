package connect

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemkit/idem/idemsqs"
)

// BrokerSQS is Amazon SQS or an SQS-compatible server (--broker
// sqs://[KEY_ID:SECRET@]HOST:PORT?region=REGION&tls=1).
const BrokerSQS = "sqs"

// sqsRegionDefault is the region an sqs:// URL without region= signs for.
const sqsRegionDefault = "us-east-1"

// SQSEndpoint is what an sqs:// broker URL names: the endpoint, the region to sign for, and the
// credentials (from the URL, else AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN,
// else static test credentials, which an emulator such as moto_server accepts).
type SQSEndpoint struct {
	Endpoint    string
	Region      string
	Credentials aws.Credentials
}

// parseSQS parses an sqs:// broker URL; ok is false for any other scheme.
func parseSQS(raw string) (bu BrokerURL, ok bool, err error) {
	scheme, _, found := strings.Cut(raw, "://")
	if !found || !strings.EqualFold(scheme, "sqs") {
		return BrokerURL{}, false, nil
	}
	if _, err := ParseSQS(raw); err != nil {
		return BrokerURL{}, true, err
	}
	return BrokerURL{Kind: BrokerSQS, URL: raw}, true, nil
}

// ParseSQS reads an sqs://[KEY_ID:SECRET@]HOST:PORT?region=REGION&tls=1 URL: HOST:PORT is the
// endpoint (http, or https with tls=1; for AWS itself sqs.REGION.amazonaws.com:443 with tls=1),
// region defaults to us-east-1.
func ParseSQS(raw string) (SQSEndpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return SQSEndpoint{}, fmt.Errorf("broker URL %q is not a valid URL: %s", redactDSN(raw), urlErr(err))
	}
	if u.Host == "" {
		return SQSEndpoint{}, fmt.Errorf("broker URL %q has no host: use sqs://HOST:PORT?region=REGION", redactDSN(raw))
	}
	if u.Path != "" && u.Path != "/" {
		return SQSEndpoint{}, fmt.Errorf("broker URL %q has a path; the queue is the outbox topic, not part of the URL", redactDSN(raw))
	}
	q, err := parseQuery(u.RawQuery)
	if err != nil {
		return SQSEndpoint{}, fmt.Errorf("broker URL %q: %w", redactDSN(raw), err)
	}
	e := SQSEndpoint{Endpoint: "http://" + u.Host, Region: sqsRegionDefault}
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch k {
		case "region":
			if v == "" {
				return SQSEndpoint{}, fmt.Errorf("broker URL %q: region is empty", redactDSN(raw))
			}
			e.Region = v
		case "tls":
			switch strings.ToLower(v) {
			case "1", "true":
				e.Endpoint = "https://" + u.Host
			case "0", "false":
			default:
				return SQSEndpoint{}, fmt.Errorf("broker URL %q: tls=%q, want 1 or 0", redactDSN(raw), v)
			}
		default:
			return SQSEndpoint{}, fmt.Errorf("broker URL %q: unknown parameter %q (want region or tls)", redactDSN(raw), k)
		}
	}
	switch {
	case u.User != nil:
		secret, _ := u.User.Password()
		if u.User.Username() == "" || secret == "" {
			return SQSEndpoint{}, fmt.Errorf("broker URL %q: credentials need KEY_ID:SECRET", redactDSN(raw))
		}
		e.Credentials = aws.Credentials{AccessKeyID: u.User.Username(), SecretAccessKey: secret, Source: "broker URL"}
	case os.Getenv("AWS_ACCESS_KEY_ID") != "":
		e.Credentials = aws.Credentials{AccessKeyID: os.Getenv("AWS_ACCESS_KEY_ID"), SecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
			SessionToken: os.Getenv("AWS_SESSION_TOKEN"), Source: "environment"}
	default:
		e.Credentials = aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "idem's static test credentials"}
	}
	return e, nil
}

// NewSQSClient returns an SQS client for an sqs:// URL that ParseBroker accepted.
func NewSQSClient(bu BrokerURL) (*sqs.Client, error) {
	e, err := ParseSQS(bu.URL)
	if err != nil {
		return nil, err
	}
	creds := e.Credentials
	return sqs.New(sqs.Options{
		Region:       e.Region,
		BaseEndpoint: aws.String(e.Endpoint),
		Credentials:  aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return creds, nil }),
	}), nil
}

// openSQS returns a sink on the SQS endpoint after checking that it answers. The sink sends the
// outbox topic's events to the queue of that name, which must exist.
func openSQS(ctx context.Context, bu BrokerURL) (*idemsqs.Sink, error) {
	client, err := NewSQSClient(bu)
	if err != nil {
		return nil, err
	}
	if _, err := client.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)}); err != nil {
		return nil, fmt.Errorf("broker %s is unreachable: %s", bu, redactErr(err))
	}
	return idemsqs.NewSink(client, idemsqs.SinkConfig{})
}
