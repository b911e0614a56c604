package connect

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/idemkit/idem/idemsqs"
)

// BrokerSQS is Amazon SQS or an SQS-compatible server (--broker
// sqs://[KEY_ID:SECRET@]HOST:PORT?region=REGION&tls=1&profile=PROFILE, or sqs://aws?region=REGION).
const BrokerSQS = "sqs"

// sqsRegionDefault is the region an sqs:// URL signs for when neither the URL nor the AWS
// configuration names one.
const sqsRegionDefault = "us-east-1"

// sqsHostAWS is the host of an sqs:// URL that means AWS's own SQS endpoint for the region,
// which the SDK resolves (https).
const sqsHostAWS = "aws"

// SQSEndpoint is what an sqs:// broker URL names: the endpoint, the region to sign for, and where
// the credentials come from. Keys in the URL are used as they are. Without keys, a local endpoint
// (localhost, a loopback address: an emulator such as moto_server) takes AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, else static test credentials that an emulator
// accepts; any other endpoint (and any URL with profile=) uses the AWS SDK's default chain.
type SQSEndpoint struct {
	// Endpoint is the base URL of the SQS API; empty for sqs://aws, where the SDK resolves AWS's
	// endpoint for the region.
	Endpoint string
	// Region is the region to sign for: the URL's region=, else (with Chain) the AWS
	// configuration's, else us-east-1.
	Region string
	// Profile is the shared-configuration profile the URL names (profile=); with Chain only.
	Profile string
	// Chain is true when the credentials come from the AWS SDK's default chain: environment,
	// shared configuration and credentials files (AWS_PROFILE or profile=), SSO, web identity,
	// and the container or instance role.
	Chain bool
	// Credentials are the static credentials when Chain is false.
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

// ParseSQS reads an sqs://[KEY_ID:SECRET@]HOST:PORT?region=REGION&tls=1&profile=PROFILE URL:
// HOST:PORT is the endpoint (http, or https with tls=1), or the host aws for AWS's own endpoint
// of the region (sqs://aws?region=eu-west-1). See SQSEndpoint for where credentials come from.
func ParseSQS(raw string) (SQSEndpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return SQSEndpoint{}, fmt.Errorf("broker URL %q is not a valid URL: %s", redactDSN(raw), urlErr(err))
	}
	if u.Host == "" {
		return SQSEndpoint{}, fmt.Errorf("broker URL %q has no host: use sqs://HOST:PORT?region=REGION, or sqs://aws?region=REGION for AWS", redactDSN(raw))
	}
	if u.Path != "" && u.Path != "/" {
		return SQSEndpoint{}, fmt.Errorf("broker URL %q has a path; the queue is the outbox topic, not part of the URL", redactDSN(raw))
	}
	q, err := parseQuery(u.RawQuery)
	if err != nil {
		return SQSEndpoint{}, fmt.Errorf("broker URL %q: %w", redactDSN(raw), err)
	}
	onAWS := strings.EqualFold(u.Host, sqsHostAWS)
	e := SQSEndpoint{Endpoint: "http://" + u.Host}
	if onAWS {
		e.Endpoint = ""
	}
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch k {
		case "region":
			if v == "" {
				return SQSEndpoint{}, fmt.Errorf("broker URL %q: region is empty", redactDSN(raw))
			}
			e.Region = v
		case "profile":
			if v == "" {
				return SQSEndpoint{}, fmt.Errorf("broker URL %q: profile is empty", redactDSN(raw))
			}
			e.Profile = v
		case "tls":
			switch strings.ToLower(v) {
			case "1", "true":
				if !onAWS {
					e.Endpoint = "https://" + u.Host
				}
			case "0", "false":
				if onAWS {
					return SQSEndpoint{}, fmt.Errorf("broker URL %q: tls=%s, but AWS's endpoint is https only", redactDSN(raw), v)
				}
			default:
				return SQSEndpoint{}, fmt.Errorf("broker URL %q: tls=%q, want 1 or 0", redactDSN(raw), v)
			}
		default:
			return SQSEndpoint{}, fmt.Errorf("broker URL %q: unknown parameter %q (want region, tls or profile)", redactDSN(raw), k)
		}
	}
	switch {
	case u.User != nil:
		secret, _ := u.User.Password()
		if u.User.Username() == "" || secret == "" {
			return SQSEndpoint{}, fmt.Errorf("broker URL %q: credentials need KEY_ID:SECRET", redactDSN(raw))
		}
		if e.Profile != "" {
			return SQSEndpoint{}, fmt.Errorf("broker URL %q: profile=%s and keys both given; keep one", redactDSN(raw), e.Profile)
		}
		e.Credentials = aws.Credentials{AccessKeyID: u.User.Username(), SecretAccessKey: secret, Source: "broker URL"}
	case e.Profile != "" || !isLocalHost(u.Hostname()):
		e.Chain = true
	case os.Getenv("AWS_ACCESS_KEY_ID") != "":
		e.Credentials = aws.Credentials{AccessKeyID: os.Getenv("AWS_ACCESS_KEY_ID"), SecretAccessKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
			SessionToken: os.Getenv("AWS_SESSION_TOKEN"), Source: "environment"}
	default:
		e.Credentials = aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "idem's static test credentials"}
	}
	if !e.Chain && e.Region == "" {
		e.Region = sqsRegionDefault
	}
	return e, nil
}

// isLocalHost reports whether host is localhost or a loopback address: an emulator on this
// machine, never an AWS endpoint whose role or profile would apply.
func isLocalHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// Config returns the AWS configuration of the endpoint: its static credentials and region, or,
// with Chain, what the SDK's default chain loads (environment, shared files and profile, region),
// with the URL's region first. Loading reads the environment and files only; the chain resolves
// SSO, web identity and instance-role credentials when a request first needs them.
func (e SQSEndpoint) Config(ctx context.Context) (aws.Config, error) {
	if !e.Chain {
		creds := e.Credentials
		return aws.Config{
			Region:      e.Region,
			Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return creds, nil }),
		}, nil
	}
	var opts []func(*config.LoadOptions) error
	if e.Region != "" {
		opts = append(opts, config.WithRegion(e.Region))
	}
	if e.Profile != "" {
		opts = append(opts, config.WithSharedConfigProfile(e.Profile))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = sqsRegionDefault
	}
	return cfg, nil
}

// NewSQSClient returns an SQS client for an sqs:// URL that ParseBroker accepted.
func NewSQSClient(bu BrokerURL) (*sqs.Client, error) {
	e, err := ParseSQS(bu.URL)
	if err != nil {
		return nil, err
	}
	// Loading the configuration reads only the environment and files: no request to cancel.
	cfg, err := e.Config(context.Background())
	if err != nil {
		return nil, fmt.Errorf("broker %s: %w", bu, err)
	}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if e.Endpoint != "" {
			o.BaseEndpoint = aws.String(e.Endpoint)
		}
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
