/*
 * consumer.pml — idem's consumer path for one event key, over every interleaving and crash.
 *
 * One key (tenant, consumer@version, event_id). The broker holds COPIES copies of the event
 * (the relay may publish twice) plus one slot for an operator's replay. Two consumer processes
 * fetch, run the claim + handler + commit transaction (atomic, as the database makes it), then
 * ack (broker mode) or ack inside the transaction fenced by the lease token (-DQUEUE, the queue
 * table). Faults, each bounded so the search is finite: crashes between any two steps, lease
 * loss (extension failing), lost acks and terminates, transient handler failures, a handler
 * panic that pauses the consumer, database outages (a failed transaction or dead-letter write),
 * a consumer that starts MaxElapsed behind the publish (lag).
 *
 * Must-fail variants (the old behaviour; each must produce a trail):
 *   -DOLD_DEADLETTER  a failed dead-letter write naks the delivery; the broker's delivery limit
 *                     then drops an event that was neither applied nor dead-lettered.
 *   -DOLD_BUDGET      the retry budget counts from PublishedAt: a lagging consumer dead-letters
 *                     retries_exhausted before the attempt budget is spent.
 *   -DQUEUE -DNOFENCE the queue table acks by job id without the lease token: a worker that lost
 *                     its lease commits over the one that took it.
 *   -DOLD_SAVEPOINT   the SQLite batch carried on after a whole-transaction rollback: an effect
 *                     committed without its claim (and is applied again on redelivery).
 * And an assumption: -DLIMIT=n below ATT + the deliveries that can end without a verdict loses
 * the event even with the fixed runtime (the broker's delivery limit must leave that margin).
 */

#ifndef COPIES
#define COPIES 2          /* broker copies of the event (relay republish) */
#endif
#define NM 3              /* message slots: COPIES copies + one replay */
#define REPLAY 2          /* the replay slot */
#define NC 2              /* consumers */

#ifndef ATT
#define ATT 2             /* retry policy: attempts */
#endif
#define MAXELAPSED ATT    /* retry policy: elapsed budget in ticks; a nak's delay is one tick, so
                             the elapsed budget covers ATT attempts measured from the first */

/* Fault budgets. */
#ifndef MAXCRASH
#define MAXCRASH 1
#endif
#ifndef MAXLOSS
#define MAXLOSS 1         /* lease lost while the holder still works (extension failed) */
#endif
#ifndef MAXLOSTACK
#define MAXLOSTACK 1      /* ack or terminate lost on the way to the broker */
#endif
#ifndef MAXTF
#define MAXTF 1           /* transient handler failures (with the outages, enough to spend the budget) */
#endif
#ifndef MAXPANIC
#define MAXPANIC 1
#endif
#ifndef MAXOUT
#define MAXOUT 2          /* database outage: failed transactions and dead-letter writes */
#endif

/* The broker's delivery limit (MaxDeliver). The fixed runtime refuses a source whose limit is
 * not above the attempts plus a margin for deliveries that end without a verdict
 * (CheckSourceLimits); here the margin covers every such fault the model can inject. */
#ifndef LIMIT
#define LIMIT (ATT + MAXCRASH + MAXLOSS + MAXLOSTACK + MAXPANIC + MAXOUT)
#endif

/* message states */
#define FREE     0
#define READY    1
#define INFLIGHT 2
#define GONE     3
#define DROPPED  4

/* consumer steps */
#define FETCH  0
#define TX     1
#define ACK    2
#define DECIDE 3
#define DLW    4
#define TERM   5

#define R_NONE 0
#define R_PERM 1
#define R_EXH  2

byte st[NM];        /* broker state of each message */
byte deliv[NM];     /* broker delivery count (msg.Attempt) */
bool orphan[NM];    /* in flight, but its holder moved on (lost ack): expires */
bool firstSet[NM];
byte age[NM];       /* time this message has waited since its publish, in ticks: a nak's delay
                       is one tick, a consumer behind by MaxElapsed adds MAXELAPSED */
byte firstAt[NM];   /* its age at its first attempt */
bool lagged;

/* database */
bool claim;         /* the claim row of the key */
byte applied;       /* effects committed */
bool dl;            /* a dead letter of the key exists */
byte dlReason;
bool replayed;

/* consumers */
bool paused[NC];
byte pc[NC];

/* fault counters */
byte crashes, losses, lostacks, tfails, panics, outages;
bool svpUsed;

#define settled (applied > 0 || dl)
/* the lease token of a delivery is the message's delivery count: each new lease bumps it */
#define mine(m, t) (st[m] == INFLIGHT && deliv[m] == t)
/* back to fetching; locals cleared so that equal states merge */
#define IDLE pc[me] = FETCH; m = 0; t = 0; reason = R_NONE

/* pick a READY message into m */
#define PICK(m) if :: st[0] == READY -> m = 0 :: st[1] == READY -> m = 1 :: st[2] == READY -> m = 2 fi

proctype Consumer(byte me)
{
	byte m, t, reason;
end:
	do
	/* fetch: the broker hands out a ready message under a new lease, or drops it at the limit */
	:: atomic { pc[me] == FETCH && !paused[me] && (st[0] == READY || st[1] == READY || st[2] == READY) ->
		PICK(m);
		deliv[m]++;
		if
		:: deliv[m] > LIMIT ->
			st[m] = DROPPED;
			/* never lost: the broker only drops what is applied or dead-lettered */
			assert(settled)
		:: else ->
			st[m] = INFLIGHT; orphan[m] = false;
			t = deliv[m];
			if :: !firstSet[m] -> firstSet[m] = true; firstAt[m] = age[m] :: else -> skip fi;
			pc[me] = TX
		fi }

	/* claim + handler + commit: one database transaction */
	:: atomic { pc[me] == TX ->
#ifdef QUEUE
		if
#ifndef NOFENCE
		:: !mine(m, t) -> IDLE   /* in-tx ack finds a newer token: ErrLeaseLost, rollback */
		:: mine(m, t) ->
#else
		:: true ->
#endif
#endif
		if
		:: claim ->                       /* duplicate: nothing to apply */
#ifdef QUEUE
			st[m] = GONE; IDLE
#else
			pc[me] = ACK
#endif
		:: !claim ->
			if
			:: true ->                    /* handler succeeds: claim and effect commit together */
#ifdef QUEUE
				/* a fenced worker never commits after losing its lease */
				assert(mine(m, t));
				st[m] = GONE; IDLE;
#else
				pc[me] = ACK;
#endif
				claim = true; applied++;
				assert(applied <= 1);        /* at most once per key */
				assert(claim)                /* never an effect without its claim */
#ifdef OLD_SAVEPOINT
			:: !svpUsed -> svpUsed = true;    /* SQLite batch: the transaction was rolled back
				whole, the savepoint's RELEASE committed the effect in a new implicit transaction
				without its claim, and the final COMMIT failed (a transient error) */
				applied++; pc[me] = DECIDE
#endif
			:: tfails < MAXTF -> tfails++; pc[me] = DECIDE      /* transient: rollback */
			:: outages < MAXOUT -> outages++; pc[me] = DECIDE   /* database down: rollback */
			:: panics < MAXPANIC -> panics++;                   /* panic: pause, give back */
				paused[me] = true;
				if :: mine(m, t) -> st[m] = READY :: else -> skip fi;
				IDLE
#ifdef PERM
			:: reason = R_PERM; pc[me] = DLW                    /* permanent: dead letter */
#endif
			fi
		fi
#ifdef QUEUE
		fi
#endif
	}

	/* ack after commit (broker mode); it may be lost, then the lease expires */
	:: atomic { pc[me] == ACK || pc[me] == TERM ->
		if
		:: mine(m, t) && lostacks < MAXLOSTACK -> lostacks++; orphan[m] = true
		:: mine(m, t) -> st[m] = GONE
		:: !mine(m, t) -> skip        /* stale delivery: the broker ignores it */
		fi;
		IDLE }

	/* transient failure: retry within the budget, or dead-letter retries_exhausted */
	:: atomic { pc[me] == DECIDE ->
		if
#ifdef OLD_BUDGET
		:: deliv[m] >= ATT || age[m] >= MAXELAPSED ->           /* from PublishedAt (t=0) */
#else
		:: deliv[m] >= ATT || age[m] - firstAt[m] >= MAXELAPSED ->  /* from the first attempt */
#endif
			reason = R_EXH; pc[me] = DLW
		:: else ->
			age[m]++;                                        /* nak with delay */
			if :: mine(m, t) -> st[m] = READY :: else -> skip fi;
			IDLE
		fi }

	/* write the dead letter; the database may be down */
	:: atomic { pc[me] == DLW ->
		if
		:: outages < MAXOUT -> outages++;
#ifdef OLD_DEADLETTER
			/* old: nak with backoff; every such delivery counts against the broker's limit */
			if :: mine(m, t) -> st[m] = READY :: else -> skip fi;
			IDLE
#else
			/* fixed: keep the message (its lease extended) and retry the write with backoff;
			   after DeadLetterFailuresToPause failures in a row, pause: the delivery goes back
			   without a verdict (the delivery limit's margin covers it) and fetching stops
			   until an operator resumes the consumer */
			if
			:: !mine(m, t) -> IDLE                         /* lease lost meanwhile */
			:: mine(m, t) -> skip                          /* retry the write */
			:: mine(m, t) -> paused[me] = true; st[m] = READY; IDLE
			fi
#endif
		:: else ->
			dl = true; dlReason = reason;
			/* the budget is measured from the first attempt: retries_exhausted only once the
			   attempts are spent (MAXELAPSED covers ATT attempts' delays) */
			assert(reason != R_EXH || deliv[m] >= ATT);
			pc[me] = TERM
		fi }

	/* crash between any two steps: the transaction (if open) rolls back, the lease expires */
	:: atomic { crashes < MAXCRASH -> crashes++;
		if :: pc[me] != FETCH && mine(m, t) -> st[m] = READY :: else -> skip fi;
		paused[me] = false;          /* a restarted process runs again */
		IDLE }
	od
}

/* The broker: leases expire (extension lost), orphaned deliveries come back. */
proctype Broker()
{
	byte m;
end:
	do
	:: atomic { losses < MAXLOSS && (st[0] == INFLIGHT || st[1] == INFLIGHT || st[2] == INFLIGHT) ->
		if :: st[0] == INFLIGHT -> m = 0 :: st[1] == INFLIGHT -> m = 1 :: st[2] == INFLIGHT -> m = 2 fi;
		losses++; st[m] = READY; orphan[m] = false }
	:: atomic { orphan[0] && st[0] == INFLIGHT -> st[0] = READY; orphan[0] = false }
	:: atomic { orphan[1] && st[1] == INFLIGHT -> st[1] = READY; orphan[1] = false }
	:: atomic { orphan[2] && st[2] == INFLIGHT -> st[2] = READY; orphan[2] = false }
	:: atomic { !lagged && deliv[0] + deliv[1] == 0 -> lagged = true; age[0] = MAXELAPSED; age[1] = MAXELAPSED; age[2] = MAXELAPSED }  /* consumer is behind */
	od
}

/* The operator: resumes a paused consumer; replays a dead letter once (original identity). */
proctype Operator()
{
end:
	do
	:: atomic { paused[0] -> paused[0] = false }
	:: atomic { paused[1] -> paused[1] = false }
	:: atomic { dl && !replayed -> replayed = true; st[REPLAY] = READY }
	od
}

init {
	atomic {
		byte i;
		for (i : 0 .. COPIES - 1) { st[i] = READY }
		run Broker(); run Operator();
		run Consumer(0); run Consumer(1)
	}
}

/* Safety is the assertions above, checked by a plain safety run (-DNOCLAIM), plus this
 * invariant, checked as a claim: the effect never exists without its claim. */
ltl effect_has_claim { [] (applied == 0 || claim) }
/* Liveness under weak fairness: every valid event is eventually applied or dead-lettered. */
ltl settles { <> settled }
/* A paused consumer that is resumed makes progress: pausing never stalls the event for ever. */
ltl paused_progress { [] (paused[0] -> <> settled) }
