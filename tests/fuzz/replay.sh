#!/usr/bin/env bash
# Replays every fuzz target over its committed inputs: tests/fuzz/corpus/<name>/ and
# tests/fuzz/regress/<name>/. No fuzzing: each input runs once, so a fixed bug stays fixed and a parser
# change that breaks an old input fails here. Run by tests/run.sh (and so by `make test`).
#
# The binaries: $TK_FUZZ_BIN/fuzz_<name> (libFuzzer with ASan and UBSan), by default the folder named in
# $TK_BUILD/fuzz/libfuzzer-bin (written by `make test` where clang has libFuzzer) when that build is
# newer than $TK_BUILD/libtk.a; else $TK_BUILD/fuzz/replay_<name> (the standalone driver, any compiler;
# built by `make`). Prints one line per target and "N passed, N failed, N skipped" last.
set -u
cd "$(dirname "$0")/../.."
B=${TK_BUILD:-build}
bin=${TK_FUZZ_BIN:-}
if [ -z "$bin" ] && [ -f "$B/fuzz/libfuzzer-bin" ]; then
  bin=$(cat "$B/fuzz/libfuzzer-bin")
  # a sanitizer build older than the library under test would replay yesterday's code
  for src in tests/fuzz/fuzz_*.c; do
    n=$(basename "$src" .c)
    [ "$bin/$n" -nt "$B/libtk.a" ] || { bin=; break; }
  done
fi
passed=0; failed=0; skipped=0
log=$(mktemp); trap 'rm -f "$log"' EXIT
for src in tests/fuzz/fuzz_*.c; do
  name=$(basename "$src" .c); name=${name#fuzz_}
  inputs=()
  for d in tests/fuzz/corpus/$name tests/fuzz/regress/$name; do
    [ -d "$d" ] && while IFS= read -r f; do inputs+=("$f"); done < <(find "$d" -maxdepth 1 -type f ! -name '.*' | sort)
  done
  if [ -n "$bin" ]; then exe=$bin/fuzz_$name; kind=libFuzzer+ASan+UBSan; else exe=$B/fuzz/replay_$name; kind=driver; fi
  if [ ! -x "$exe" ]; then
    echo "FAIL  $name: $exe is missing (run make)"; failed=$((failed + 1)); continue
  fi
  if [ ${#inputs[@]} -eq 0 ]; then
    echo "skip  $name: no committed inputs"; skipped=$((skipped + 1)); continue
  fi
  start=$(date +%s%N)
  if [ -n "$bin" ]; then
    # libFuzzer runs each file named on its command line once; -runs is ignored for files.
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} timeout 300 "$exe" -timeout=60 "${inputs[@]}" >"$log" 2>&1
  else
    timeout 300 "$exe" "${inputs[@]}" >"$log" 2>&1
  fi
  rc=$?
  secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b-a)/1e9}')
  if [ $rc -eq 0 ]; then
    echo "ok    $name: ${#inputs[@]} inputs ($kind, ${secs}s)"; passed=$((passed + 1))
  else
    echo "FAIL  $name: exit $rc over ${#inputs[@]} inputs ($kind, ${secs}s); the input that failed:"
    grep -E '^(Running:|==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" | tail -n 6 | sed 's/^/    /'
    tail -n 15 "$log" | sed 's/^/    /'
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
