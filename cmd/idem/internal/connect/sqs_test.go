package connect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/require"
)

// clearAWSEnv points the AWS SDK's configuration at files that do not exist and unsets its
// variables, so the chain sees only what a test gives it and never asks an instance role.
func clearAWSEnv(t *testing.T) {
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_DEFAULT_PROFILE": "", "AWS_REGION": "", "AWS_DEFAULT_REGION": "", "AWS_ROLE_ARN": "",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "",
		"AWS_CONFIG_FILE": filepath.Join(dir, "config"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
}

func TestParseBrokerSQS(t *testing.T) {
	clearAWSEnv(t)
	for _, tc := range []struct {
		raw, endpoint, region, keyID, profile, err string
		chain                                      bool
	}{
		{raw: "sqs://127.0.0.1:5000", endpoint: "http://127.0.0.1:5000", region: "us-east-1", keyID: "test"},
		{raw: "SQS://127.0.0.1:5000/", endpoint: "http://127.0.0.1:5000", region: "us-east-1", keyID: "test"},
		{raw: "sqs://localhost:4566", endpoint: "http://localhost:4566", region: "us-east-1", keyID: "test"},
		{raw: "sqs://[::1]:5000", endpoint: "http://[::1]:5000", region: "us-east-1", keyID: "test"},
		{raw: "sqs://sqs.eu-west-1.amazonaws.com:443?region=eu-west-1&tls=1", endpoint: "https://sqs.eu-west-1.amazonaws.com:443", region: "eu-west-1", chain: true},
		{raw: "sqs://aws?region=eu-west-1", region: "eu-west-1", chain: true},
		{raw: "sqs://aws?tls=1&profile=prod", profile: "prod", chain: true},
		{raw: "sqs://127.0.0.1:5000?profile=dev", endpoint: "http://127.0.0.1:5000", profile: "dev", chain: true},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000?region=eu-central-1", endpoint: "http://127.0.0.1:5000", region: "eu-central-1", keyID: "AKIA1"},
		{raw: "sqs://AKIA1:s3cret@sqs.eu-west-1.amazonaws.com:443?tls=1", endpoint: "https://sqs.eu-west-1.amazonaws.com:443", region: "us-east-1", keyID: "AKIA1"},
		{raw: "sqs://", err: "has no host"},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000/orders", err: "has a path"},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000?tls=maybe", err: `tls="maybe"`},
		{raw: "sqs://aws?tls=0", err: "https only"},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000?queue=x", err: `unknown parameter "queue"`},
		{raw: "sqs://AKIA1:s3cret@127.0.0.1:5000?region=", err: "region is empty"},
		{raw: "sqs://aws?profile=", err: "profile is empty"},
		{raw: "sqs://AKIA1:s3cret@aws?profile=prod", err: "profile=prod and keys both given"},
		{raw: "sqs://AKIA1@127.0.0.1:5000", err: "KEY_ID:SECRET"},
	} {
		bu, err := ParseBroker(tc.raw)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.raw)
			require.NotContains(t, err.Error(), "s3cret", "the secret is masked")
			continue
		}
		require.NoError(t, err, tc.raw)
		require.Equal(t, BrokerSQS, bu.Kind)
		require.NotContains(t, bu.String(), "s3cret", "the secret is masked")
		e, err := ParseSQS(bu.URL)
		require.NoError(t, err)
		require.Equal(t, tc.endpoint, e.Endpoint, tc.raw)
		require.Equal(t, tc.region, e.Region, tc.raw)
		require.Equal(t, tc.chain, e.Chain, tc.raw)
		require.Equal(t, tc.profile, e.Profile, tc.raw)
		require.Equal(t, tc.keyID, e.Credentials.AccessKeyID, tc.raw)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIAENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "envsecret")
	e, err := ParseSQS("sqs://127.0.0.1:5000")
	require.NoError(t, err)
	require.Equal(t, "AKIAENV", e.Credentials.AccessKeyID, "a local endpoint takes credentials from the environment")
}

// TestSQSConfigChain: an sqs:// URL without keys on a remote endpoint gets its credentials and
// region from the AWS default chain (environment first, then the shared files and the profile),
// the URL's region wins over the configuration's, and a URL's keys or a local endpoint bypass
// the chain. Only files and variables are read: no request leaves the machine.
func TestSQSConfigChain(t *testing.T) {
	clearAWSEnv(t)
	dir := t.TempDir()
	cfgFile, credFile := filepath.Join(dir, "config"), filepath.Join(dir, "credentials")
	require.NoError(t, os.WriteFile(cfgFile, []byte("[default]\nregion = eu-north-1\n\n[profile prod]\nregion = ap-southeast-2\n"), 0o600))
	require.NoError(t, os.WriteFile(credFile, []byte("[default]\naws_access_key_id = AKIADEFAULT\naws_secret_access_key = d\n\n[prod]\naws_access_key_id = AKIAPROD\naws_secret_access_key = p\n"), 0o600))
	t.Setenv("AWS_CONFIG_FILE", cfgFile)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", credFile)
	for _, tc := range []struct {
		name, raw, env, region, keyID, source string
	}{
		{name: "default profile", raw: "sqs://aws", region: "eu-north-1", keyID: "AKIADEFAULT"},
		{name: "named profile", raw: "sqs://aws?profile=prod", region: "ap-southeast-2", keyID: "AKIAPROD"},
		{name: "URL region wins", raw: "sqs://aws?profile=prod&region=us-west-2", region: "us-west-2", keyID: "AKIAPROD"},
		{name: "environment before files", raw: "sqs://sqs.eu-west-1.amazonaws.com:443?tls=1", env: "AKIAENV", region: "eu-north-1", keyID: "AKIAENV"},
		{name: "URL keys bypass the chain", raw: "sqs://AKIAURL:u@aws?region=eu-west-3", region: "eu-west-3", keyID: "AKIAURL", source: "broker URL"},
		{name: "local endpoint bypasses the chain", raw: "sqs://127.0.0.1:5000", region: "us-east-1", keyID: "test", source: "idem's static test credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("AWS_ACCESS_KEY_ID", tc.env)
			t.Setenv("AWS_SECRET_ACCESS_KEY", tc.env)
			e, err := ParseSQS(tc.raw)
			require.NoError(t, err)
			cfg, err := e.Config(t.Context())
			require.NoError(t, err)
			require.Equal(t, tc.region, cfg.Region)
			creds, err := cfg.Credentials.Retrieve(t.Context())
			require.NoError(t, err)
			require.Equal(t, tc.keyID, creds.AccessKeyID)
			if tc.source != "" {
				require.Equal(t, tc.source, creds.Source)
			}
			client, err := NewSQSClient(BrokerURL{Kind: BrokerSQS, URL: tc.raw})
			require.NoError(t, err)
			require.Equal(t, tc.region, client.Options().Region)
			if e.Endpoint != "" {
				require.Equal(t, e.Endpoint, aws.ToString(client.Options().BaseEndpoint))
			} else {
				require.Nil(t, client.Options().BaseEndpoint, "sqs://aws leaves the endpoint to the SDK")
			}
		})
	}
	e, err := ParseSQS("sqs://aws?profile=missing")
	require.NoError(t, err)
	_, err = e.Config(t.Context())
	require.ErrorContains(t, err, "missing", "a profile the files lack is named")
}

// TestOpenBrokerSQSUnreachable: an endpoint nobody listens on fails OpenBroker, naming the
// broker once and masking its secret.
func TestOpenBrokerSQSUnreachable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := OpenBroker(ctx, "sqs://AKIA1:s3cret@127.0.0.1:1", nil, BrokerOptions{})
	require.ErrorContains(t, err, "is unreachable")
	require.NotContains(t, err.Error(), "s3cret")
	require.Equal(t, 1, strings.Count(err.Error(), "sqs://"), "the broker is named once: %v", err)
}
