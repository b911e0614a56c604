/*
 * retention.pml — the horizon: claims garbage-collected after retention, copies of one event
 * arriving at any time the assumptions allow, the too_old check, replay, and where the claim
 * lives (the bucket in the key, or the key alone).
 *
 * Abstract time in ticks, bounded by TMAX. One event, first published at t=0 with OccurredAt 0.
 * Copies of it reach the consumer:
 *   - the original, redelivered any number of times within the broker's window W;
 *   - a producer re-send under the same event id, made within RS of the original, itself
 *     redelivered within W; it keeps OccurredAt (the outbox relay does), or with -DFRESH carries
 *     a fresh one (an outside producer stamping the re-send time);
 *   - an operator's replay of a dead letter of the event, at any time, keeping the identity and
 *     the original OccurredAt.
 * Processing a copy at time now: too_old when now - OccurredAt > R (dead letter); else the claim:
 * a duplicate if the key is claimed, else either a new claim (created at now) with its effect,
 * or a dead letter instead (a delivery that failed past its budget while another copy
 * succeeded). Garbage collection deletes a claim once it is older than the GC retention.
 *
 * Assumptions the fixed model is checked under (and GUARANTEES.md states): R >= RS + W (a
 * claim outlives every copy that can still come), GC retention >= the consumer's R, producer
 * and consumer clocks agree (a producer clock ahead by s is -DSKEW).
 *
 * Property: the effect is applied at most once.
 *
 * Fixed configurations that must pass: the default; -DFRESH -DNOREPLAY (fresh re-sends, the key
 * alone decides); -DSKEW -DSKEW_GRACE.
 *
 * Must-fail variants:
 *   -DOLD_BUCKET -DFRESH -DNOREPLAY  the claim key includes the bucket of OccurredAt (the
 *                  partitioned inbox before the fix): a re-send whose OccurredAt falls in another
 *                  bucket is applied again.
 *   -DFRESH        the limit of the fixed design: a fresh-OccurredAt re-send that is dead-lettered
 *                  and replayed after the first claim was collected passes too_old.
 *   -DOLD_GC       `idem gc` deletes claims at a global retention shorter than the consumer's
 *                  (issue 10, item 12): a redelivery within R finds no claim.
 *   -DREPLAY_FRESH the replay before the fix: an event without OccurredAt has PublishedAt as
 *                  its event time, which a replay resets, so a replay after its claim was
 *                  collected passes too_old. The fixed replayer sends the original event time
 *                  along (Idem-Replay-Event-Time) and the consumer counts from the earliest:
 *                  that is the default model, where a replay keeps dlOcc.
 *   -DSKEW         the producer's clock is ahead by S: OccurredAt is later than the claim, and a
 *                  copy accepted by too_old can outlive the claim. -DSKEW -DSKEW_GRACE keeps
 *                  claims S longer than R and passes.
 */

#ifndef R
#define R 2            /* the consumer's Retention */
#endif
#define W 1            /* the broker redelivers a copy within W of its publish */
#define RS 1           /* a producer re-sends within RS of the original */
#define B 1            /* bucket width of the old partitioned layout */
#ifndef TMAX
#define TMAX 6
#endif
#ifdef SKEW
#define S 1            /* producer clock ahead by S */
#else
#define S 0
#endif
#ifdef OLD_GC
#define GCR (R - 1)    /* a global gc retention below the consumer's */
#elif defined(SKEW_GRACE)
#define GCR (R + S)    /* claims kept the skew allowance longer */
#else
#define GCR R          /* the consumer's own retention */
#endif

#define NCOPY 3        /* 0 original, 1 re-send, 2 replay */
#define NCL 3          /* claim rows (the old layout can hold several for one event) */

byte now;
bool live[NCOPY];      /* the copy can still be delivered */
bool sent[NCOPY];
byte occ[NCOPY];       /* its OccurredAt (its event time) */
byte pub[NCOPY];       /* when it was published */

bool cl[NCL];          /* claim rows */
byte clAt[NCL];        /* created at */
byte clB[NCL];         /* bucket (old layout) */

byte applied;
bool dl;               /* a pending dead letter of the event */
byte dlOcc;
bool dlFailUsed;

#define deliverable(c) (live[c] && now <= pub[c] + W)

#ifdef OLD_BUCKET
#define CLAIMED(o) ((cl[0] && clB[0] == (o) / B) || (cl[1] && clB[1] == (o) / B) || (cl[2] && clB[2] == (o) / B))
#else
#define CLAIMED(o) (cl[0] || cl[1] || cl[2])        /* the key alone decides */
#endif

#define NEWCLAIM(o) \
	if \
	:: !cl[0] -> cl[0] = true; clAt[0] = now; clB[0] = (o) / B \
	:: else -> if \
		:: !cl[1] -> cl[1] = true; clAt[1] = now; clB[1] = (o) / B \
		:: else -> cl[2] = true; clAt[2] = now; clB[2] = (o) / B \
		fi \
	fi

inline process(c)
{
	if
	:: now > occ[c] + R -> dl = true; dlOcc = occ[c]               /* too_old */
	:: now <= occ[c] + R ->
		if
		:: CLAIMED(occ[c]) -> skip                                   /* duplicate */
		:: else -> NEWCLAIM(occ[c]); applied++;
			assert(applied <= 1)                                     /* at most once per key */
		fi
	:: now <= occ[c] + R && !dlFailUsed -> dlFailUsed = true; dl = true; dlOcc = occ[c]  /* failed before its claim
		(an outage past its budget): dead-lettered, whether or not another copy was applied */
	fi
}

proctype Consumer()
{
end:
	do
	:: atomic { deliverable(0) -> process(0) }
	:: atomic { deliverable(1) -> process(1) }
	:: atomic { deliverable(2) -> process(2) }
	od
}

proctype World()
{
end:
	do
	/* time passes, bounded; the broker gives up a copy after its window (acked or expired) */
	:: atomic { now < TMAX -> now++;
		if :: live[0] && now > pub[0] + W -> live[0] = false :: else -> skip fi;
		if :: live[1] && now > pub[1] + W -> live[1] = false :: else -> skip fi;
		if :: live[2] && now > pub[2] + W -> live[2] = false :: else -> skip fi }
	/* the producer re-sends the event: the outbox relay keeps its OccurredAt; an outside
	   producer may stamp a fresh one (-DFRESH) */
	:: atomic { !sent[1] && now <= RS -> sent[1] = true; live[1] = true; pub[1] = now;
#ifdef FRESH
		occ[1] = now + S
#else
		occ[1] = S
#endif
		}
	/* an operator replays the dead letter: original identity and OccurredAt */
#ifndef NOREPLAY
	:: atomic { dl && !sent[2] -> sent[2] = true; live[2] = true; pub[2] = now;
#ifdef REPLAY_FRESH
		occ[2] = now        /* no OccurredAt: the event time is the replay's PublishedAt */
#else
		occ[2] = dlOcc
#endif
		}
#endif
	/* garbage collection: claims older than the GC retention */
	:: atomic { cl[0] && now > clAt[0] + GCR -> cl[0] = false }
	:: atomic { cl[1] && now > clAt[1] + GCR -> cl[1] = false }
	:: atomic { cl[2] && now > clAt[2] + GCR -> cl[2] = false }
	od
}

init {
	atomic {
		sent[0] = true; live[0] = true; pub[0] = 0; occ[0] = S;
		run World(); run Consumer()
	}
}
