/*
 * relay.pml — the outbox relay: one ordering key's rows, several relays, one partition lease.
 *
 * NR rows of one key, committed in order 0, 1, 2. Two relays share the key's partition through a
 * lease that expires and is taken over (each acquisition gets a new fencing token). A relay
 * publishes the key's first unmarked row, then (fixed sink) the next only after the broker has
 * confirmed the previous one; it marks the confirmed rows published after the batch. A publish
 * fails (the message is not stored), or is stored but its confirmation is lost (the relay sees a
 * failure and publishes it again later: a duplicate the consumers absorb). A row whose budget is
 * spent (MAXATT failed attempts, counted from its first attempt) is dead: it gets a dead letter
 * and holds its key until an operator replays it (it becomes pending again) or discards it.
 * Relays crash between any two steps (confirmed-but-unmarked rows go out again).
 *
 * Property: a key's rows appear in the stream in commit order — when a row first appears, every
 * earlier row has appeared or was discarded by an operator, and no later row has appeared.
 *
 * Must-fail variants:
 *   -DOLD_PIPELINE  the sink sends the key's rows without waiting for confirmations and keeps
 *                   going after one fails (idemnats.Sink before the fix): a later row is stored
 *                   while an earlier one is still pending.
 *   -DOLD_DEADROW   a dead row stops holding its key: the key's later rows go on.
 * Optional: -DSKEW    a relay whose clock is slow keeps publishing after its lease expired
 *                   (order must still hold: it rests on confirmations, not on the lease).
 */

#define NR 3               /* rows of the key */
#ifndef MAXATT
#define MAXATT 2           /* relay budget: attempts per row */
#endif
#ifndef MAXFAIL
#define MAXFAIL 4          /* publishes that are not stored (enough to kill a row twice) */
#endif
#ifndef MAXLOSTCONF
#define MAXLOSTCONF 1      /* publishes stored whose confirmation is lost */
#endif
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXEXP
#define MAXEXP 1           /* lease expiries (a relay stalls past its TTL) */
#endif

/* the database */
bool marked[NR];      /* published and marked */
bool dead[NR];        /* dead row, dead letter written */
bool discarded[NR];   /* an operator discarded the dead row */
bool replayedRow[NR];
byte att[NR];         /* failed attempts of the row (budget from its first attempt) */

/* the stream */
bool pubd[NR];        /* the row is in the stream */

/* the partition lease */
byte holder;          /* relay id + 1; 0: none */
byte ltok;            /* fencing token of the current lease */
bool live;            /* the lease has not expired */

byte fails, lostconfs, crashes, expiries;

#define resolved(j) (pubd[j] || discarded[j])
#define done (resolved(0) && resolved(1) && resolved(2))

/* A row reaches the stream: the first copy must come in order. */
#define LAND(i) \
	if \
	:: !pubd[i] -> \
		assert((i < 1 || resolved(0)) && (i < 2 || resolved(1))); \
		assert((i >= 1 || !pubd[1]) && (i >= 2 || !pubd[2])); \
		pubd[i] = true \
	:: else -> skip \
	fi

/* first row of the key still to publish; NR when none */
#define FIRST(i) \
	if \
	:: !marked[0] && !discarded[0] -> i = 0 \
	:: else -> if \
		:: !marked[1] && !discarded[1] -> i = 1 \
		:: else -> if \
			:: !marked[2] && !discarded[2] -> i = 2 \
			:: else -> i = NR \
			fi \
		fi \
	fi

#define ACQ   0
#define ROUND 1
#define SEND  2
#define MARK  3

#ifdef SKEW
#define mylease (holder == me + 1 && ltok == mytok)
#else
#define mylease (holder == me + 1 && ltok == mytok && live)
#endif

/* one publish attempt of row i: stored and confirmed (ok), not stored, or stored unconfirmed */
#define ATTEMPT(i, ok) \
	if \
	:: LAND(i); ok = true \
	:: fails < MAXFAIL -> fails++; ok = false \
	:: lostconfs < MAXLOSTCONF -> lostconfs++; LAND(i); ok = false \
	fi; \
	if \
	:: !ok -> att[i]++; \
		if :: att[i] >= MAXATT -> dead[i] = true :: else -> skip fi \
	:: else -> skip \
	fi

proctype Relay(byte me)
{
	byte pc, i, lo, hi, mytok;
	bool ok;
end:
	do
	/* take the partition when its lease is free, expired, or already ours (a restart under the
	   same relay ID): a new fencing token either way */
	:: atomic { pc == ACQ && (holder == 0 || !live || holder == me + 1) ->
		holder = me + 1; ltok++; mytok = ltok; live = true; pc = ROUND }

	/* a round: the key's first unmarked row; a dead row holds the key */
	:: atomic { pc == ROUND && !mylease -> pc = ACQ; mytok = 0 }
	:: atomic { pc == ROUND && mylease ->
		FIRST(i);
#ifdef OLD_DEADROW
		/* old: a dead row no longer holds its key */
		do
		:: i < NR && (dead[i] || marked[i] || discarded[i]) -> i++
		:: else -> break
		od;
#endif
		if
		:: i < NR && !dead[i] -> lo = i; hi = i; pc = SEND
		:: else -> skip          /* nothing to do, or the key is held by a dead row */
		fi }

#ifndef OLD_PIPELINE
	/* fixed sink: publish row hi, wait for its confirmation; go on to the next row only then */
	:: atomic { pc == SEND && mylease ->
		ATTEMPT(hi, ok);
		if
		:: ok && hi + 1 < NR && !marked[hi + 1] && !dead[hi + 1] && !discarded[hi + 1] -> hi++
		:: ok -> hi++; pc = MARK       /* mark lo .. hi-1 */
		:: !ok -> pc = MARK            /* mark lo .. hi-1, the confirmed prefix */
		fi }
	:: atomic { pc == SEND && !mylease -> pc = MARK }   /* the publish context ended with the lease */
#else
	/* old sink: pipeline every row of the batch, keep going after a failure, mark what was confirmed */
	:: atomic { pc == SEND ->
		do
		:: hi < NR && !marked[hi] && !dead[hi] && !discarded[hi] ->
			ATTEMPT(hi, ok);
			if :: ok -> marked[hi] = true :: else -> skip fi;
			hi++
		:: else -> break
		od;
		lo = 0; hi = 0; pc = ROUND }
#endif

	/* mark the confirmed rows published (not fenced: a duplicate publish is harmless) */
	:: atomic { pc == MARK ->
		do
		:: lo < hi -> marked[lo] = true; lo++
		:: else -> break
		od;
		lo = 0; hi = 0; pc = ROUND }

	/* crash between any two steps: the lease stays until it expires */
	:: atomic { crashes < MAXCRASH -> crashes++; pc = ACQ; lo = 0; hi = 0; i = 0; mytok = 0 }
	od
}

/* Time: a lease expires when its holder stalls past the TTL. */
proctype Clock()
{
end:
	do
	:: atomic { expiries < MAXEXP && live -> expiries++; live = false }
	od
}

/* The operator: replays a dead row once (pending again, a fresh budget), else discards it. */
proctype Operator()
{
	byte j;
end:
	do
	:: atomic { dead[0] || dead[1] || dead[2] ->
		if :: dead[0] -> j = 0 :: dead[1] -> j = 1 :: dead[2] -> j = 2 fi;
		dead[j] = false;
		if
		:: !replayedRow[j] -> replayedRow[j] = true; att[j] = 0
		:: else -> discarded[j] = true
		fi;
		j = 0 }
	od
}

init {
	atomic { run Clock(); run Operator(); run Relay(0); run Relay(1) }
}

/* Liveness under weak fairness: every row is eventually published (or discarded by an operator). */
ltl all_published { <> done }
