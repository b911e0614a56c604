package idemsqs

import (
	"errors"
	"fmt"
	"time"
)

// Defaults and bounds of SourceConfig, from SQS's own limits.
const (
	// LeaseDefault is the visibility timeout a Source gives what it receives when
	// SourceConfig.Lease is zero.
	LeaseDefault = 30 * time.Second
	// LeaseMax is the longest visibility timeout SQS accepts (12 hours). SQS also bounds the
	// total: a message stays invisible at most 12 hours after it was received, however often
	// its visibility is changed, which bounds Extend and Nak's delay too.
	LeaseMax = 12 * time.Hour
	// WaitDefault is SourceConfig.Wait's default: SQS's longest long poll.
	WaitDefault = 20 * time.Second
	// WaitMax is the longest long poll SQS accepts (WaitTimeSeconds 20).
	WaitMax = 20 * time.Second
	// ReceiveMax is the most messages one ReceiveMessage call returns.
	ReceiveMax = 10
	// SendBatchMax is the most messages one SendMessageBatch call carries.
	SendBatchMax = 10
	// SendBatchBytesMax bounds the bytes (bodies and attributes) of one SendMessageBatch call:
	// 256 KiB, SQS's long-standing bound (raised to 1 MiB in 2025), so batches fit any endpoint.
	SendBatchBytesMax = 256 << 10
	// PublishTimeoutDefault bounds a Publish whose context has no deadline, so a lost endpoint
	// fails the publish instead of hanging the relay.
	PublishTimeoutDefault = 60 * time.Second
)

// SourceConfig configures a Source.
type SourceConfig struct {
	// QueueURL is the queue to receive from (required), as GetQueueUrl returns it.
	QueueURL string
	// Lease is the visibility timeout each message gets when received and at each Extend, from
	// 1s to LeaseMax; default LeaseDefault. SQS counts visibility in whole seconds, so a
	// fraction is rounded up, and the Source reports the rounded lease.
	Lease time.Duration
	// Wait is the long poll of one ReceiveMessage call, in whole seconds up to WaitMax
	// (default WaitDefault): SQS answers at once when messages are available, otherwise when
	// one arrives or the wait passes. Shorter waits cost more (empty) requests.
	Wait time.Duration
}

// WithDefaults returns c with zero fields set to their defaults and Lease rounded up to whole
// seconds.
func (c SourceConfig) WithDefaults() SourceConfig {
	if c.Lease == 0 {
		c.Lease = LeaseDefault
	}
	if c.Lease > 0 && c.Lease <= LeaseMax {
		c.Lease = time.Duration(seconds(c.Lease)) * time.Second
	}
	if c.Wait == 0 {
		c.Wait = WaitDefault
	}
	return c
}

// validate refuses settings SQS cannot honour.
func (c SourceConfig) validate() error {
	switch {
	case c.QueueURL == "":
		return errors.New("SourceConfig.QueueURL is empty")
	case c.Lease <= 0 || c.Lease > LeaseMax:
		return fmt.Errorf("SourceConfig.Lease is %v; SQS visibility timeouts are from 1s to %v", c.Lease, LeaseMax)
	case c.Wait < 0 || c.Wait > WaitMax:
		return fmt.Errorf("SourceConfig.Wait is %v; SQS long polls are from 0 to %v", c.Wait, WaitMax)
	}
	return nil
}

// seconds is d in whole seconds for a visibility or wait parameter: rounded up, within
// [0, LeaseMax].
func seconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	d = min(d, LeaseMax)
	return int32((d + time.Second - 1) / time.Second)
}
