#!/usr/bin/env bash
# tk ops and tk run-op through the real tk binary: the op list, and every op family run on its CPU
# reference from the shell (shapes from one --shape or per tensor, per-tensor dtypes, integer inputs),
# deterministic per seed, with clear errors for unknown ops and shapes that do not fit.
. "$(dirname "$0")/lib.sh"

t_ops_lists_every_family() {
  expect_rc 0 "$TK" ops
  local op
  for op in silu_and_mul rms_norm layer_norm_backward rotary_embedding softmax cross_entropy casted_linear \
            sample attention attention_decode mla_decode linear embedding add tanh; do
    expect_out "$op"
  done
  # it fits the terminal: no line wider than COLUMNS, no trailing blanks, one block per op
  local w
  for w in 80 60; do
    OUT=$(COLUMNS=$w "$TK" ops) || fail "COLUMNS=$w tk ops failed"
    echo "$OUT" | awk -v w=$w 'length($0) > w || / $/ { bad = 1; print "      too wide or trailing blank: " $0 } END { exit bad }' >&2 \
      || fail "tk ops at $w columns"
  done
  echo "$OUT" | grep -q '^layer_norm$' || fail "no layer_norm block"
  echo "$OUT" | grep -A8 '^layer_norm$' | grep -q 'implementations: cpu-reference' || fail "layer_norm block lacks its implementations"
  expect_rc 0 "$TK" ops layer_norm
  expect_out "bias: T[d]?"

  expect_out "tk get kernels-community/rmsnorm"
  OUT=$("$TK" --json ops no_such_op 2>&1); expect_out '"status": "not_found"'
  "$TK" --json ops | python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d) >= 40, len(d); assert all(o["cpu_reference"] for o in d)' \
    || fail "tk --json ops: fewer than 40 ops, or one without a CPU reference"
}

# run_op ARGS...: tk --json run-op ARGS; prints the output tensors' fnv1a64 hashes (one line)
# (host tensors run a CPU implementation: the fastest that fits, else the reference)
run_op() { "$TK" --json run-op "$@" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["impl"].startswith("cpu-"), d["impl"]; print(" ".join(t["fnv1a64"] for t in d["tensors"] if t["role"] == "out"))'; }

# TK_CPU_IMPL picks between the fast CPU implementations and the references; tk ops lists them.
t_cpu_implementations() {
  local impl_of='import json,sys; print(json.load(sys.stdin)["impl"])' a r p fast
  fast=$(grep -q ' avx2 ' /proc/cpuinfo && grep -q ' fma ' /proc/cpuinfo && grep -q ' f16c ' /proc/cpuinfo && echo cpu-avx2 || echo cpu-portable)
  [ "$(uname -m)" = x86_64 ] || fast=cpu-portable
  a=$("$TK" --json run-op silu_and_mul --shape 4,4096 | python3 -c "$impl_of")
  r=$(TK_CPU_IMPL=reference "$TK" --json run-op silu_and_mul --shape 4,4096 | python3 -c "$impl_of")
  p=$(TK_CPU_IMPL=portable "$TK" --json run-op silu_and_mul --shape 4,4096 | python3 -c "$impl_of")
  [ "$a" = "$fast" ] || fail "run-op silu_and_mul ran '$a', want $fast on this CPU"
  [ "$r" = cpu-reference ] || fail "TK_CPU_IMPL=reference ran '$r'"
  [ "$p" = cpu-portable ] || fail "TK_CPU_IMPL=portable ran '$p'"
  # an op without a fast implementation runs its reference; one the fast code does not take too
  r=$("$TK" --json run-op layer_norm --shape 3,100 | python3 -c "$impl_of")
  [ "$r" = cpu-reference ] || fail "layer_norm ran '$r', want cpu-reference"
  r=$("$TK" --json run-op rotary_embedding --shape query=16,8,64 --shape key=16,2,64 --shape cos_sin_cache=64,64 --arg is_neox=0 | python3 -c "$impl_of")
  [ "$r" = cpu-reference ] || fail "GPT-J rotary ran '$r', want cpu-reference"
  OUT=$("$TK" ops linear); expect_out "cpu implementations"; expect_out "cpu-portable   any CPU"
  "$TK" --json ops | python3 -c '
import json, sys
d = {o["name"]: o for o in json.load(sys.stdin)}
ci = [c["impl"] for c in d["linear"]["cpu_implementations"]]
assert "cpu-portable" in ci and all(c["usable"] for c in d["linear"]["cpu_implementations"] if c["impl"] == "cpu-portable"), ci
assert d["layer_norm"]["cpu_implementations"] == [], d["layer_norm"]["cpu_implementations"]' || fail "tk --json ops: cpu_implementations"
}

t_run_op_every_family() {
  local cmd
  while IFS= read -r cmd; do
    [ -n "$cmd" ] || continue
    # shellcheck disable=SC2086
    local a b c
    a=$(run_op $cmd --seed 3) || { fail "tk run-op $cmd failed: $("$TK" run-op $cmd 2>&1 | tail -n 2)"; continue; }
    b=$(run_op $cmd --seed 3)
    c=$(run_op $cmd --seed 4)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "tk run-op $cmd is not deterministic for a seed ('$a' vs '$b')"
    [ "$a" != "$c" ] || fail "tk run-op $cmd gives the same outputs for seeds 3 and 4"
  done <<'CMDS'
silu_and_mul --shape 4,4096 --dtype bf16
fused_add_rms_norm --shape 4,512
layer_norm_backward --shape 3,100 --dtype f16
rotary_embedding --shape query=16,8,64 --shape key=16,2,64 --shape cos_sin_cache=64,64
log_softmax --shape 2,3000
cross_entropy --shape 16,320 --shape loss=1 --dtype bf16
casted_linear --shape x=4,256 --shape weight=64,256 --dtype weight=fp8_e4m3 --dtype bf16
sample --shape logits=4,1000 --arg top_k=50
attention --shape q=1,33,4,64 --shape k=1,40,2,64 --arg causal=1 --dtype bf16
attention_decode --shape q=2,1,8,64 --shape k_cache=8,16,2,64 --shape block_table=2,4 --arg seq_lens=40 --dtype bf16
mla_decode --shape q_nope=2,16,512 --shape q_pe=2,16,64 --shape kv_cache=4,16,576 --shape block_table=2,2 --arg seq_lens=20
linear --shape x=4,256 --shape weight=64,256 --dtype bf16
linear --shape 3,5,100 --shape weight=7,100 --shape bias=7
embedding --shape ids=3,5 --shape weight=100,16 --dtype f16
add --shape 4,1000 --dtype bf16
tanh --shape 3,77
CMDS
}

t_run_op_shape_limits() {
  # sizes whose product overflows (2^40 * 2^40 wraps to 0 in 64 bits): refused, not a 1-byte buffer
  expect_rc 2 "$TK" run-op silu_and_mul --shape 1099511627776,1099511627776,2
  expect_out "more than 2^48 elements"
  expect_rc 2 "$TK" run-op silu_and_mul --shape 4,8,
  expect_out "--shape wants sizes"
  expect_rc 2 "$TK" run-op silu_and_mul --shape 4,1099511627777
  expect_out "--shape wants sizes"
}

t_run_op_errors() {
  expect_rc 3 "$TK" run-op silu_and_mull --shape 4,8
  expect_out "did you mean"
  expect_rc 2 "$TK" run-op silu_and_mul --shape 4,7
  expect_out "multiple of 2"
  expect_rc 2 "$TK" run-op silu_and_mul
  expect_out "--shape is required"
  expect_rc 2 "$TK" run-op attention --shape q=1,8,4,64
  expect_out "give it with --shape k="
  expect_rc 2 "$TK" run-op attention --shape q=1,8,4,64 --shape k=1,8,2,32
  expect_out "another shape made it"
  expect_rc 2 "$TK" run-op casted_linear --shape x=4,256 --shape weight=64,256 --dtype weight=nope
  # the dtype spellings people type are the same dtypes: the same tensors, bit for bit
  local want; want=$("$TK" run-op silu_and_mul --shape 4,64 --dtype f16 | tail -n +2)
  for d in half fp16 float16 FP16; do
    expect_rc 0 "$TK" run-op silu_and_mul --shape 4,64 --dtype $d
    [ "$(echo "$OUT" | tail -n +2)" = "$want" ] && case "$OUT" in "silu_and_mul f16:"*) ;; *) false ;; esac || fail "--dtype $d is not f16: $OUT"
  done
  expect_rc 0 "$TK" run-op silu_and_mul --shape 4,64 --dtype bfloat16
  expect_out "silu_and_mul bf16:"
  expect_rc 0 "$TK" run-op casted_linear --shape x=4,256 --shape weight=64,256 --dtype weight=float8_e4m3fn --dtype float32
  expect_out "casted_linear f32:"
  expect_rc 2 "$TK" run-op silu_and_mul --shape 4,64 --dtype float64
  expect_out "--dtype wants f32, f16 or bf16"
  expect_rc 2 "$TK" run-op cross_entropy --shape 4,10 --shape loss=1 --arg target=10
  expect_out "target"
  expect_rc 2 "$TK" run-op silu_and_mul --shape 4,8 --arg nope=1
  expect_out "no parameter 'nope'"
  # the layer ops: an id outside the table, a weight whose K does not match x
  expect_rc 2 "$TK" run-op embedding --shape ids=40 --shape weight=7,4
  expect_out "embedding: ids[7] = 7 is out of range for 'weight' [7, 4] (want 0 <= id < 7)"
  expect_rc 2 "$TK" run-op linear --shape x=4,256 --shape weight=64,255
  expect_out "another shape made it"
  # every tensor named: the op itself judges the shapes (transposed=1 takes weight [K, N])
  expect_rc 2 "$TK" run-op linear --shape x=4,256 --shape weight=64,255 --shape out=4,64
  expect_out "linear: 'x' has shape [4, 256], want [4, 255]"
  expect_rc 0 "$TK" run-op linear --shape x=4,256 --shape weight=256,64 --shape out=4,64 --shape bias=64 --arg transposed=1
  expect_out "linear f32: cpu-"
}

run_tests
