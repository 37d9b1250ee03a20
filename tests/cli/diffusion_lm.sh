#!/usr/bin/env bash
# tk generate --diffusion (masked diffusion: LLaDA's and Dream's samplers) against the published
# samplers written in Python over transformers (tests/models/dllm_oracle.py), on tiny random
# checkpoints in three layouts: a LlamaForCausalLM run with --bidirectional, the same weights as an
# LLaDAModelLM checkpoint (LLaDA's names and config keys), and a Qwen2 as a DreamModel checkpoint.
# At temperature 0 every step must unmask the same positions and end with the same tokens; with
# classifier-free guidance too; random remasking, Gumbel noise and Dream's origin draws are fed to
# both sides from one file (--draws). Then streaming, --show-steps, --json, the automatic choice for
# a diffusion checkpoint, and a clear error for each kind of bad input.
# Needs the test venv ($TK_PY_VENV); under CI=true its absence is a failure.
. "$(dirname "$0")/lib.sh"

PY=$TK_PY_VENV/bin/python
ORACLE=$ROOT/tests/models/dllm_oracle.py
CK=$WORK/ck
P=1,40,50,60,70

need_models() {
  if ! py_has "$PY" torch transformers safetensors tokenizers; then
    if [ "${CI:-}" = true ]; then fail "no oracle venv at $PY (CI=true: a missing oracle is a failure)"; else skip "no venv at $PY (scripts/setup.sh --test)"; fi
    return 1
  fi
  [ -f "$CK/.done" ] && return 0
  "$PY" "$ORACLE" make "$CK" >"$WORK/make.log" 2>&1 || { fail "dllm_oracle.py make failed:"; tail -n 5 "$WORK/make.log" >&2; return 1; }
  touch "$CK/.done"
}

t_bidirectional_reference() {
  need_models || return
  expect_rc 0 "$PY" "$ORACLE" check "$CK"
  expect_out "llama: bidirectional"
  expect_out "qwen2: bidirectional"
}

# the forward itself: tk's logits of the LLaDA-layout, Dream and --bidirectional... checkpoints are
# transformers' bidirectional model's (f32, |tk - ref| <= 1e-4 + 1e-4 |ref|)
t_bidirectional_logits() {
  need_models || return
  local ids=1,40,3,3,60,3,70 pair tkdir ref
  for pair in llada:llama dream:qwen2; do
    tkdir=${pair%%:*}; ref=${pair#*:}
    "$TK" model logits "$CK/$tkdir" --ids $ids --json >"$WORK/tl.json" 2>"$WORK/tl.err" || { fail "tk model logits $tkdir failed"; cat "$WORK/tl.err" >&2; continue; }
    "$PY" "$ORACLE" logits "$CK/$ref" $ids >"$WORK/rl.json" 2>/dev/null || { fail "the oracle's logits failed"; continue; }
    "$PY" - "$WORK/tl.json" "$WORK/rl.json" "$tkdir" <<'PYEOF' || fail "$tkdir: logits differ from transformers' bidirectional model"
import json, sys
a, b = json.load(open(sys.argv[1]))["logits"], json.load(open(sys.argv[2]))["logits"]
worst = max(abs(x - y) - 1e-4 * abs(y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
assert len(a) == len(b) and len(a[0]) == len(b[0]), (len(a), len(b))
print(f"  {sys.argv[3]}: worst excess {worst:.3g}")
sys.exit(0 if worst <= 1e-4 else 1)
PYEOF
  done
  expect_rc 0 "$TK" model info "$CK/llada" --json
  expect_out '"llada"'
}

# JOBS: "TKDIR REFDIR SAMPLER TKFLAGS | ORACLE key=value..."; each job's draws file is $WORK/draws-N.
JOBS="llama llama llada --bidirectional --mask-token-id 3 | gen_length=16 block_length=8 steps=8
llama llama llada --bidirectional --mask-token-id 3 --cfg-scale 1.5 | gen_length=16 block_length=4 steps=16 cfg_scale=1.5
llama llama llada --bidirectional --mask-token-id 3 --remasking random | gen_length=12 block_length=12 steps=6 remasking=random
llama llama llada --bidirectional --mask-token-id 3 --temperature 0.8 | gen_length=8 block_length=4 steps=4 temperature=0.8
llama llama llada --bidirectional --mask-token-id 3 --temperature 0.5 --remasking random --cfg-scale 0.5 | gen_length=8 block_length=8 steps=4 temperature=0.5 remasking=random cfg_scale=0.5
llada llama llada | gen_length=16 block_length=8 steps=8
llada llama llada --cfg-scale 2.0 | gen_length=16 block_length=4 steps=8 cfg_scale=2.0
dream qwen2 dream --alg entropy | gen_length=16 steps=8 alg=entropy
dream qwen2 dream --alg maskgit_plus | gen_length=16 steps=16 alg=maskgit_plus
dream qwen2 dream --alg topk_margin | gen_length=12 steps=5 alg=topk_margin
dream qwen2 dream --alg origin | gen_length=16 steps=6 alg=origin
dream qwen2 dream --alg maskgit_plus --top-k 5 | gen_length=16 steps=8 alg=maskgit_plus top_k=5
dream qwen2 dream --alg entropy --top-p 0.9 | gen_length=12 steps=6 alg=entropy top_p=0.9"

t_samplers_match_reference() {
  need_models || return
  local n=0 lines=() tkdir ref sampler flags kv rest
  : >"$WORK/jobs"
  while IFS= read -r job; do
    n=$((n + 1))
    rest=${job%%|*}; kv=${job#*|}
    read -r tkdir ref sampler flags <<<"$rest"
    flags=${flags% }
    echo "$CK/$ref $sampler $WORK/draws-$n prompt=$P mask_token_id=3 $kv" >>"$WORK/jobs"
    lines+=("$tkdir|$flags|$kv")
  done <<<"$JOBS"
  "$PY" "$ORACLE" run-many <"$WORK/jobs" >"$WORK/ref.jsonl" 2>"$WORK/ref.err" || { fail "the oracle failed:"; tail -n 5 "$WORK/ref.err" >&2; return; }
  local i=0
  for l in "${lines[@]}"; do
    i=$((i + 1))
    IFS='|' read -r tkdir flags kv <<<"$l"
    local gl bl st
    gl=$(grep -o 'gen_length=[0-9]*' <<<"$kv" | cut -d= -f2)
    bl=$(grep -o 'block_length=[0-9]*' <<<"$kv" | cut -d= -f2)
    st=$(grep -o 'steps=[0-9]*' <<<"$kv" | cut -d= -f2)
    # shellcheck disable=SC2086
    "$TK" generate "$CK/$tkdir" --diffusion --ids $P --gen-length "$gl" ${bl:+--block-length $bl} --steps "$st" \
      --draws "$WORK/draws-$i" $flags --json >"$WORK/tk-$i.json" 2>"$WORK/tk-$i.err" ||
      { fail "job $i ($tkdir $flags): tk failed:"; cat "$WORK/tk-$i.err" >&2; continue; }
    sed -n "${i}p" "$WORK/ref.jsonl" >"$WORK/ref-$i.json"
    "$PY" - "$WORK/tk-$i.json" "$WORK/ref-$i.json" "$tkdir $flags" <<'PYEOF' || fail "job $i ($tkdir $flags) differs from the reference"
import json, sys
tk, ref, what = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
steps = [sorted(s["unmasked"]) for s in tk["stats"]["per_step"]]
ok = True
for i, (a, b) in enumerate(zip(steps, ref["steps"])):
    if a != b:
        print(f"  {what}: step {i}: tk unmasked {a}, the reference {b}", file=sys.stderr); ok = False; break
if len(steps) != len(ref["steps"]):
    print(f"  {what}: {len(steps)} steps, the reference {len(ref['steps'])}", file=sys.stderr); ok = False
if tk["ids"] != ref["ids"]:
    print(f"  {what}: ids {tk['ids']}\n  reference {ref['ids']}", file=sys.stderr); ok = False
sys.exit(0 if ok else 1)
PYEOF
  done
}

t_diffusion_checkpoint_chosen_automatically() {
  need_models || return
  expect_rc 0 "$TK" generate "$CK/llada" --ids $P --gen-length 8 --steps 4 --json
  expect_out '"sampler":"llada"'
  # a user's autoregressive habit: --max-new-tokens is --gen-length
  expect_rc 0 "$TK" generate "$CK/llada" --ids $P --max-new-tokens 8 --steps 4 --json
  expect_out '"gen_length":8'
  expect_rc 0 "$TK" generate "$CK/dream" --ids $P --gen-length 8 --steps 4 --temperature 0 --json
  expect_out '"sampler":"dream"'
  expect_out '"alg":"origin"'
  # the causal model is not run by diffusion unless asked
  expect_rc 0 "$TK" generate "$CK/llama" --ids $P --max-new-tokens 3 --json
  expect_no_out '"sampler"'
}

t_stream_show_steps_json() {
  need_models || return
  local json text
  expect_rc 0 "$TK" generate "$CK/llada" --prompt "Once upon a time" --gen-length 16 --block-length 8 --steps 8 --json
  json=$OUT
  text=$("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["text"])' "$json")
  # the streamed text is the JSON's text, block by block
  OUT=$("$TK" generate "$CK/llada" --prompt "Once upon a time" --gen-length 16 --block-length 8 --steps 8 2>/dev/null)
  [ "$OUT" = "$text" ] || fail "streamed '$OUT', --json's text '$text'"
  OUT=$("$TK" generate "$CK/llada" --prompt "Once upon a time" --gen-length 16 --block-length 8 --steps 8 --show-steps 2>&1 >/dev/null)
  [ "$(grep -c '^step [0-9]*/8 block [12]: ' <<<"$OUT")" = 8 ] || fail "--show-steps: want 8 step lines, got: $OUT"
  grep -q '^step 1/8 block 1: .*_' <<<"$OUT" || fail "--show-steps: the first step should still show masks: $OUT"
  "$PY" - "$json" <<'PYEOF' || fail "--json: per-step counts wrong: $json"
import json, sys
s = json.loads(sys.argv[1])["stats"]
assert 0 <= s["sampler_ms"] <= s["ms"] and s["steps"] == 8 and s["blocks"] == 2 and s["forward_passes"] == 8, s
c = [p["count"] for p in s["per_step"]]
assert c == [2] * 8 and sum(c) == 16, c
assert all(len(p["unmasked"]) == p["count"] for p in s["per_step"])
PYEOF
}

t_bad_input() {
  need_models || return
  expect_rc 2 "$TK" generate "$CK/llama" --diffusion --bidirectional --ids $P --gen-length 8
  expect_out "has no mask token id"
  expect_out "HINT: pass --mask-token-id"
  expect_rc 2 "$TK" generate "$CK/llama" --diffusion --mask-token-id 3 --ids $P --gen-length 8
  expect_out "is a causal LM"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 10 --block-length 4
  expect_out "gen_length 10 is not a multiple of block_length 4"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 16 --block-length 4 --steps 2
  expect_out "steps 2 are fewer than the 4 blocks"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 16 --block-length 4 --steps 6
  expect_out "steps 6 is not a multiple of the 4 blocks"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 16 --steps 20
  expect_out "steps 20 exceed gen_length 16"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 92
  expect_out "the prompt (5 tokens) plus gen_length 92 is 97 tokens, longer than the model's context of 96"
  expect_rc 2 "$TK" generate "$CK/dream" --ids $P --gen-length 16 --block-length 8
  expect_out "block_length 8 differs from gen_length 16"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 8 --remasking lowest
  expect_out "--remasking wants low_confidence or random, got 'lowest'"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 8 --alg entropy
  expect_out "alg 'entropy' is Dream's"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 8 --mask-token-id 100000
  expect_out "mask token id 100000 is outside the vocabulary"
  head -c 80 /dev/zero >"$WORK/short"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 8 --temperature 1 --draws "$WORK/short"
  expect_out "ran out of draws"
  # the third draw is 1.5: refused with its number and offset, not used as a probability
  python3 -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<4000d", 0.25, 0.5, 1.5, *[0.5]*3997))' >"$WORK/bad"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 8 --temperature 1 --draws "$WORK/bad"
  expect_out "draw 3 (byte offset 16) is 1.5, outside [0, 1)"
  expect_rc 2 "$TK" generate "$CK/llada" --ids $P --gen-length 8 --steps 4 --json --block-length 3
  expect_out '"error"'
}

run_tests
