#!/usr/bin/env bash
# info.sh — tk info's kernels table and ops (no GPU needed), as text and as JSON.
. "$(dirname "$0")/lib.sh"

t_info_kernels_table() {
  expect_rc 0 "$TK" get kernels-community/flash-attn
  expect_rc 0 "$TK" info kernels-community/flash-attn
  expect_out "kernels ("; expect_out "KERNEL"; expect_out "DTYPES"; expect_out "ARCHS"
  # one row per kernel: the sm_90 wgmma kernels run only on sm_90a, the mma.sync ones from sm_80 up
  echo "$OUT" | grep -Eq '^ +attention_sm90_bf16_d64 +attention +bf16 +sm_90a$' || fail "no sm_90a row: $OUT"
  echo "$OUT" | grep -Eq '^ +attention_sm80_f16_d128 +attention +f16 +sm_80\+$' || fail "no sm_80+ row"
  expect_out "ops ("; expect_out "attention, attention_backward"
  local rows; rows=$(echo "$OUT" | sed -n '/kernels (/,/ops (/p' | grep -c '^    attention\|^    mla\|^    paged')
  local want; want=$("$TK" info --json kernels-community/flash-attn | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["kernels"]))')
  [ "$rows" = "$want" ] || fail "table has $rows rows, JSON $want kernels"
  expect_rc 0 "$TK" info --json kernels-community/flash-attn
  echo "$OUT" | python3 -c '
import json, sys
d = json.load(sys.stdin)
k = {x["name"]: x for x in d["kernels"]}["attention_sm90_bf16_d64"]
assert k == {"name": "attention_sm90_bf16_d64", "op": "attention", "dtypes": ["bf16"], "min_cc": 90,
             "max_cc": k["max_cc"], "arch_specific": True, "archs": "sm_90a"}, k
assert d["ops"] == sorted(set(x["op"] for x in d["kernels"])), d["ops"]
' || fail "info --json kernels"
}

run_tests
