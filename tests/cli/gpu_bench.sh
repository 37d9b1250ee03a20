#!/usr/bin/env bash
# bench/gpu_vs_torch.py without a GPU: its ctypes binding over libtk and every torch equivalent run on
# small CPU tensors (--cpu-check; tk runs its CPU references), each output compared with a float32
# torch reference. Needs torch: the test venv (TK_PY_VENV, scripts/setup.sh --test); in CI a missing
# venv is a failure.
. "$(dirname "$0")/lib.sh"

PY=$TK_PY_VENV/bin/python
case $PY in /*) ;; *) PY=$ROOT/$PY ;; esac
BENCH=$ROOT/bench/gpu_vs_torch.py

have_torch() {
  py_has "$PY" torch && return 0
  [ -n "${CI:-}" ] && { fail "torch is not importable from $PY (scripts/setup.sh --test)"; return 1; }
  skip "no torch venv ($PY); run scripts/setup.sh --test"; return 1
}

t_cpu_check_binds_every_op() {
  have_torch || return
  expect_rc 0 "$PY" "$BENCH" --lib "$B/libtk.so.0" --cpu-check --csv "$WORK/b.csv" --json "$WORK/b.json"
  expect_out "0 mismatches, 0 errors"
  "$PY" - "$WORK/b.csv" "$WORK/b.json" <<'PYEOF' || fail "bench output: $(head -c 2000 "$WORK/b.csv")"
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
ops = {r["op"] for r in rows}
want = {"silu_and_mul", "gelu_and_mul", "rms_norm", "fused_add_rms_norm", "layer_norm", "rotary_embedding",
        "softmax", "log_softmax", "argmax", "cross_entropy", "paged_kv_append", "attention_decode",
        "casted_embedding", "casted_linear", "attention", "attention_backward", "fused_linear_cross_entropy",
        "host overhead per call"}
assert want <= ops, want - ops
for r in rows:
    assert r["status"] == "ok", r
    assert r["impl"].startswith("cpu-"), r          # host tensors: a CPU implementation or the reference
    assert float(r["max_rel_err"]) < 0.05, r
j = json.load(open(sys.argv[2]))
assert j["info"]["device"] == "cpu" and len(j["rows"]) == len(rows) and not j["errors"], j["info"]
PYEOF
}

t_bad_usage_is_clear() {
  have_torch || return
  expect_rc 2 "$PY" "$BENCH" --lib "$WORK/no-such-libtk.so" --cpu-check
  expect_out "does not exist"
  expect_out "HINT"
  # no GPU for tk (no driver): none for torch either; asking tk spares a torch import (seconds)
  if "$TK" doctor --json 2>/dev/null | grep -q '"gpus": \[\]'; then
    expect_rc 2 "$PY" "$BENCH" --lib "$B/libtk.so.0"
    expect_out "no CUDA device"
  fi
}

run_tests
