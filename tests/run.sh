#!/usr/bin/env bash
# Runs tk's test suite: every C test binary in $TK_BUILD/tests and every tests/cli/*.sh script.
# Each prints "N passed, N failed, N skipped" as its last line; this sums them and prints the total
# last. A test that leaves a process running (a server it started) fails. Usage: tests/run.sh [FILTER]
# (FILTER: a substring of the test names to run)
#
# Progress: "start NAME" as each test begins, and every $TK_TEST_HEARTBEAT seconds (default 30; 0:
# none) while it runs, its name, the seconds so far and the last line of its log
# ($TK_BUILD/test-logs/NAME.log). Then one line per test: ok/FAIL/BROKEN, its summary, its seconds
# of wall time and of CPU (user + system, its child processes included: on a loaded machine the wall
# time measures the neighbours too, the CPU time mostly the test).
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
export TK_BUILD=$B
. scripts/py-venv.sh   # TK_PY_VENV: the test venv every test uses, default ~/.cache/tk/py-venv
heartbeat=${TK_TEST_HEARTBEAT:-30}
filter=${1:-}
passed=0; failed=0; skipped=0; broken=()
logdir=$B/test-logs; mkdir -p "$logdir"
suite_start=$(date +%s)

# Processes a finished test left running: their command line names a scratch directory
# (/tmp/tk-test.XXXXXX, tests/cli/lib.sh) that the test's cleanup has already removed, so they
# cannot belong to a test still running (here or in another suite beside this one).
leftovers() {
  ps -eo pid=,args= | while read -r pid args; do
    local d; d=$(grep -o '/tmp/tk-test\.[A-Za-z0-9]*' <<<"$args" | head -n 1)
    [ -n "$d" ] && [ ! -e "$d" ] && [ "$pid" != $$ ] && echo "$pid $args"
  done
}

# beat NAME LOG: while the test runs, every $heartbeat seconds one line: its name, the seconds so
# far, the last line of its log. Runs in the background; stops when killed or when this runner is gone.
beat() {
  local name=$1 log=$2 t0=$SECONDS sp=
  trap 'kill $sp 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$heartbeat" & sp=$!
    wait $sp
    kill -0 $$ 2>/dev/null || exit 0
    local last; last=$(tail -n 1 "$log" 2>/dev/null | tr -cd '[:print:]\t' | cut -c1-100)
    echo "      $name: $((SECONDS - t0))s${last:+, last: $last}"
  done
}
# children_cpu VAR: sets VAR to the CPU seconds (user + system) of every child this shell has waited
# for so far. `times` runs in this shell (in a $(...) subshell it would count the subshell's children).
children_cpu() {
  times >"$logdir/.times"
  printf -v "$1" '%s' "$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }; printf "%.2f", t }' "$logdir/.times")"
}
beat_pid=
trap '[ -n "$beat_pid" ] && kill $beat_pid 2>/dev/null' EXIT

run_one() {
  local name=$1; shift
  local log=$logdir/$name.log
  local start=$(date +%s%N) cpu0 cpu1; children_cpu cpu0
  echo "start $name"
  : >"$log"
  if [ "$heartbeat" -gt 0 ] 2>/dev/null; then beat "$name" "$log" & beat_pid=$!; fi
  "$@" >"$log" 2>&1
  local rc=$?
  if [ -n "$beat_pid" ]; then kill $beat_pid 2>/dev/null; wait $beat_pid 2>/dev/null; beat_pid=; fi
  local left; left=$(leftovers)
  if [ -n "$left" ]; then
    sleep 1; left=$(leftovers)   # a server told to stop may take a moment to exit
  fi
  if [ -n "$left" ]; then
    echo "FAIL $name left processes running (killed now): $(echo "$left" | cut -c1-160 | paste -sd';')" >>"$log"
    echo "$left" | awk '{print $1}' | xargs -r kill 2>/dev/null
    rc=1
  fi
  local secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b-a)/1e9}')
  children_cpu cpu1
  secs="${secs}s, cpu $(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN{printf "%.1f", b-a}')s"
  local last=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  if [ -z "$last" ]; then
    echo "BROKEN $name (exit $rc, no summary line) — see $log"; tail -n 20 "$log" | sed 's/^/    /'
    failed=$((failed + 1)); broken+=("$name"); return
  fi
  local p f s
  p=$(echo "$last" | sed -E 's/^([0-9]+) passed.*/\1/')
  f=$(echo "$last" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  s=$(echo "$last" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p'); s=${s:-0}
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$f" -gt 0 ] || [ $rc -ne 0 ]; then
    # the failing lines, and before each failed shell test up to eight lines its fail calls printed
    echo "FAIL  $name: $last (${secs})"
    awk '/^FAIL t_/ { n = 0; for (i = 1; i <= 8 && NR - i > 0; i++) { if (b[(NR - i) % 8] ~ /^(ok|FAIL|skip) /) break; n = i }
                      for (i = n; i >= 1; i--) if (!shown[NR - i]) print b[(NR - i) % 8] }
         /^(FAIL|.*CHECK|.*failed)/ { print; shown[NR] = 1 }
         { b[NR % 8] = $0 }' "$log" | head -n 40 | sed 's/^/    /'
    [ "$f" -gt 0 ] || { failed=$((failed + 1)); broken+=("$name"); }
  else
    echo "ok    $name: $last (${secs})"
  fi
}

for t in "$B"/tests/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
  run_one "$name" "$t"
done
for t in tests/cli/*.sh; do
  [ "$(basename "$t")" = lib.sh ] && continue
  [ -f "$t" ] || continue
  name=cli_$(basename "$t" .sh)
  [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
  run_one "$name" bash "$t"
done

# every fuzz target over its committed corpus and regression inputs (tests/fuzz/README.md)
if [ -z "$filter" ] || [[ fuzz_replay == *"$filter"* ]]; then
  run_one fuzz_replay bash tests/fuzz/replay.sh
fi

echo
[ ${#broken[@]} -gt 0 ] && echo "broken: ${broken[*]}"
children_cpu cpu_all
echo "time: $(( $(date +%s) - suite_start )) s, cpu ${cpu_all%.*} s; load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
