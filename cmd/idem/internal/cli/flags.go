package cli

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// day is the unit operators think of retention in; time.ParseDuration has nothing above hours.
const day = 24 * time.Hour

// durationValue is a pflag.Value for durations that also accepts days: "7d", "1d12h", "90m".
type durationValue struct{ d *time.Duration }

var _ pflag.Value = durationValue{}

func newDuration(p *time.Duration, def time.Duration) durationValue {
	*p = def
	return durationValue{p}
}

func (v durationValue) String() string {
	if v.d == nil || *v.d == 0 {
		return "0" // pflag shows no default for "0"
	}
	return formatDuration(*v.d)
}

func (v durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (v durationValue) Type() string { return "duration" }

// parseDuration parses a Go duration with an optional leading number of days ("7d", "2d6h").
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	orig := s
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		n, err := strconv.ParseUint(s[:i], 10, 31)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q (want e.g. 7d, 36h, 1d12h, 90s)", orig)
		}
		days = time.Duration(n) * day
		s = s[i+1:]
	}
	var rest time.Duration
	if s != "" || days == 0 {
		var err error
		if rest, err = time.ParseDuration(s); err != nil || rest < 0 {
			return 0, fmt.Errorf("invalid duration %q (want e.g. 7d, 36h, 1d12h, 90s)", orig)
		}
	}
	d := days + rest
	if neg {
		d = -d
	}
	return d, nil
}

// formatDuration writes whole days as "7d" and everything else as Go does.
func formatDuration(d time.Duration) string {
	if d != 0 && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	return d.String()
}

// storeFlag adds --store to cmd. An empty value means "$IDEM_STORE, else StoreDefault", resolved
// by resolveStore; the default is not put in the flag so that help never prints a password
// from the environment.
func storeFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "store", "",
		"store DSN: sqlite://PATH, postgres://USER:PASSWORD@HOST:PORT/DB[?idem_schema=NAME] or mysql://USER:PASSWORD@HOST:PORT/DB (default $"+StoreEnv+", else "+StoreDefault+")")
}

// resolveStore returns the store DSN to use for flag value v.
func (e *env) resolveStore(v string) string {
	if strings.TrimSpace(v) != "" {
		return v
	}
	if s := strings.TrimSpace(e.getenv(StoreEnv)); s != "" {
		return s
	}
	return StoreDefault
}

// brokerFlag adds --broker to cmd with default "sql".
func brokerFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "broker", "sql", "broker: sql (the queue table in the store), nats://HOST:PORT, amqp://USER:PASSWORD@HOST:PORT/VHOST, redis://USER:PASSWORD@HOST:PORT/DB or sqs://HOST:PORT?region=REGION&tls=1 or sqs://aws?region=REGION (SQS, or an emulator such as moto_server on localhost; credentials from KEY_ID:SECRET@ in the URL, else the AWS default chain: environment, profile=/AWS_PROFILE, SSO, web identity, instance role)")
}

// jsonFlag adds --json to cmd.
func jsonFlag(cmd *cobra.Command, p *bool) {
	cmd.Flags().BoolVar(p, "json", false, "print JSON instead of a table")
}

// actorFlag adds --actor to cmd.
func actorFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVar(p, "actor", "", "who does this, recorded in the audit trail (asserted, not authenticated: your OS user is recorded beside it; default: your OS user name, else $USER)")
}

// resolveActor returns --actor, or the operator's user name. --actor is asserted, not
// authenticated, so when it names someone other than the OS user the audit row records both:
// "alice (os:root)".
func (e *env) resolveActor(v string) (string, error) {
	if v = strings.TrimSpace(v); v != "" {
		os := strings.TrimSpace(e.username())
		if os == "" {
			os = strings.TrimSpace(e.getenv("USER"))
		}
		if os != "" && os != v {
			v += " (os:" + os + ")"
		}
		return v, nil
	}
	if u := strings.TrimSpace(e.username()); u != "" {
		return u, nil
	}
	if u := strings.TrimSpace(e.getenv("USER")); u != "" {
		return u, nil
	}
	return "", usagef("cannot tell who you are for the audit trail: pass --actor NAME")
}

// idsValue is a pflag.Value collecting dead-letter ids from repeated or comma-separated flags.
type idsValue struct{ ids *[]int64 }

var _ pflag.Value = idsValue{}

func (v idsValue) String() string {
	if v.ids == nil {
		return ""
	}
	parts := make([]string, len(*v.ids))
	for i, id := range *v.ids {
		parts[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(parts, ",")
}

func (v idsValue) Set(s string) error {
	for part := range strings.SplitSeq(s, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil || id < 1 {
			return fmt.Errorf("%q is not a dead-letter id (want a positive number, as dlq list shows)", part)
		}
		*v.ids = append(*v.ids, id)
	}
	return nil
}

func (v idsValue) Type() string { return "ID" }
