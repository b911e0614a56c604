#!/usr/bin/env bash
# model/check.sh — checks every spin model of idem's protocol (see model/README.md).
#
# Fixed models must pass with zero errors; must-fail variants (the old behaviour, or a broken
# assumption) must produce at least one error and a trail. One summary line per run; exits
# non-zero on any surprise. Works in a temporary directory and removes it; never leaves pan*
# files in the repository.
#
#   bash model/check.sh            # everything
#   bash model/check.sh relay      # only runs whose name contains "relay"
#   MODEL_TRAILS=dir bash model/check.sh   # keep the must-fail trails (and their spin -t replay)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
filter=${1:-}

if ! command -v spin >/dev/null 2>&1; then
	echo "check.sh: spin is missing; installing the Debian package" >&2
	sudo=""
	if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then sudo=sudo; fi
	$sudo apt-get install -y spin >/dev/null 2>&1 || { $sudo apt-get update >/dev/null && $sudo apt-get install -y spin >/dev/null; }
fi
command -v gcc >/dev/null 2>&1 || { echo "check.sh: gcc is required (spin compiles its verifier)" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-model.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Memory bound per run (MB). A search that hits it is redone in bitstate mode, with the hash
# factor printed as its coverage.
memlim=${MODEL_MEMLIM:-3072}

surprises=0
runs=0
start_all=$SECONDS

jobs=${MODEL_JOBS:-2}
seq=0

# run NAME EXPECT MODEL MODE DEFINES...
#   EXPECT: pass | fail:TEXT — a must-fail run must violate the property whose text (as pan
#           prints the violated assertion or claim) contains TEXT, not just any property
#   MODE:   safety (assertions and invalid end states) | ltl:NAME (weak fairness; a safety
#           formula's run checks the assertions in every state too)
# Runs go in the background, MODEL_JOBS at a time; report prints them in order.
run() {
	local name=$1
	if [ -n "$filter" ] && [[ $name != *"$filter"* ]]; then return 0; fi
	seq=$((seq + 1))
	runs=$((runs + 1))
	while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
	one "$(printf '%03d' $seq)" "$@" &
}

one() {
	local idx=$1 name=$2 expect=$3 model=$4 mode=$5 want=""
	shift 5
	if [[ $expect == fail:* ]]; then want=${expect#fail:}; expect=fail; fi
	local defs=("$@")
	local dir="$tmp/$name" out="$tmp/$idx.line"
	# This runs in a background subshell: its own surprises count, written out on exit (a run
	# that stops early, by set -e or a signal, counts as a surprise).
	surprises=0 finished=0
	trap 'echo $((surprises + 1 - finished)) >"$tmp/$idx.status"' EXIT
	mkdir -p "$dir"
	cp "$here/$model" "$dir/"
	exec >"$out" 2>&1
	local t0=$SECONDS
	# Small searches (the must-fail ones stop at their first error) are not worth -O2's compile.
	local opt=-O2
	if [ "$expect" = fail ] || [ "$model" = retention.pml ]; then opt=-O0; fi
	local cflags=("$opt" -w "-DMEMLIM=$memlim") pflags=(-m200000) kind=exhaustive
	case $mode in
	safety) cflags+=(-DSAFETY -DNOCLAIM) ;;
	ltl:*) cflags+=(-DNFAIR=3); pflags+=(-a -f -N "${mode#ltl:}") ;;
	esac
	(cd "$dir" && spin -a "${defs[@]}" "$model" >spin.out 2>&1) || { echo "FAIL  $name: spin -a failed"; cat "$dir/spin.out"; surprises=$((surprises + 1)); return 0; }
	(cd "$dir" && gcc "${cflags[@]}" -o pan pan.c 2>gcc.out) || { echo "FAIL  $name: gcc failed"; cat "$dir/gcc.out"; surprises=$((surprises + 1)); return 0; }
	(cd "$dir" && ./pan "${pflags[@]}" >pan.out 2>&1) || true
	if grep -q 'reached -DMEMLIM bound' "$dir/pan.out"; then
		kind=bitstate
		(cd "$dir" && gcc "${cflags[@]}" -DBITSTATE -o pan pan.c 2>gcc.out && ./pan "${pflags[@]}" -w30 >pan.out 2>&1) || true
	fi
	local errors states depth coverage="" what=""
	errors=$(sed -n 's/.*errors: \([0-9][0-9]*\).*/\1/p' "$dir/pan.out" | tail -1)
	states=$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$dir/pan.out" | tail -1)
	depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' "$dir/pan.out" | tail -1)
	if [ "$kind" = bitstate ]; then
		coverage=" hash-factor=$(sed -n 's/.*hash factor: *\([0-9.e+]*\).*/\1/p' "$dir/pan.out" | tail -1)"
	fi
	if [ -z "$errors" ]; then
		echo "FAIL  $name: pan gave no verdict"
		tail -20 "$dir/pan.out"
		surprises=$((surprises + 1))
		return 0
	fi
	if grep -q 'max search depth too small' "$dir/pan.out"; then
		echo "FAIL  $name: search depth too small, the search was not complete"
		surprises=$((surprises + 1))
		return 0
	fi
	local secs=$((SECONDS - t0)) verdict status=ok
	if [ "$errors" -gt 0 ]; then
		what=$(grep -m1 -E 'assertion violated|acceptance cycle|invalid end state|claim violated|non-progress' "$dir/pan.out" | sed 's/^pan:[0-9]*: *//; s/ (at depth.*//' || true)
		verdict="errors=$errors trail: $what"
		if [ "$expect" = pass ] || ! ls "$dir"/*.trail >/dev/null 2>&1 || [[ $what != *"$want"* ]]; then status=surprise; fi
		if [ -n "${MODEL_TRAILS:-}" ] && ls "$dir"/*.trail >/dev/null 2>&1; then
			mkdir -p "$MODEL_TRAILS"
			cp "$dir"/*.trail "$MODEL_TRAILS/$name.trail"
			(cd "$dir" && spin -t -p -g "${defs[@]}" "$model" >"$MODEL_TRAILS/$name.txt" 2>&1) || true
		fi
	else
		verdict="errors=0"
		if [ "$expect" = fail ]; then status=surprise; fi
	fi
	local word
	if [ $status = ok ]; then
		word=$([ "$expect" = pass ] && echo "pass " || echo "fails")
	else
		word="FAIL "
		surprises=$((surprises + 1))
	fi
	printf '%s %-34s %-6s %-18s %s states=%s depth=%s%s %ss  %s\n' "$word" "$name" "$expect" "$mode" "$kind" "${states:-?}" "${depth:-?}" "$coverage" "$secs" "$verdict"
	if [ $status != ok ]; then
		echo "      defines: ${defs[*]:-none}"
		if [ -n "$want" ]; then echo "      wanted a counterexample to: $want"; fi
		grep -E 'violated|errors|cycle' "$dir/pan.out" | head -5 | sed 's/^/      /'
	fi
	finished=1
}

echo "spin models of idem ($(spin -V | head -1)); expect: pass = no error, fail = a counterexample trail"

# consumer.pml — one key, two consumers, a redelivering broker, crashes between any two steps.
run consumer-broker           pass consumer.pml ltl:effect_has_claim
run consumer-queue-fenced     pass consumer.pml safety -DQUEUE
run consumer-permanent        pass consumer.pml safety -DPERM -DMAXTF=0 -DMAXPANIC=0
run consumer-settles          pass consumer.pml ltl:settles
run consumer-queue-settles    pass consumer.pml ltl:settles -DQUEUE
run consumer-paused-progress  pass consumer.pml ltl:paused_progress
outage=(-DMAXOUT=7 -DMAXCRASH=0 -DMAXLOSS=0 -DMAXLOSTACK=0 -DMAXPANIC=0)
run consumer-long-outage      pass consumer.pml safety "${outage[@]}"
# must fail: the old behaviour
run old-deadletter-dropped    fail:'(applied>0)||dl' consumer.pml safety -DOLD_DEADLETTER "${outage[@]}" -DLIMIT=4
run old-budget-from-publish   fail:'(reason!=2)' consumer.pml safety -DOLD_BUDGET -DMAXCRASH=0 -DMAXLOSS=0 -DMAXLOSTACK=0
run old-unfenced-queue-ack    fail:'(deliv[m]==t)' consumer.pml safety -DQUEUE -DNOFENCE
run old-savepoint-no-claim    fail:'(applied==0)||claim' consumer.pml ltl:effect_has_claim -DOLD_SAVEPOINT
# must fail: a broken assumption (a delivery limit below attempts + verdictless deliveries)
run assume-delivery-limit     fail:'(applied>0)||dl' consumer.pml safety "${outage[@]}" -DLIMIT=4

# relay.pml — one key's rows, two relays, one partition lease.
run relay-order               pass relay.pml safety
run relay-order-clock-skew    pass relay.pml safety -DSKEW
run relay-all-published       pass relay.pml ltl:all_published
run old-relay-pipeline        fail:'pubd[' relay.pml safety -DOLD_PIPELINE
run old-relay-dead-row        fail:'pubd[' relay.pml safety -DOLD_DEADROW

# retention.pml — claims collected after retention, too_old, replay, where the claim lives.
run retention                 pass retention.pml safety
run retention-fresh-resend    pass retention.pml safety -DFRESH -DNOREPLAY
run retention-skew-grace      pass retention.pml safety -DSKEW -DSKEW_GRACE
run old-bucket-in-claim-key   fail:'(applied<=1)' retention.pml safety -DOLD_BUCKET -DFRESH -DNOREPLAY
run old-global-gc-retention   fail:'(applied<=1)' retention.pml safety -DOLD_GC
run assume-clock-skew         fail:'(applied<=1)' retention.pml safety -DSKEW
run assume-resend-keeps-time  fail:'(applied<=1)' retention.pml safety -DFRESH
run old-replay-fresh-time    fail:'(applied<=1)' retention.pml safety -DREPLAY_FRESH

report() {
	wait
	local f
	for f in "$tmp"/[0-9][0-9][0-9].line; do
		[ -e "$f" ] || continue
		cat "$f"
		local st="${f%.line}.status"
		if [ -s "$st" ]; then surprises=$((surprises + $(cat "$st"))); else surprises=$((surprises + 1)); echo "FAIL  (run ${f##*/} did not finish)"; fi
	done
}
report

echo "$runs runs, $surprises surprises, $((SECONDS - start_all))s"
if [ "$runs" -eq 0 ]; then
	echo "check.sh: no run matches \"$filter\"" >&2
	exit 2
fi
[ "$surprises" -eq 0 ]
