package storetest

import (
	"context"
	"errors"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemdlq"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemtest"
)

// replayChecks are the checks of an operator's replay against the claims a store keeps.
func replayChecks[TTx any](run func(string, func(*suite[TTx]))) {
	run("ReplayGoesWhereTheMessageArrived", func(s *suite[TTx]) {
		now := time.Now().UTC()
		insert := func(eventID, topic string) idem.DeadLetter {
			msg := s.payment("acme", eventID, Payment{Wallet: "w1", Amount: 1})
			fp, err := idem.ComputeFingerprint(msg, idem.FingerprintConfig{})
			require.NoError(s.t, err)
			dl, err := s.b.Store.InsertDeadLetter(s.ctx, idem.DeadLetter{
				Consumer: "ledger@v1", Message: msg, Fingerprint: fp, Reason: idem.ReasonPermanentError, Attempts: 1,
				FirstFailed: now, LastFailed: now, Source: "PAYMENTS/ledger", Topic: topic,
			})
			require.NoError(s.t, err)
			return dl
		}
		withTopic, without := insert("evt-nats", "payments.captured.eu"), insert("evt-nowhere", "")
		sink := idemtest.NewSink()
		rp := idemdlq.NewReplayer(s.b.Store, sink, idemdlq.ReplayerConfig{})

		// Not the broker it arrived from: its topic is not a destination.
		_, err := rp.Replay(s.ctx, idemdlq.ReplayParams{Selection: idemdlq.Selection{IDs: []int64{withTopic.ID}, Actor: "ops", Limit: 1}})
		require.ErrorContains(s.t, err, "name the topic")
		_, err = rp.Replay(s.ctx, idemdlq.ReplayParams{ArrivalTopic: true, Selection: idemdlq.Selection{IDs: []int64{without.ID}, Actor: "ops", Limit: 1}})
		require.ErrorContains(s.t, err, "name the topic", "no topic recorded, no queue source")
		require.Empty(s.t, sink.Published())

		res, err := rp.Replay(s.ctx, idemdlq.ReplayParams{ArrivalTopic: true, Selection: idemdlq.Selection{IDs: []int64{withTopic.ID}, Actor: "ops", Limit: 1}})
		require.NoError(s.t, err)
		require.Equal(s.t, []int64{withTopic.ID}, res.Replayed)
		require.Equal(s.t, []string{"evt-nats"}, sink.EventIDs("payments.captured.eu"))
		audit, err := s.b.Store.ListAudit(s.ctx, 10)
		require.NoError(s.t, err)
		require.NotEmpty(s.t, audit)
		require.Equal(s.t, withTopic.ID, audit[0].DeadLetterID)
		require.Equal(s.t, "payments.captured.eu", audit[0].Destination, "the audit says where the replay went")
	})

	// An event without OccurredAt fails once and is dead-lettered; a copy of it is applied and,
	// after the retention, its claim collected. A replay of the dead letter then carries a new
	// publish time, so only the original event time the replayer sends along keeps it too_old.
	run("LateReplayIsTooOld", func(s *suite[TTx]) {
		if bs, ok := s.b.Store.(idemstore.BucketedStore); ok && bs.ClaimBucket() > 0 {
			s.t.Skip("a partitioned inbox collects whole partitions; the too_old check is the same code")
		}
		s.wallet("w1")
		t0 := time.Now().UTC().Truncate(time.Second).Add(-72 * time.Hour)
		clock := t0
		var fail bool
		credit := CreditHandler(s.b)
		c := s.consumer("ledger@v1", func(cfg *idem.ConsumerConfig[TTx]) {
			cfg.Claims.Retention = 48 * time.Hour
			cfg.Claims.RedeliveryWindow = time.Hour
			cfg.Now = func() time.Time { return clock }
			cfg.Handler = func(ctx context.Context, tx TTx, msg idem.Message) error {
				if fail {
					return idem.Permanent(errors.New("bug"))
				}
				return credit(ctx, tx, msg)
			}
		})
		msg := s.payment("acme", "evt-late", Payment{Wallet: "w1", Amount: 3})
		msg.OccurredAt, msg.PublishedAt = time.Time{}, t0

		fail = true
		r := c.Process(s.ctx, msg)
		err := r.Err
		require.Error(s.t, err)
		dl, err := s.b.Store.InsertDeadLetter(s.ctx, idem.DeadLetter{
			Consumer: "ledger@v1", Message: msg, Fingerprint: r.Fingerprint, Reason: idem.ReasonPermanentError,
			Error: err.Error(), Attempts: 1, FirstFailed: t0, LastFailed: t0, Source: "queue:payments",
		})
		require.NoError(s.t, err)

		fail = false
		clock = t0.Add(time.Minute)
		err = c.Process(s.ctx, msg).Err
		require.NoError(s.t, err, "a copy is applied")
		clock = t0.Add(49 * time.Hour)
		n, err := c.CollectGarbage(s.ctx, 10)
		require.NoError(s.t, err)
		require.Equal(s.t, 1, n, "the copy's claim is collected after the retention")

		sink := idemtest.NewSink()
		res, err := idemdlq.NewReplayer(s.b.Store, sink, idemdlq.ReplayerConfig{}).Replay(s.ctx, idemdlq.ReplayParams{
			Selection: idemdlq.Selection{IDs: []int64{dl.ID}, Actor: "ops", Limit: 1},
		})
		require.NoError(s.t, err)
		require.Equal(s.t, []int64{dl.ID}, res.Replayed)
		require.Len(s.t, sink.Published(), 1)
		replay := sink.Published()[0].Message
		got, err := time.Parse(time.RFC3339Nano, replay.Header(idem.HeaderReplayEventTime))
		require.NoError(s.t, err, "the replay carries the original event time")
		require.True(s.t, got.Equal(t0), "original event time %v, want %v", got, t0)

		clock = t0.Add(50 * time.Hour)
		replay.PublishedAt = clock // the broker stamps the replay anew
		r = c.Process(s.ctx, replay)
		err = r.Err
		require.ErrorIs(s.t, err, idem.ErrTooOld)
		require.Equal(s.t, idem.ReasonTooOld, r.Reason)
		require.EqualValues(s.t, 1, s.ledger("evt-late"), "applied once")

		// A replay time that does not parse is refused, never guessed.
		bad := replay.Clone()
		bad.EventID = "evt-late-bad"
		bad.Headers[idem.HeaderReplayEventTime] = "yesterday"
		r = c.Process(s.ctx, bad)
		err = r.Err
		require.ErrorIs(s.t, err, idem.ErrInvalidPayload)
		require.Equal(s.t, idem.ReasonInvalidPayload, r.Reason)
	})
}
