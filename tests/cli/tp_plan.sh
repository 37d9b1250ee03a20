#!/usr/bin/env bash
# The tensor-parallel plan parser (models/tp_plan.c) against transformers: tests/tp_plan_oracle.py
# saves tiny Llama (GQA), Qwen2 (bf16) and GPT-2 checkpoints and compares every tensor's style and
# each rank's bytes (2 and 3 ranks; the default plan, config.json's, custom plan files) with
# transformers' own plan, matching, placements and shard-on-read slicing, and the errors and
# warnings with transformers'. Needs the test venv (TK_PY_VENV); skips without it (fails under CI).
. "$(dirname "$0")/lib.sh"

PY=${TK_PY_VENV:-$ROOT/build/py-venv}/bin/python

t_tp_plan_matches_transformers() {
  if ! "$PY" -c "import torch, transformers, safetensors" 2>/dev/null; then
    [ -n "${CI:-}" ] && { fail "the test venv is missing ($PY): run scripts/setup.sh --test"; return; }
    skip "no test venv ($PY); run scripts/setup.sh --test"; return
  fi
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" "$ROOT/tests/tp_plan_oracle.py" "$B/tests/test_tp_plan" "$WORK" \
    >"$WORK/oracle.log" 2>&1; local rc=$?
  grep -E '^(ok|FAIL) ' "$WORK/oracle.log" | sed 's/^/    /'
  if [ $rc != 0 ]; then
    fail "tp_plan_oracle.py exited $rc"; grep -v '^ok ' "$WORK/oracle.log" | tail -n 20 >&2
  fi
  grep -q '^ok gpt2 custom plan' "$WORK/oracle.log" || fail "the oracle did not run to its end"
}

run_tests
