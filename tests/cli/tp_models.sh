#!/usr/bin/env bash
# Tensor-parallel models (docs/parallel.md) under `mpirun -np N` on this machine's CPUs: tiny Llama
# (GQA, biases, untied, uneven MLP width and vocabulary), Qwen2 (tied, q/k/v biases), a Llama where
# torch.chunk leaves the last of 3 ranks no MLP features and no vocabulary rows, GPT-2 with a plan
# file, the Llama variations that split (Qwen3, Gemma 1-3, Granite, SmolLM3, Phi-3, Mixtral, Qwen2-MoE,
# Qwen3-MoE, OLMo2, a Phi-3 with grouped kv heads) and BERT (refused), made with transformers' save_pretrained by tests/tp_models_make.py (cached in $B/tp-models,
# remade when the script changes). `tk model logits --tp N` must equal one process's logits (within
# f32 rounding of the reordered sums) and transformers' own; `tk generate --tp N` must give one
# process's tokens (greedy, sampling, beams, a batch); each rank must hold about 1/N of the weights and
# its kv heads' cache; bad setups must fail clearly on every rank, within the timeout. Skips when this
# tk was built without MPI, mpirun is missing, or the test venv is (fails under CI).
. "$(dirname "$0")/lib.sh"

PY=$TK_PY_VENV/bin/python
MODELS=$B/tp-models
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
MPIRUN+=(--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
export TK_COMM_TIMEOUT=30
LLAMA_IDS=1,17,54,99,3,76,42,100,8
QWEN_IDS=1,5,96,33,70,12,64
EDGE_IDS=1,3,0,2,3

# ready: MPI built and mpirun found, and the checkpoints made (once); else skip (fail under CI).
ready() {
  if ! "$TK" doctor --json 2>/dev/null | grep -q '"built": true'; then skip "this tk was built without MPI"; return 1; fi
  if ! command -v mpirun >/dev/null; then
    [ -n "${CI:-}" ] && { fail "mpirun is missing (apt install openmpi-bin: scripts/setup.sh)"; return 1; }
    skip "mpirun not found (scripts/setup.sh installs openmpi-bin)"; return 1
  fi
  if ! py_has "$PY" torch transformers; then
    [ -n "${CI:-}" ] && { fail "the test venv is missing ($PY): run scripts/setup.sh --test"; return 1; }
    skip "no test venv ($PY); run scripts/setup.sh --test"; return 1
  fi
  local stamp; stamp=$(sha256sum "$ROOT/tests/tp_models_make.py" | cut -c1-16)
  if [ "$(cat "$MODELS/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$MODELS"
    HF_HUB_OFFLINE=1 "$PY" "$ROOT/tests/tp_models_make.py" "$MODELS" >"$WORK/make.log" 2>&1 ||
      { fail "tp_models_make.py failed"; tail -n 20 "$WORK/make.log" >&2; return 1; }
    echo "$stamp" >"$MODELS/.stamp"
  fi
}

# run_mpi LIMIT_S NP ARGS...: mpirun under a hard outer limit (a hang fails the test, not the suite);
# sets RC, OUT (stdout), ERR (stderr) and SECS.
run_mpi() {
  local limit=$1 np=$2; shift 2
  local t0; t0=$(date +%s.%N)
  OUT=$(timeout -k 5 "$limit" "${MPIRUN[@]}" -np "$np" "$@" 2>"$WORK/err"); RC=$?
  ERR=$(cat "$WORK/err")
  SECS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
}

# check_logits MODEL NP IDS [ARGS...]: the split's logits equal one process's (relative to the largest
# logit: 1e-5) and transformers' (1e-4); every rank holds at most 1/NP of the weights plus $SLACK
# (default 10%: the norms, replicated).
check_logits() {
  local model=$1 np=$2 ids=$3; shift 3
  "$TK" model logits "$MODELS/$model" --ids "$ids" --json >"$WORK/one.json" || { fail "one process failed"; return; }
  run_mpi 120 "$np" "$TK" model logits "$MODELS/$model" --ids "$ids" --tp "$np" --json "$@"
  [ $RC = 0 ] || { fail "mpirun -np $np exited $RC: $ERR"; return; }
  echo "$OUT" >"$WORK/tp.json"
  python3 - "$WORK/one.json" "$WORK/tp.json" "$MODELS/$model/ref.json" "$np" "${SLACK:-0.1}" <<'EOF' || fail "$model at $np ranks"
import json, sys
one, tp, ref = (json.load(open(p)) for p in sys.argv[1:4])
np_ = int(sys.argv[4])
def rel(a, b):
    assert len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b)), "shapes differ"
    m = max(abs(v) for r in a for v in r)
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / m
d1, d2 = rel(one["logits"], tp["logits"]), rel(ref["logits"], tp["logits"])
info = tp["tensor_parallel"]
ranks = [r["weight_bytes"] for r in info["ranks"]]
share = [w / info["unsplit_weight_bytes"] for w in ranks]
print(f"    {np_} ranks: vs one process {d1:.2e}, vs transformers {d2:.2e}; weights per rank "
      f"{', '.join(f'{s:.1%}' for s in share)} of {info['unsplit_weight_bytes']} B")
ok = d1 <= 1e-5 and d2 <= 1e-4 and info["world_size"] == np_ and len(ranks) == np_
ok = ok and all(s <= 1 / np_ + float(sys.argv[5]) for s in share)
sys.exit(0 if ok else 1)
EOF
}

t_logits_llama_gqa_2_ranks() { ready || return; check_logits llama 2 "$LLAMA_IDS"; }
t_logits_llama_gqa_3_ranks() { ready || return; check_logits llama 3 "$LLAMA_IDS"; }
t_logits_qwen2_tied_bias_2_ranks() { ready || return; check_logits qwen2 2 "$QWEN_IDS"; }
# torch.chunk: MLP width 4 and vocabulary 4 over 3 ranks are 2, 2, 0
t_logits_rank_with_nothing_3_ranks() {
  ready || return
  check_logits llama-edge 3 "$EDGE_IDS"
  run_mpi 60 3 "$TK" model info "$MODELS/llama-edge" --json  # (info has no --tp: loads whole)
  run_mpi 120 3 "$TK" model logits "$MODELS/llama-edge" --ids "$EDGE_IDS" --tp 3
  [ $RC = 0 ] || fail "without --json: exited $RC: $ERR"
  grep -q "^tensor parallel: 3 ranks, weights per rank:" <<<"$ERR" || fail "no per-rank weights line: $ERR"
  [ "$(grep -c "^top " <<<"$OUT")" = 1 ] || fail "rank 0 alone must print: $OUT"
}

# The Llama variations that split as Llama does, on transformers' default plan (their configs carry
# none): Qwen3's per-head q/k norms, Gemma 1-3 (a tied head beside a scaled embedding table, softcaps,
# sliding layers, two RoPEs), Granite's multipliers folded into split weights, SmolLM3's NoPE layers;
# and the mixtures of experts, each expert split as the dense MLP (per-expert tensors and transformers
# 5's fused ones; Qwen2-MoE's shared expert whole on every rank: its slack); Phi-3's fused q|k|v and
# gate|up split by blocks, equal and (grouped kv heads) not (tk's plan: transformers' gathers them);
# OLMo2's q/k norms over the whole projection split with its heads, their sums of squares all-reduced
# (tk's plan: transformers' gathers q, k and v).
FAMILIES="qwen3 gemma gemma2 gemma3 granite smollm3 phi3 phi3-gqa olmo2 mixtral qwen2_moe qwen3_moe qwen3_moe-fused"
t_logits_families_2_3_ranks() {
  ready || return
  local f
  for f in $FAMILIES; do
    echo "  $f"
    check_logits "$f" 2 "$LLAMA_IDS"
    check_logits "$f" 3 "$LLAMA_IDS"
  done
}

t_generate_families() {
  ready || return
  local f
  for f in $FAMILIES; do
    pick_same "$f" 2 "--max-new-tokens 8" || continue
    pick_same "$f" 2 "--do-sample --seed 5 --top-p 0.9 --max-new-tokens 8" || continue
    pick_same "$f" 2 "--num-beams 2 --max-new-tokens 5"
  done
}

# An architecture tensor parallelism does not split (BERT): refused by name, with the architectures that
# do split; kv heads that do not divide by the ranks (Phi-3's grouped ones, 6 over 4); and transformers'
# own plans for Phi-3 and OLMo2, which gather what tk splits.
t_family_not_split() {
  ready || return
  run_mpi 60 2 "$TK" model logits "$MODELS/bert" --ids 1,2 --tp 2
  [ $RC = 8 ] || fail "exit $RC, want 8: $ERR"
  grep -q "BertForMaskedLM: tensor parallelism runs LlamaForCausalLM, .*Olmo2ForCausalLM, .*Phi3ForCausalLM, .*Qwen3MoeForCausalLM so far" <<<"$ERR" ||
    fail "no clear error: $ERR"
  grep -q "HINT: run it in one process" <<<"$ERR" || fail "no hint: $ERR"
  # Phi-3 with 6 kv heads over 4 ranks: each rank must hold whole kv heads
  run_mpi 60 4 "$TK" model logits "$MODELS/phi3-gqa" --ids 1,2 --tp 4
  [ $RC = 2 ] || [ $RC = 8 ] || fail "phi3-gqa at 4 ranks: exit $RC, want 2 or 8: $ERR"
  grep -q "num_key_value_heads 6 is not divisible by the tensor-parallel size 4" <<<"$ERR" ||
    fail "phi3-gqa at 4 ranks: no clear error: $ERR"
  # transformers' own Phi-3 plan (it gathers the fused outputs) in config.json: refused naming the style
  cp -r "$MODELS/phi3" "$WORK/phi3p"
  python3 - "$WORK/phi3p/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["base_model_tp_plan"] = {"layers.*.self_attn.qkv_proj": "colwise_gather_output",
                           "layers.*.self_attn.o_proj": "rowwise_split_input",
                           "layers.*.mlp.gate_up_proj": "colwise_gather_output",
                           "layers.*.mlp.down_proj": "rowwise_split_input"}
json.dump(c, open(sys.argv[1], "w"))
EOF
  run_mpi 60 2 "$TK" model logits "$WORK/phi3p" --ids 1,2 --tp 2
  [ $RC = 8 ] || fail "phi3 with transformers' plan: exit $RC, want 8: $ERR"
  grep -q "the style colwise_gather_output (rule 'model.layers.\*.mlp.gate_up_proj'), which tk does not run" \
    <<<"$ERR" || fail "phi3 with transformers' plan: no clear error: $ERR"
  # transformers' own OLMo2 plan (q, k and v gathered, the q/k norms whole): refused naming the norm
  cp -r "$MODELS/olmo2" "$WORK/olmo2p"
  python3 - "$WORK/olmo2p/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["base_model_tp_plan"] = {"layers.*.self_attn.q_proj": "colwise_gather_output",
                           "layers.*.self_attn.k_proj": "colwise_gather_output",
                           "layers.*.self_attn.v_proj": "colwise_gather_output",
                           "layers.*.self_attn.o_proj": "rowwise_split_input",
                           "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
                           "layers.*.mlp.down_proj": "rowwise"}
json.dump(c, open(sys.argv[1], "w"))
EOF
  run_mpi 60 2 "$TK" model logits "$WORK/olmo2p" --ids 1,2 --tp 2
  [ $RC = 8 ] || fail "olmo2 with transformers' plan: exit $RC, want 8: $ERR"
  grep -q "gives 'model.layers.0.self_attn.[qk]_norm.weight' the style replicate (rule 'none'), which tk does not run" \
    <<<"$ERR" || fail "olmo2 with transformers' plan: no clear error: $ERR"
  grep -q "OLMo2's q_norm and k_norm colwise" <<<"$ERR" || fail "olmo2 with transformers' plan: no hint: $ERR"
}

# A plan file: the default plan written out in full names gives the same; a plan that replicates the
# embedding splits the tied head out of the whole table.
default_plan() {
  cat <<'EOF'
{"model.embed_tokens": "embedding_rowwise", "model.layers.*.self_attn.q_proj": "colwise",
 "model.layers.*.self_attn.k_proj": "colwise", "model.layers.*.self_attn.v_proj": "colwise",
 "model.layers.*.self_attn.o_proj": "rowwise", "model.layers.*.mlp.gate_proj": "colwise",
 "model.layers.*.mlp.up_proj": "colwise", "model.layers.*.mlp.down_proj": "rowwise",
 "lm_head": "colwise_gather_output"}
EOF
}

t_plan_file() {
  ready || return
  default_plan >"$WORK/plan.json"
  check_logits llama 2 "$LLAMA_IDS" --tp-plan "$WORK/plan.json"
  grep -q "\"plan\":\"$WORK/plan.json\"" "$WORK/tp.json" || fail "the report does not name the plan file"
  sed 's/"embedding_rowwise"/"replicate"/' "$WORK/plan.json" >"$WORK/plan2.json"
  SLACK=0.2 check_logits qwen2 2 "$QWEN_IDS" --tp-plan "$WORK/plan2.json" # the whole table: 60%
}

# GPT-2 (Conv1D weights, a fused q|k|v, a tied head) with a plan file: transformers has none for it.
gpt2_plan() {
  cat <<'EOF'
{"transformer.wte": "embedding_rowwise",
 "transformer.h.*.attn.c_attn": {"style": "packed_colwise", "split": 3},
 "transformer.h.*.attn.c_proj": "rowwise", "transformer.h.*.mlp.c_fc": "colwise",
 "transformer.h.*.mlp.c_proj": "rowwise", "lm_head": "colwise_gather_output"}
EOF
}

t_gpt2_plan_file() {
  ready || return
  gpt2_plan >"$WORK/gpt2.json"
  SLACK=0.12 check_logits gpt2 2 "$LLAMA_IDS" --tp-plan "$WORK/gpt2.json" # wpe and the layer norms whole
  check_logits gpt2 3 "$LLAMA_IDS" --tp-plan "$WORK/gpt2.json"
  local a
  a=$("$TK" generate "$MODELS/gpt2" --ids 1,17,54,3 --do-sample --seed 3 --max-new-tokens 10 --json | grep -o '"ids": \[[0-9, ]*\]')
  run_mpi 120 3 "$TK" generate "$MODELS/gpt2" --ids 1,17,54,3 --do-sample --seed 3 --max-new-tokens 10 --tp 3 \
    --tp-plan "$WORK/gpt2.json" --json
  [ $RC = 0 ] || { fail "generate at 3 ranks exited $RC: $ERR"; return; }
  [ -n "$a" ] && [ "$(grep -o '"ids": \[[0-9, ]*\]' <<<"$OUT")" = "$a" ] || fail "sampled tokens differ: $a vs $OUT"
  # without a plan: transformers' config carries none for GPT-2
  run_mpi 60 2 "$TK" model logits "$MODELS/gpt2" --ids 1,2 --tp 2
  [ $RC = 8 ] || fail "exit $RC, want 8: $ERR"
  grep -q "GPT2LMHeadModel (gpt2) has no tensor-parallel plan" <<<"$ERR" || fail "no clear error: $ERR"
  grep -q "HINT: write one and pass it with --tp-plan FILE" <<<"$ERR" || fail "no hint: $ERR"
}

# Generation: the same tokens as one process, and the KV cache holds the rank's kv heads only.
t_generate_same_tokens() {
  ready || return
  local model opts a b
  for model in llama qwen2; do
    for opts in "--max-new-tokens 12" "--do-sample --seed 7 --temperature 1.5 --top-k 0 --max-new-tokens 12" \
                "--num-beams 3 --max-new-tokens 6" "--ids 1,9,8,7,6 --max-new-tokens 8"; do
      # shellcheck disable=SC2086
      a=$("$TK" generate "$MODELS/$model" --ids 1,17,54,3 $opts --json) || { fail "one process: $model $opts"; continue; }
      # shellcheck disable=SC2086
      run_mpi 120 2 "$TK" generate "$MODELS/$model" --ids 1,17,54,3 $opts --tp 2 --json
      [ $RC = 0 ] || { fail "$model $opts: mpirun exited $RC: $ERR"; continue; }
      python3 - "$a" "$OUT" "$model $opts" <<'EOF' || fail "$model $opts: tokens differ"
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
a, b = (x if isinstance(x, list) else [x] for x in (a, b))
ids = lambda r: [x["ids"] for x in r]
print(f"    {sys.argv[3]}: {ids(b)}")
assert ids(a) == ids(b), f"{ids(a)} != {ids(b)}"
# kv cache: the rank's kv heads (half of them at 2 ranks)
assert b[0]["stats"]["kv_bytes"] * 2 == a[0]["stats"]["kv_bytes"], (a[0]["stats"], b[0]["stats"])
EOF
    done
  done
}

# tie_model: the tiny Llama with lm_head rows 51..100 copies of rows 0..49, so every logit below 50
# has an equal twin on another rank (at 2 and 3 ranks): greedy must keep the lowest index, as the
# argmax op does, and top-k keeps both twins at its threshold.
tie_model() {
  [ -f "$MODELS/llama-tie/model.safetensors" ] && return
  mkdir -p "$MODELS/llama-tie" && cp "$MODELS/llama/config.json" "$MODELS/llama-tie/" &&
    "$PY" - "$MODELS/llama/model.safetensors" "$MODELS/llama-tie/model.safetensors" <<'EOF'
import sys
from safetensors.torch import load_file, save_file
t = load_file(sys.argv[1])
w = t["lm_head.weight"].clone()
w[51:101] = w[0:50]
t["lm_head.weight"] = w
save_file(t, sys.argv[2], metadata={"format": "pt"})
EOF
}

# pick_same MODEL NP OPTS: generate's tokens for two prompts ($PICK_IDS) at NP ranks equal one
# process's; sets PICK_BYTES (rank 0's head_bytes_sent: the logits gathers and picks).
pick_same() {
  local model=$1 np=$2 opts=$3 a ids=${PICK_IDS:---ids 1,17,54,3 --ids 5,50,51,9}
  # shellcheck disable=SC2086
  a=$("$TK" generate "$MODELS/$model" $ids $opts --json) || { fail "one process: $model $opts"; return 1; }
  # shellcheck disable=SC2086
  run_mpi 120 "$np" "$TK" generate "$MODELS/$model" $ids $opts --tp "$np" --stats --json
  [ $RC = 0 ] || { fail "$model $np ranks $opts: mpirun exited $RC: $ERR"; return 1; }
  PICK_BYTES=$(python3 - "$a" "$OUT" "$model, $np ranks, $opts" <<'EOF'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ids = lambda r: [x["ids"] for x in r]
assert ids(a) == ids(b), f"{sys.argv[3]}: {ids(a)} != {ids(b)}"
print(b[0]["tensor_parallel"]["ranks"][0]["head_bytes_sent"])
EOF
) || { fail "$model at $np ranks, $opts: tokens differ"; return 1; }
}

# pick_both MODEL NP OPTS: pick_same with the pick forced (TK_TP_PICK=local) and with the rows gathered.
pick_both() {
  local MPIRUN=("${MPIRUN[@]}" -x TK_TP_PICK=local)
  pick_same "$@" || return
  MPIRUN=("${MPIRUN[@]:0:${#MPIRUN[@]}-2}" -x TK_TP_PICK=gather)
  pick_same "$@"
}

# The vocabulary-parallel pick: greedy, seeded sampling with and without top-k (ties at its threshold),
# top-p, min-p, beam search, and with penalties give one process's tokens at 2 and 3 ranks, on logits with ties across ranks and
# on a rank with no vocabulary rows; it moves a few numbers a row where the gather moved the rows.
t_vocab_parallel_pick() {
  ready || return
  tie_model || { fail "could not make llama-tie"; return; }
  local opts np s
  for np in 2 3; do
    for opts in "--max-new-tokens 10" "--max-new-tokens 10 --repetition-penalty 1.5 --no-repeat-ngram-size 2"; do
      pick_same llama-tie "$np" "$opts"
    done
    for s in 1 2 3; do
      pick_same llama-tie "$np" "--do-sample --seed $s --top-k 0 --max-new-tokens 8"
      pick_same llama-tie "$np" "--do-sample --seed $s --top-k 3 --temperature 0.8 --max-new-tokens 8"
      # min-p: the rows' softmax sums over the ranks (exact, order-independent), the filter on each
      # rank's columns; after top-k, with penalties (-inf columns), on twins across ranks
      pick_both llama-tie "$np" "--do-sample --seed $s --top-k 0 --min-p 0.2 --temperature 2 --max-new-tokens 8"
      pick_both llama-tie "$np" "--do-sample --seed $s --top-k 9 --min-p 0.5 --repetition-penalty 1.3 --no-repeat-ngram-size 2 --max-new-tokens 8"
      # top-p: the exact prefix sums' boundary found from the ranks' masses; twins tie across ranks
      pick_both llama-tie "$np" "--do-sample --seed $s --top-k 0 --top-p 0.$((3 * s)) --temperature 1.7 --max-new-tokens 8"
      pick_both llama-tie "$np" "--do-sample --seed $s --top-k 20 --top-p 0.9 --min-p 0.1 --repetition-penalty 1.3 --max-new-tokens 8"
    done
    # beam search: the rows' log-softmax over the ranks, each rank's 2 x beams best, their union's best
    pick_both llama-tie "$np" "--num-beams 3 --max-new-tokens 8"
    pick_both llama-tie "$np" "--num-beams 4 --repetition-penalty 1.4 --no-repeat-ngram-size 2 --eos-token-id 7 --max-new-tokens 8"
  done
  pick_same llama-tie 2 "--do-sample --seed 4 --top-k 7 --no-cache --max-new-tokens 8" # the full recompute
  # vocabulary 4 over 3 ranks (2, 2, 0 rows): a pick sends more than a row, so force it
  local MPIRUN=("${MPIRUN[@]}" -x TK_TP_PICK=local)
  PICK_IDS="--ids 1,3,0,2 --ids 2,2" pick_same llama-edge 3 "--do-sample --seed 4 --top-k 2 --max-new-tokens 6"
  PICK_IDS="--ids 1,3,0,2 --ids 2,2" pick_same llama-edge 3 "--max-new-tokens 6"
  PICK_IDS="--ids 1,3,0,2 --ids 2,2" pick_same llama-edge 3 "--do-sample --seed 4 --min-p 0.3 --temperature 3 --max-new-tokens 6"
  PICK_IDS="--ids 1,3,0,2 --ids 2,2" pick_same llama-edge 3 "--do-sample --seed 4 --top-p 0.6 --temperature 3 --max-new-tokens 6"
  PICK_IDS="--ids 1,3,0,2 --ids 2,2" pick_same llama-edge 3 "--num-beams 2 --max-new-tokens 6"
  MPIRUN=("${MPIRUN[@]:0:${#MPIRUN[@]}-2}")
  # top-p's search sends more than a row of 101 logits: by default those steps gather the rows
  pick_same llama 2 "--do-sample --seed 5 --top-p 0.8 --max-new-tokens 8" || return
  local gathered=$PICK_BYTES
  local MPIRUN=("${MPIRUN[@]}" -x TK_TP_PICK=local)
  pick_same llama 2 "--do-sample --seed 5 --top-p 0.8 --max-new-tokens 8" || return
  local topp=$PICK_BYTES
  MPIRUN=("${MPIRUN[@]:0:${#MPIRUN[@]}-2}")
  pick_same llama 2 "--do-sample --seed 5 --top-k 3 --max-new-tokens 8" || return
  local picked=$PICK_BYTES
  pick_same llama 2 "--max-new-tokens 8" || return
  local greedy=$PICK_BYTES
  pick_same llama 2 "--do-sample --seed 5 --top-k 0 --min-p 0.1 --max-new-tokens 8" || return
  local minp=$PICK_BYTES
  pick_same llama 2 "--num-beams 3 --max-new-tokens 8" || return
  local beams=$PICK_BYTES
  MPIRUN+=(-x TK_TP_PICK=gather) # the rows gathered, as before the pick existed
  pick_same llama 2 "--do-sample --seed 5 --top-k 0 --min-p 0.1 --max-new-tokens 8" || return
  local rows_minp=$PICK_BYTES
  pick_same llama 2 "--num-beams 3 --max-new-tokens 8" || return
  local rows_beams=$PICK_BYTES
  pick_same llama 2 "--max-new-tokens 8" || return
  local rows=$PICK_BYTES
  pick_same llama 2 "--do-sample --seed 5 --top-k 3 --max-new-tokens 8" || return
  local rows_k=$PICK_BYTES
  pick_same llama 2 "--do-sample --seed 5 --top-p 0.8 --max-new-tokens 8" || return
  echo "    head bytes rank 0 sent, 2 prompts x 8 tokens, vocabulary 101: greedy $greedy (rows gathered: $rows)," \
    "top-k 3 sampling $picked ($rows_k), min-p $minp ($rows_minp), 3 beams $beams ($rows_beams), top-p $gathered ($PICK_BYTES; forced $topp)"
  [ "$beams" -gt 0 ] && [ "$beams" -lt "$rows_beams" ] || fail "the beams' pick sent $beams B, the gather $rows_beams B"
  [ "$minp" -gt 0 ] && [ "$minp" -lt "$rows_minp" ] || fail "the min-p pick sent $minp B, the gather $rows_minp B"
  [ "$greedy" -gt 0 ] && [ "$greedy" -lt "$rows" ] || fail "the greedy pick sent $greedy B, the gather $rows B"
  [ "$picked" -gt 0 ] && [ "$picked" -lt "$rows_k" ] || fail "the top-k pick sent $picked B, the gather $rows_k B"
  [ "$gathered" = "$PICK_BYTES" ] || fail "top-p on 101 logits should gather the rows: $gathered B vs $PICK_BYTES B"
}

# nonfinite_model NAME SRC SPEC: $MODELS/NAME, SRC's checkpoint whose LM head (untied: the embedding
# stays finite) gives NaN, +inf and -inf logits. SPEC is "TOKEN:DIMS;...": TOKEN's row is zero but +inf
# or -inf at each of DIMS ("0+,1-"), so its logit is +-inf by the sign of the final hidden state at DIM,
# and NaN where two infinities of opposite signs meet; the mix changes from step to step.
nonfinite_model() {
  local d=$MODELS/$1
  [ "$(cat "$d/.spec" 2>/dev/null)" = "$3" ] && return
  mkdir -p "$d" && "$PY" - "$MODELS/$2" "$d" "$3" <<'EOF' && echo "$3" >"$d/.spec"
import json, sys
from safetensors.torch import load_file, save_file
src, dst, spec = sys.argv[1:4]
t = load_file(src + "/model.safetensors")
w = t.get("lm_head.weight", t["model.embed_tokens.weight"]).clone()
for item in spec.split(";"):
    tok, dims = item.split(":")
    w[int(tok)] = 0
    for d in dims.split(","):
        w[int(tok), int(d[:-1])] = float("inf") if d[-1] == "+" else float("-inf")
t["lm_head.weight"] = w
save_file(t, dst + "/model.safetensors", metadata={"format": "pt"})
c = json.load(open(src + "/config.json"))
c["tie_word_embeddings"] = False
json.dump(c, open(dst + "/config.json", "w"), indent=2)
EOF
}

# beam_fails MODEL NP IDS PROMPT: beam search over NaN or +inf logits fails, with the pick forced and with
# the rows gathered, as one process fails: the same exit status and message, naming the prompt (PROMPT,
# the first whose logits hold one) and the step.
beam_fails() {
  local mode want rc
  # shellcheck disable=SC2086
  want=$("$TK" generate "$MODELS/$1" $3 --num-beams 3 --max-new-tokens 6 2>&1); rc=$?
  [ $rc = 2 ] && grep -q "beam search, prompt $4, step 0: the logits of beam 0 hold NaN or +inf" <<<"$want" ||
    { fail "one process: exit $rc: $want"; return; }
  for mode in local gather; do
    # shellcheck disable=SC2086
    run_mpi 120 "$2" -x TK_TP_PICK=$mode "$TK" generate "$MODELS/$1" $3 --num-beams 3 --max-new-tokens 6 --tp "$2"
    [ $RC = $rc ] || fail "$1, $2 ranks, $mode: exit $RC, want $rc: $ERR"
    # (each rank says it, but the first to end the job may stop another before it does)
    grep -q -F "$(head -n 1 <<<"$want")" <<<"$ERR" || fail "$1, $2 ranks, $mode: no rank says '$want': $ERR"
  done
}

# Rows with NaN, +inf and -inf logits: the pick over the ranks equals one process's. test_tp_pick's
# worker picks rows with them on every column (rank boundaries, the rank that holds no vocabulary rows)
# with every option, log-probabilities included, bit for bit, and top-p on 1000 columns both ways (the
# first round settles peaked rows, the search the rest); then tk generate on checkpoints whose
# logits are NaN and +-inf on rank boundaries (2 and 3 ranks: tokens 33, 34, 50, 51, 68 of 101; 3
# ranks of a vocabulary of 4, the last rank with none): greedy (NaN wins, as torch.argmax), sampling
# (NaN as -inf, +inf softmax's limit) with top-k, top-p, min-p and penalties, forced and gathered; beam
# search fails as one process fails.
t_vocab_parallel_pick_nonfinite() {
  ready || return
  local np opts
  for np in 2 3; do
    run_mpi 120 "$np" "$B/tests/test_tp_pick" --worker
    [ $RC = 0 ] && [ "$(grep -c '^3 passed, 0 failed' <<<"$OUT")" = "$np" ] ||
      fail "test_tp_pick --worker at $np ranks exited $RC: $(grep -v '^ok' <<<"$OUT") $(tail -n 20 <<<"$ERR")"
  done
  nonfinite_model llama-nf llama "34:0+,1-;51:2+,3-;50:4+;33:5+;68:4+" &&
    nonfinite_model llama-edge-nf llama-edge "0:3-;1:0+,1-;3:2+" || { fail "could not make the checkpoints"; return; }
  # tk model logits --json writes each NaN and +-inf logit as null (strict JSON), the rest as numbers
  expect_rc 0 "$TK" model logits "$MODELS/llama-nf" --ids 1,17,54,3 --json
  python3 -c 'import json, math, sys
def bad(c): raise ValueError("not JSON: " + c)
rows = json.loads(sys.stdin.read(), parse_constant=bad)["logits"]
nulls = sum(v is None for r in rows for v in r)
assert nulls > 0 and all(v is None or math.isfinite(v) for r in rows for v in r), nulls' <<<"$OUT" ||
    fail "tk model logits --json on non-finite logits: ${OUT:0:300}"
  for np in 2 3; do
    for opts in "--max-new-tokens 8" "--max-new-tokens 8 --repetition-penalty 1.5 --no-repeat-ngram-size 2" \
                "--do-sample --seed 1 --top-k 0 --max-new-tokens 8" "--do-sample --seed 2 --top-k 3 --max-new-tokens 8" \
                "--do-sample --seed 3 --top-k 0 --top-p 0.5 --temperature 1.5 --max-new-tokens 8" \
                "--do-sample --seed 4 --top-k 0 --min-p 0.3 --no-repeat-ngram-size 2 --max-new-tokens 8" \
                "--do-sample --seed 5 --top-k 20 --top-p 0.9 --min-p 0.1 --repetition-penalty 1.3 --max-new-tokens 8"; do
      pick_both llama-nf "$np" "$opts"
    done
    beam_fails llama-nf "$np" "--ids 1,17,54,3 --ids 5,50,51,9" 0
  done
  local MPIRUN=("${MPIRUN[@]}" -x TK_TP_PICK=local) # vocabulary 4: a pick sends more than a row
  for opts in "--max-new-tokens 8" "--max-new-tokens 8 --no-repeat-ngram-size 2" \
              "--do-sample --seed 4 --top-k 2 --max-new-tokens 8" \
              "--do-sample --seed 4 --top-p 0.5 --temperature 3 --max-new-tokens 8" \
              "--do-sample --seed 5 --min-p 0.3 --max-new-tokens 8"; do
    PICK_IDS="--ids 1,3,0,2 --ids 2,2 --ids 3" pick_same llama-edge-nf 3 "$opts"
  done
  MPIRUN=("${MPIRUN[@]:0:${#MPIRUN[@]}-2}")
  beam_fails llama-edge-nf 3 "--ids 1,3,0,2 --ids 3" 1 # the first prompt's first row is finite
}

# with_words MODEL: $WORK/MODEL-w, the checkpoint with a WordLevel tokenizer of its vocabulary (w0, w1,
# ...), which tk serve-model wants; prints its directory.
with_words() {
  local d=$WORK/$1-w
  [ -f "$d/tokenizer.json" ] || { cp -r "$MODELS/$1" "$d" && "$PY" - "$d" <<'EOF'; } || return 1
import json, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
V = json.load(open(sys.argv[1] + "/config.json"))["vocab_size"]
t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
t.pre_tokenizer = pre_tokenizers.Whitespace()
t.decoder = decoders.WordPiece(prefix="##")
t.save(sys.argv[1] + "/tokenizer.json")
EOF
  echo "$d"
}

# serve_answers DIR NAME NP [ENV=VALUE]: serves DIR (one process when NP is 1, else --tp NP under mpirun,
# with ENV=VALUE exported to the ranks), posts each of $LP_BODIES to /v1/completions, and keeps each
# answer's choices (text, logprobs, finish reason) in $WORK/NAME.I; HEAD_BYTES: what rank 0 says it sent
# of the LM head (logits rows and picks), at exit.
serve_answers() {
  local dir=$1 name=$2 np=$3 port pid i cmd=("$TK" serve-model "$1")
  port=$(free_port)
  [ "$np" -gt 1 ] && cmd=("${MPIRUN[@]}" ${4:+-x "$4"} -np "$np" "$TK" serve-model "$dir" --tp "$np")
  timeout -k 5 120 "${cmd[@]}" --listen "127.0.0.1:$port" >/dev/null 2>"$WORK/$name.log" &
  pid=$!
  for i in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  for i in "${!LP_BODIES[@]}"; do
    curl -s -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "${LP_BODIES[$i]}" | python3 -c 'import json, sys; j = json.load(sys.stdin)
print(json.dumps([[c["text"], c["logprobs"], c["finish_reason"]] for c in j["choices"]] if "choices" in j else j))' \
      >"$WORK/$name.$i"
  done
  local r0=$pid p # SIGTERM to rank 0: it drains, then the job ends (its note on stderr)
  for p in $(pgrep -f "serve-model $dir --tp $np --listen 127.0.0.1:$port"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=0 && r0=$p
  done
  kill -TERM "$r0"; wait "$pid"
  HEAD_BYTES=$(sed -n 's/.*rank 0 sent \([0-9]*\) B of logits.*/\1/p' "$WORK/$name.log")
}

# lp_same NAME REF: every answer of NAME equals REF's ($WORK/REF.I): the same JSON, or with REF one
# process (whose logits differ from the split's in f32 rounding: the rowwise sums add in another order),
# the same tokens and top ids and log-probabilities within 1e-5.
lp_same() {
  local i
  for i in "${!LP_BODIES[@]}"; do
    grep -q 'token_logprobs' "$WORK/$2.$i" || { fail "$2, request $i: $(cat "$WORK/$2.$i")"; continue; }
    if [ "$2" != one ]; then
      cmp -s "$WORK/$2.$i" "$WORK/$1.$i" || fail "$1, request $i: $(head -c 300 "$WORK/$1.$i") vs $2 $(head -c 300 "$WORK/$2.$i")"
      continue
    fi
    python3 - "$WORK/$1.$i" "$WORK/one.$i" <<'EOF' || fail "$1, request $i: $(head -c 300 "$WORK/$1.$i") vs one process $(head -c 300 "$WORK/one.$i")"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert len(a) == len(b)
for (ta, la, fa), (tb, lb, fb) in zip(a, b):
    assert (ta, fa, la["tokens"]) == (tb, fb, lb["tokens"])
    assert all(abs(x - y) <= 1e-5 for x, y in zip(la["token_logprobs"], lb["token_logprobs"]))
    for x, y in zip(la["top_logprobs"] or [], lb["top_logprobs"] or []):
        assert sorted(x) == sorted(y) and all(abs(x[k] - y[k]) <= 1e-5 for k in x)
EOF
  done
}

# Log-probabilities (logprobs, top_logprobs), top-p and min-p over the vocabulary-parallel pick: tk serve-model
# --tp 2 and 3 with the pick forced answer exactly what they answer with the rows gathered (the same JSON),
# and one process's tokens and log-probabilities (within f32 rounding of the split's logits), on logits with twins across ranks (ties in the top log-probabilities)
# and on a rank with no vocabulary rows; the pick sends fewer head bytes than the gather.
t_vocab_parallel_logprobs() {
  ready || return
  tie_model || { fail "could not make llama-tie"; return; }
  local tie edge np mode
  tie=$(with_words llama-tie) && edge=$(with_words llama-edge) || { fail "no tokenizer for the test models"; return; }
  LP_BODIES=(
    '{"model": "llama-tie-w", "prompt": [1, 17, 54, 3], "max_tokens": 8, "temperature": 0, "logprobs": 5}'
    '{"model": "llama-tie-w", "prompt": [5, 50, 51, 9], "max_tokens": 8, "temperature": 0, "logprobs": 0}'
    '{"model": "llama-tie-w", "prompt": [1, 17], "max_tokens": 8, "seed": 3, "temperature": 1.5, "top_k": 0, "logprobs": 3, "n": 2}'
    '{"model": "llama-tie-w", "prompt": [8, 99], "max_tokens": 8, "seed": 4, "temperature": 2, "top_k": 0, "min_p": 0.3, "logprobs": 20}'
    '{"model": "llama-tie-w", "prompt": [1, 2, 3], "max_tokens": 8, "seed": 5, "temperature": 1, "top_k": 5, "min_p": 0.5, "presence_penalty": 1.5, "logprobs": 2}'
    '{"model": "llama-tie-w", "prompt": [4, 60], "max_tokens": 8, "seed": 6, "temperature": 1.8, "top_k": 0, "top_p": 0.7, "logprobs": 4, "n": 2}'
    '{"model": "llama-tie-w", "prompt": [7, 7], "max_tokens": 8, "seed": 7, "temperature": 1.2, "top_k": 30, "top_p": 0.9, "min_p": 0.05, "logprobs": 1}'
  )
  serve_answers "$tie" one 1
  for np in 2 3; do
    for mode in local gather; do
      serve_answers "$tie" "tp$np$mode" "$np" "TK_TP_PICK=$mode"
      lp_same "tp$np$mode" one
      eval "bytes_$np$mode=\${HEAD_BYTES:-0}"
    done
    lp_same "tp${np}local" "tp${np}gather"
  done
  # unforced, each step picks whichever sends fewer bytes (top-p's search gathers on 101 logits)
  serve_answers "$tie" tp2auto 2
  lp_same tp2auto tp2gather
  echo "    $(head -c 400 "$WORK/one.0")..."
  # shellcheck disable=SC2154
  echo "    head bytes rank 0 sent, ${#LP_BODIES[@]} requests: 2 ranks $HEAD_BYTES (forced pick: $bytes_2local, rows" \
    "gathered: $bytes_2gather), 3 ranks forced $bytes_3local ($bytes_3gather)"
  # shellcheck disable=SC2154
  [ "${HEAD_BYTES:-0}" -gt 0 ] && [ "$HEAD_BYTES" -lt "$bytes_2gather" ] || fail "2 ranks: the pick sent $HEAD_BYTES B, the gather $bytes_2gather B"
  # vocabulary 4 over 3 ranks (2, 2, 0 rows)
  LP_BODIES=(
    '{"model": "llama-edge-w", "prompt": [1, 3, 0, 2], "max_tokens": 6, "temperature": 0, "logprobs": 3}'
    '{"model": "llama-edge-w", "prompt": [2, 2], "max_tokens": 6, "seed": 4, "temperature": 2, "min_p": 0.3, "logprobs": 4}'
    '{"model": "llama-edge-w", "prompt": [3], "max_tokens": 6, "seed": 5, "temperature": 2, "top_p": 0.5, "logprobs": 2}'
  )
  serve_answers "$edge" one 1
  serve_answers "$edge" tp3edge 3 TK_TP_PICK=local
  lp_same tp3edge one
  serve_answers "$edge" tp3edgeg 3 TK_TP_PICK=gather
  lp_same tp3edge tp3edgeg
}

# tk chat --tp: rank 0 reads the turns and sends them to the other rank; the replies are one process's
# (the tiny Llama with a tokenizer of tests/models/tiny.sh, a template added as tests/cli/chat.sh does).
t_chat_same_replies() {
  ready || return
  local ck d=$WORK/chatck f a
  ck=$(bash "$ROOT/tests/models/tiny.sh" llama 2>"$WORK/tiny.log") || { fail "tiny.sh: $(tail -n 3 "$WORK/tiny.log")"; return; }
  mkdir -p "$d"
  for f in config.json generation_config.json model.safetensors tokenizer.json; do ln -sf "$ck/$f" "$d/$f"; done
  printf '%s\n' '{"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{% for m in messages %}{{ bos_token + m[\"role\"][0] + \": \" + m[\"content\"] + eos_token }}{% endfor %}{% if add_generation_prompt %}{{ bos_token + \"a:\" }}{% endif %}"}' >"$d/tokenizer_config.json"
  a=$(printf 'Once upon\n\nthe fox\n' | "$TK" --json chat "$d" --system "Be brief." --max-new-tokens 6) || { fail "one process failed"; return; }
  OUT=$(printf 'Once upon\n\nthe fox\n' | timeout -k 5 60 "${MPIRUN[@]}" -np 2 "$TK" --json chat "$d" --system "Be brief." \
    --max-new-tokens 6 --tp 2 2>"$WORK/err"); RC=$?
  [ $RC = 0 ] || { fail "mpirun exited $RC: $(cat "$WORK/err")"; return; }
  [ "$(grep -c '"turn"' <<<"$OUT")" = 2 ] || fail "want 2 replies from rank 0 alone: $OUT"
  [ "$OUT" = "$a" ] || fail "the replies differ: $a vs $OUT"
}

# gen_lp_same MODEL NP OPTS [ARGS...]: tk generate --logprobs at NP ranks gives one process's tokens and
# log-probabilities (chosen and --top-logprobs: the same ids, values within 1e-5, f32 rounding of the
# split forward's sums) for two prompts.
gen_lp_same() {
  local model=$1 np=$2 opts=$3 a; shift 3
  # shellcheck disable=SC2086
  a=$("$TK" generate "$MODELS/$model" --ids 1,17,54,3 --ids 5,50,51,9 $opts --json) || { fail "one process: $model $opts"; return 1; }
  # shellcheck disable=SC2086
  run_mpi 120 "$np" "$TK" generate "$MODELS/$model" --ids 1,17,54,3 --ids 5,50,51,9 $opts --tp "$np" --json "$@"
  [ $RC = 0 ] || { fail "$model $np ranks $opts: mpirun exited $RC: $ERR"; return 1; }
  python3 - "$a" "$OUT" "$model, $np ranks, $opts ${TK_TP_PICK_SHOWN:-}" <<'PYEOF' || { fail "$model at $np ranks, $opts: logprobs differ"; return 1; }
import json, sys
def strict(c):
    raise ValueError("not JSON: " + c)
a, b = (json.loads(x, parse_constant=strict) for x in sys.argv[1:3])
worst, n = 0.0, 0
for x, y in zip(a, b):
    assert x["ids"] == y["ids"], (x["ids"], y["ids"])
    assert len(x["logprobs"]) == len(y["logprobs"]) == len(x["ids"]) > 0
    for e, f in zip(x["logprobs"], y["logprobs"]):
        assert e["id"] == f["id"] and len(e["top"]) == len(f["top"]), (e, f)
        pairs = [(e, f)] + list(zip(e["top"], f["top"]))
        for u, v in pairs:
            assert u["id"] == v["id"], (e, f)
            if u["logprob"] is None or v["logprob"] is None:  # NaN or inf: null in both
                assert u["logprob"] is v["logprob"], (e, f)
            else:
                worst = max(worst, abs(u["logprob"] - v["logprob"]))
            n += 1
assert worst <= 1e-5, worst
print(f"    {sys.argv[3]}: {n} log-probabilities, max |one process - ranks| {worst:.1e}")
PYEOF
}

# --logprobs over the split head (models/tp_pick.c's log_softmax over the ranks' columns, and with the
# rows gathered): greedy and sampling with --top-logprobs, Llama at 2 and 3 ranks, GPT-2 with a plan;
# on NaN and +-inf logits (docs/parallel.md "Non-finite logits": a row with a NaN or a +inf has NaN
# log-probabilities and no top ones) every value is null in strict JSON, alone and split.
t_generate_logprobs() {
  ready || return
  local np pick opts
  for np in 2 3; do
    for pick in local gather; do
      for opts in "--max-new-tokens 8 --top-logprobs 5" \
                  "--do-sample --seed 7 --temperature 1.5 --top-k 0 --max-new-tokens 8 --logprobs --top-logprobs 3"; do
        local MPIRUN=("${MPIRUN[@]}" -x TK_TP_PICK=$pick)
        TK_TP_PICK_SHOWN="(TK_TP_PICK=$pick)" gen_lp_same llama "$np" "$opts"
      done
    done
  done
  gpt2_plan >"$WORK/gpt2.json"
  gen_lp_same gpt2 2 "--max-new-tokens 8 --logprobs --top-logprobs 20" --tp-plan "$WORK/gpt2.json"
  nonfinite_model llama-nf llama "34:0+,1-;51:2+,3-;50:4+;33:5+;68:4+" || { fail "could not make llama-nf"; return; }
  gen_lp_same llama-nf 2 "--max-new-tokens 6 --top-logprobs 3" || return
  python3 -c 'import json, sys
d = json.loads(sys.argv[1], parse_constant=lambda c: 1 / 0)
e = [e for x in d for e in x["logprobs"]]
assert e and all(x["logprob"] is None and x["top"] == [] for x in e), e
assert all(x["logprob_sum"] is None for x in d), d' "$OUT" || fail "non-finite logits: want null logprobs, no tops: ${OUT:0:400}"
}

# Streaming text: rank 0 alone prints.
t_generate_rank0_prints() {
  ready || return
  run_mpi 120 2 "$TK" generate "$MODELS/llama" --ids 1,17,54,3 --max-new-tokens 5 --tp 2 --stats
  [ $RC = 0 ] || { fail "exited $RC: $ERR"; return; }
  [ "$(grep -c . <<<"$OUT")" = 1 ] || fail "want one line of ids from rank 0: $OUT"
  [ "$(grep -c '"prefill_ms"' <<<"$ERR")" = 1 ] || fail "want one --stats line (rank 0's): $ERR"
}

t_heads_not_divisible() {
  ready || return
  run_mpi 60 3 "$TK" model logits "$MODELS/qwen2" --ids "$QWEN_IDS" --tp 3
  [ $RC != 0 ] && [ $RC != 124 ] || fail "exit $RC: want a failure, not a hang ($SECS s)"
  grep -q "num_attention_heads 4 is not divisible by the tensor-parallel size 3" <<<"$ERR" || fail "no clear error: $ERR"
  grep -q "sizes that fit this model: 1, 2" <<<"$ERR" || fail "no hint of the sizes that fit: $ERR"
}

t_world_size_differs() {
  ready || return
  run_mpi 60 2 "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --tp 3
  [ $RC = 2 ] || fail "exit $RC, want 2 ($SECS s)"
  grep -q -- "--tp 3, but 2 processes were started" <<<"$ERR" || fail "no clear error: $ERR"
  [ "$(grep -c -- '--tp 3, but' <<<"$ERR")" = 1 ] || fail "rank 0 alone must say so: $ERR"
  expect_rc 2 "$TK" generate "$MODELS/llama" --ids 1,2 --tp 2
  expect_out "--tp 2, but 1 process was started"
  expect_out "mpirun -np N"
  expect_rc 2 "$TK" model logits "$MODELS/llama" --ids 1,2 --tp-plan "$WORK/none.json"
  expect_out "--tp-plan goes with --tp N"
  expect_rc 2 "$TK" model logits "$MODELS/llama" --ids 1,2 --tp 0
  expect_out "--tp wants the number of ranks"
}

# One rank's checkpoint is damaged (a truncated safetensors file): every rank fails, within the
# timeout, the others naming the rank that could not load.
t_rank_cannot_open_checkpoint() {
  ready || return
  cp -r "$MODELS/llama" "$WORK/bad"
  truncate -s 1000 "$WORK/bad/model.safetensors"
  cat >"$WORK/rank.sh" <<EOF
#!/bin/sh
d="$MODELS/llama"; [ "\$OMPI_COMM_WORLD_RANK" = 1 ] && d="$WORK/bad"
exec "$TK" model logits "\$d" --ids $LLAMA_IDS --tp 2
EOF
  chmod +x "$WORK/rank.sh"
  run_mpi 60 2 "$WORK/rank.sh"
  [ $RC != 0 ] && [ $RC != 124 ] || fail "exit $RC: want a failure, not a hang ($SECS s)"
  awk -v s="$SECS" 'BEGIN{exit !(s < 30)}' || fail "took ${SECS}s, more than the 30 s timeout"
  grep -q "model.safetensors" <<<"$ERR" || fail "rank 1 does not say what is wrong: $ERR"
  grep -q "rank 1 of 2 could not load the model" <<<"$ERR" || fail "rank 0 does not name rank 1: $ERR"
  [ -z "$OUT" ] || fail "nothing may print on stdout: $OUT"
}

# A rank killed mid-generation (SIGKILL 1.5 s into a job of ~9 s on a 2-core Zen 4: 32 prompts, 4
# beams each, no early stop; greedy alone finished in under 1.5 s there and the test failed): the
# other ends non-zero well within the timeout, nothing printed as a result.
t_rank_killed_mid_generation() {
  ready || return
  local args="" i
  for i in $(seq 32); do args="$args --ids 1,$i,3"; done
  cat >"$WORK/kill.sh" <<EOF
#!/bin/bash
"$TK" generate "$MODELS/llama" $args --max-new-tokens 120 --no-cache --num-beams 4 --early-stopping never --tp 2 --json &
pid=\$!
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ]; then sleep 1.5; echo "rank 1: killing \$pid" >&2; kill -9 \$pid; fi
wait \$pid
EOF
  chmod +x "$WORK/kill.sh"
  run_mpi 60 2 "$WORK/kill.sh"
  [ $RC != 0 ] && [ $RC != 124 ] || fail "exit $RC: the job must fail, not hang ($SECS s)"
  awk -v s="$SECS" 'BEGIN{exit !(s < 30)}' || fail "took ${SECS}s, more than the 30 s timeout"
  grep -q "rank 1: killing" <<<"$ERR" || fail "the victim was not killed (did the job end first?): $ERR"
  grep -qi "signal 9\|killed\|non-zero" <<<"$ERR" || fail "mpirun does not say a rank died: $ERR"
  [ -z "$OUT" ] || fail "a result was printed: ${OUT:0:200}"
}

# A plan tk cannot run (q_proj split on its input features), a style transformers does not know.
t_bad_plans() {
  ready || return
  default_plan | sed 's/q_proj": "colwise"/q_proj": "rowwise"/' >"$WORK/p1.json"
  run_mpi 60 2 "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --tp 2 --tp-plan "$WORK/p1.json"
  [ $RC = 8 ] || fail "exit $RC, want 8 (unsupported): $ERR"
  grep -q "gives 'model.layers.0.self_attn.q_proj.[a-z]*' the style rowwise (rule 'model.layers.\*.self_attn.q_proj')" <<<"$ERR" || fail "no clear error: $ERR"
  echo '{"model.layers.*.mlp.up_proj": "colwize"}' >"$WORK/p2.json"
  run_mpi 60 2 "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --tp 2 --tp-plan "$WORK/p2.json"
  [ $RC = 2 ] || fail "exit $RC, want 2: $ERR"
  grep -q "unsupported tp_plan style: 'colwize'" <<<"$ERR" || fail "no clear error: $ERR"
}

# --tp N with --device cuda (docs/parallel.md, "A split model on GPUs"): the backend is chosen
# (NCCL with a GPU a rank, else MPI staging through host memory) and TK_COMM_BACKEND forces it. Here,
# without a GPU: every rank stops with the driver's error (exit 7), not the refusal that was here
# before the split ran on GPUs; TK_COMM_BACKEND's bad value and NCCL for a CPU model are usage errors
# on every rank; TK_COMM_BACKEND=mpi on the CPU is the plain MPI split. (With a GPU the first case
# would run: scripts/gpu-check.sh's phase 1f checks the split there.)
t_gpu_backend_choice() {
  ready || return
  if "$TK" doctor --require-gpu >/dev/null 2>&1; then skip "this machine has a GPU (gpu-check phase 1f runs the split)"; return; fi
  run_mpi 60 2 "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --tp 2 --device cuda
  [ $RC = 7 ] || fail "--device cuda --tp 2 without a GPU: exit $RC, want 7: $ERR"
  [ "$(grep -c -- '--tp 2 --device cuda: ' <<<"$ERR")" = 2 ] || fail "not every rank said why: $ERR"
  grep -q "not on a GPU\|run on the CPU (MPI) so far" <<<"$ERR" && fail "the old refusal: $ERR"
  run_mpi 60 2 env TK_COMM_BACKEND=gloo "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --tp 2 --device cuda
  [ $RC = 2 ] || fail "TK_COMM_BACKEND=gloo: exit $RC, want 2: $ERR"
  grep -q "TK_COMM_BACKEND='gloo': want auto, mpi or nccl" <<<"$ERR" || fail "TK_COMM_BACKEND=gloo: no clear error: $ERR"
  run_mpi 60 2 env TK_COMM_BACKEND=nccl "$TK" generate "$MODELS/llama" --ids "$LLAMA_IDS" --tp 2 --max-new-tokens 2
  [ $RC = 2 ] || fail "TK_COMM_BACKEND=nccl on the CPU: exit $RC, want 2: $ERR"
  grep -q "TK_COMM_BACKEND=nccl, but the model runs on the CPU" <<<"$ERR" || fail "nccl on the CPU: no clear error: $ERR"
  grep -q "HINT: add --device cuda" <<<"$ERR" || fail "nccl on the CPU: no hint: $ERR"
  "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --json >"$WORK/one.json" || { fail "one process failed"; return; }
  run_mpi 60 2 env TK_COMM_BACKEND=mpi "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --tp 2 --json
  [ $RC = 0 ] || { fail "TK_COMM_BACKEND=mpi on the CPU: exit $RC: $ERR"; return; }
  python3 - "$WORK/one.json" <(echo "$OUT") <<'EOF2' || fail "TK_COMM_BACKEND=mpi: not one process's logits"
import json, sys
a, b = (json.load(open(p))["logits"] for p in sys.argv[1:3])
m = max(abs(v) for r in a for v in r)
sys.exit(0 if max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / m <= 1e-5 else 1)
EOF2
  grep -q "tensor parallel on GPUs" <<<"$ERR" && fail "a GPU notice on the CPU: $ERR"
  return 0
}

# --tp 1 without mpirun: one process, the plan still checked, the same logits.
t_tp_1_alone() {
  ready || return
  expect_rc 0 "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --json
  local a=$OUT
  expect_rc 0 "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --tp 1 --json
  [ "${OUT%%, \"tensor_parallel\"*}" = "${a%\}}" ] || fail "--tp 1 changed the logits"
  echo '{"model.layers.*.mlp.up_proj": "colwize"}' >"$WORK/p2.json"
  expect_rc 2 "$TK" model logits "$MODELS/llama" --ids "$LLAMA_IDS" --tp 1 --tp-plan "$WORK/p2.json"
  expect_out "unsupported tp_plan style: 'colwize'"
}

run_tests
