#!/usr/bin/env bash
# `make fuzz`: runs every libFuzzer target in BIN (default build-fuzz/fuzz) for FUZZ_SECONDS each,
# FUZZ_JOBS at a time, then prints one line per target (executions, coverage, corpus, findings) and a
# summary. Each target starts from its committed corpus and regression inputs and its growing work
# corpus in build-fuzz/work/<name>/corpus (never committed). A crash, leak or timeout is minimised into
# tests/fuzz/regress/<name>/ (commit it with the fix). Exit status 1 when anything was found.
#
#   FUZZ_SECONDS=240 FUZZ_JOBS=2 bash tests/fuzz/run.sh [BIN]   FUZZ_ONLY="shape expr" runs just those
set -u
cd "$(dirname "$0")/../.."
bin=${1:-build-fuzz/fuzz}
secs=${FUZZ_SECONDS:-180}
jobs=${FUZZ_JOBS:-2}
work=$(dirname "$bin")/work
# scratch files (archives unpacked, uploads staged) on tmpfs when there is one: fsync is free there
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
names=()
for src in tests/fuzz/fuzz_*.c; do
  n=$(basename "$src" .c); n=${n#fuzz_}
  if [ -n "${FUZZ_ONLY:-}" ] && [[ " $FUZZ_ONLY " != *" $n "* ]]; then continue; fi
  [ -x "$bin/fuzz_$n" ] || { echo "fuzz: $bin/fuzz_$n is missing (make fuzz-build)"; exit 1; }
  names+=("$n")
done

fuzz_one() {
  local n=$1 w=$work/$1
  rm -rf "$w/artifacts"; mkdir -p "$w/corpus" "$w/artifacts"
  local dirs=("$w/corpus")
  for d in tests/fuzz/corpus/$n tests/fuzz/regress/$n; do [ -d "$d" ] && dirs+=("$d"); done
  local dict=(); [ -f "tests/fuzz/$n.dict" ] && dict=(-dict="tests/fuzz/$n.dict")
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$bin/fuzz_$n" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$w/artifacts/" "${dict[@]}" "${dirs[@]}" >"$w/log" 2>&1
  echo $? >"$w/rc"
}

echo "fuzz: ${#names[@]} targets, ${secs}s each, $jobs at a time ($(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores)"
running=0
for n in "${names[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
  echo "fuzz: start $n"
  fuzz_one "$n" &
  running=$((running + 1))
done
wait

total_execs=0; total_found=0
printf '\n%-12s %12s %9s %7s %7s %8s %s\n' target execs exec/s cov ft corpus findings
for n in "${names[@]}"; do
  w=$work/$n; log=$w/log
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -n 1)
  eps=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+).*/\1/p' "$log" | tail -n 1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
  corp=$(grep -oE 'corp: [0-9]+' "$log" | tail -n 1 | cut -d' ' -f2)
  found=()
  for a in "$w"/artifacts/crash-* "$w"/artifacts/leak-* "$w"/artifacts/timeout-* "$w"/artifacts/oom-*; do
    [ -f "$a" ] || continue
    kind=$(basename "$a" | cut -d- -f1)
    mkdir -p "tests/fuzz/regress/$n"
    dest=tests/fuzz/regress/$n/$kind-$(sha1sum "$a" | cut -c1-12)
    # the smallest input that still fails, for the regression folder
    if [ "$kind" = crash ] || [ "$kind" = leak ]; then
      "$bin/fuzz_$n" -minimize_crash=1 -max_total_time=60 -timeout=20 -exact_artifact_path="$dest" "$a" \
        >"$w/minimize.log" 2>&1 || true
    fi
    [ -f "$dest" ] || cp "$a" "$dest"
    found+=("$kind: $dest")
  done
  rc=$(cat "$w/rc" 2>/dev/null || echo '?')
  if [ "$rc" != 0 ] && [ ${#found[@]} -eq 0 ]; then found+=("exit $rc without an artifact: see $log"); fi
  total_execs=$((total_execs + ${execs:-0})); total_found=$((total_found + ${#found[@]}))
  printf '%-12s %12s %9s %7s %7s %8s %s\n' "$n" "${execs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
    "${#found[@]}"
  for f in "${found[@]}"; do
    echo "    $f"
    grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log" | sed 's/^/      /'
  done
done
echo
echo "fuzz: ${#names[@]} targets x ${secs}s: $total_execs executions, $total_found findings"
[ "$total_found" -eq 0 ]
