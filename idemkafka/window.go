package idemkafka

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// RedeliveryWindowUnbounded is the redelivery window of a topic that keeps records forever
// (retention.ms -1, or compacted) or whose configuration could not be read: a group's offsets
// can be reset to any record still in the log, so no claim retention covers it. It is 100 years
// rather than the largest Duration, so that adding a retry budget cannot overflow.
const RedeliveryWindowUnbounded = 100 * 365 * 24 * time.Hour

// RedeliveryWindow is how long after publishing the topic can deliver the same event again, as
// NewSource read it: the longest retention.ms of the topic and its retry topics. A record stays
// in the log, and an operator can reset the group's offsets to it, for its topic's retention;
// a retry copy is published within the retry policy's budget, which the consumer's retention
// check adds on its own. The consumer refuses a source whose window exceeds its
// RedeliveryWindow (idem.RedeliveryWindower).
func (s *Source) RedeliveryWindow() time.Duration { return s.window }

// readWindow asks the cluster for the retention of topics and returns the redelivery window.
func readWindow(ctx context.Context, cl *kgo.Client, topics []string) time.Duration {
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, t := range topics {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType = kmsg.ConfigResourceTypeTopic
		r.ResourceName = t
		r.ConfigNames = []string{"retention.ms", "cleanup.policy"}
		req.Resources = append(req.Resources, r)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return RedeliveryWindowUnbounded
	}
	var longest time.Duration
	for _, res := range resp.Resources {
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			if res.ResourceName == topics[0] {
				return RedeliveryWindowUnbounded // the topic itself must be readable
			}
			continue // a retry topic that does not exist holds nothing
		}
		ms := int64(-1)
		for _, c := range res.Configs {
			if c.Value == nil {
				continue
			}
			switch c.Name {
			case "retention.ms":
				if v, err := strconv.ParseInt(*c.Value, 10, 64); err == nil {
					ms = v
				}
			case "cleanup.policy":
				if strings.Contains(*c.Value, "compact") {
					return RedeliveryWindowUnbounded
				}
			}
		}
		if ms < 0 || ms > int64(RedeliveryWindowUnbounded/time.Millisecond) {
			return RedeliveryWindowUnbounded
		}
		longest = max(longest, time.Duration(ms)*time.Millisecond)
	}
	return longest
}
