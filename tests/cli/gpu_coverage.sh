#!/usr/bin/env bash
# Without a GPU: every kernel entry of every package in kernels-src/*/kernel.json implements an op that
# some GPU test binary declares (`test_gpu_* --list-ops`). The list is read at test time, so a package
# or kernel added later is checked too. On the GPU each binary's last test (gpu_coverage_check in
# tests/gpu_util.h) then fails unless every kernel of its declared ops that fits the device ran, and
# gpu_op_run fails a GPU run of an op the binary did not declare: the list cannot drift from the runs.
. "$(dirname "$0")/lib.sh"

t_every_kernel_has_a_gpu_test() {
  local listed=$WORK/listed n=0
  : >"$listed"
  for t in "$B"/tests/test_gpu_*; do
    [ -x "$t" ] && [ -f "$t" ] || continue
    case $t in *.d) continue ;; esac
    TK_TEST_GPU=0 "$t" --list-ops >"$WORK/one" 2>"$WORK/err" || { fail "$t --list-ops failed: $(cat "$WORK/err")"; return; }
    if [ "$(cat "$WORK/one")" = "-" ]; then n=$((n + 1)); continue; fi # declared: covers no op
    if [ ! -s "$WORK/one" ] || grep -qvE '^[a-z][a-z0-9_]*$' "$WORK/one"; then
      fail "$(basename "$t") does not declare its ops (--list-ops printed: $(head -c 200 "$WORK/one"))"
      fail "HINT: call gpu_main(argc, argv, ops) first in its main (tests/gpu_util.h)"
      continue
    fi
    cat "$WORK/one" >>"$listed"
    n=$((n + 1))
  done
  [ "$n" -ge 8 ] || { fail "found $n GPU test binaries in $B/tests, want at least 8"; return; }
  expect_rc 0 python3 "$ROOT/tests/gpu_coverage.py" "$ROOT" "$listed"
  expect_out "kernel entries"
}

# The check itself fails on a kernel whose op no GPU test declares.
t_check_catches_an_untested_kernel() {
  local fake=$WORK/root
  mkdir -p "$fake/kernels-src/new"
  echo '{"name": "x/new", "kernels": [{"name": "brand_new_k", "op": "brand_new_op"}]}' >"$fake/kernels-src/new/kernel.json"
  printf 'attention\n' >"$WORK/listed"
  expect_rc 1 python3 "$ROOT/tests/gpu_coverage.py" "$fake" "$WORK/listed"
  expect_out "no GPU test: x/new:brand_new_k"
  expect_out "HINT"
}

run_tests
