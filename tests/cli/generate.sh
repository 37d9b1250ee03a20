#!/usr/bin/env bash
# tk generate against transformers' generate() on tiny random Llama and GPT-2 checkpoints (made by
# tests/models/gen_oracle.py, seeded): greedy and beam search token for token, with repetition
# penalty, no-repeat n-grams, eos lists, length penalties and every early_stopping mode; batches; the
# cache-less reference path; --prompt through the tokenizer; streaming; and clear errors for bad input.
# Needs the test venv ($TK_PY_VENV, default ~/.cache/tk/py-venv); under CI=true its absence is a failure.
. "$(dirname "$0")/lib.sh"

PY=$TK_PY_VENV/bin/python
ORACLE=$ROOT/tests/models/gen_oracle.py
CK=   # the folder of the shared tiny checkpoints (tests/models/tiny.sh): $CK/llama, $CK/gpt2

need_models() {
  if [ ! -x "$PY" ]; then
    if [ "${CI:-}" = true ]; then fail "no oracle venv at $PY (CI=true: a missing oracle is a failure)"; else skip "no venv at $PY (scripts/setup.sh --test)"; fi
    return 1
  fi
  [ -n "$CK" ] && return 0
  local k d
  for k in llama gpt2; do
    d=$(bash "$ROOT/tests/models/tiny.sh" $k 2>"$WORK/make-$k.log") || { fail "making the tiny $k checkpoint failed:"; tail -n 5 "$WORK/make-$k.log" >&2; return 1; }
  done
  CK=$(dirname "$d")
}

# The settings tk generate and transformers' generate() must agree on, per model: "IDS key=value ...",
# each key a GenerationConfig field, given to tk generate as --key-with-dashes.
JOBS_llama="1,50,60,70 max_new_tokens=24
1,9 max_new_tokens=24
1,300,301,302,303,304,305,306 max_new_tokens=16
20 max_length=12
1,50,60,70 max_new_tokens=24 eos_token_id=390
1,9 max_new_tokens=24 eos_token_id=152,390,2
1,50,60,70 max_new_tokens=20 repetition_penalty=1.3
1,9 max_new_tokens=20 repetition_penalty=0.8 no_repeat_ngram_size=2
20 max_new_tokens=20 no_repeat_ngram_size=1
1,50,60,70 max_new_tokens=12 num_beams=3
1,9 max_new_tokens=16 num_beams=4 eos_token_id=390,152
1,300,301,302,303,304,305,306 max_new_tokens=16 num_beams=2 eos_token_id=390 length_penalty=0.0
20 max_new_tokens=16 num_beams=3 eos_token_id=390,254 early_stopping=true
20 max_new_tokens=16 num_beams=3 eos_token_id=390,254 early_stopping=never length_penalty=2.0
1,50,60,70 max_new_tokens=16 num_beams=5 eos_token_id=390,212 length_penalty=-1.0
1,9 max_new_tokens=12 num_beams=2 repetition_penalty=1.5 no_repeat_ngram_size=2"
JOBS_gpt2="0,50,60,70 max_new_tokens=24
0,9 max_new_tokens=24
0,300,301,302,303,304,305,306 max_new_tokens=24
20 max_length=12
0,50,60,70 max_new_tokens=24 eos_token_id=97
0,300,301,302,303,304,305,306 max_new_tokens=24 eos_token_id=306,97
0,50,60,70 max_new_tokens=24 repetition_penalty=1.3
0,300,301,302,303,304,305,306 max_new_tokens=24 no_repeat_ngram_size=2
20 max_new_tokens=24 repetition_penalty=2.0 no_repeat_ngram_size=3
0,50,60,70 max_new_tokens=12 num_beams=3
0,9 max_new_tokens=16 num_beams=4 eos_token_id=97,252
0,300,301,302,303,304,305,306 max_new_tokens=16 num_beams=2 eos_token_id=306 early_stopping=true
20 max_new_tokens=16 num_beams=3 eos_token_id=306,259 early_stopping=never length_penalty=1.5
0,50,60,70 max_new_tokens=16 num_beams=3 eos_token_id=97 length_penalty=-0.5
0,9 max_new_tokens=12 num_beams=2 no_repeat_ngram_size=2"
PROMPT="Once upon a time"

# oracle_once: transformers' answers to every job above and to PROMPT (its ids from tk tokenize, 20
# new tokens) on llama, from one process (importing torch and transformers costs more than all the
# generations): $WORK/want.llama, want.gpt2, want.prompt, one JSON line per job.
oracle_once() {
  [ -f "$WORK/want.prompt" ] && return 0
  local k v line nl ng pids
  pids=$("$TK" tokenize "$CK/llama" "$PROMPT") || { fail "tk tokenize $CK/llama failed"; return 1; }
  { for k in llama gpt2; do
      v=JOBS_$k
      while IFS= read -r line; do [ -n "$line" ] && echo "$CK/$k $line"; done <<<"${!v}"
    done
    echo "$CK/llama $pids max_new_tokens=20"; } >"$WORK/oracle.in"
  "$PY" "$ORACLE" generate-each <"$WORK/oracle.in" >"$WORK/oracle.out" 2>"$WORK/oracle.log" ||
    { fail "oracle failed: $(tail -n 3 "$WORK/oracle.log")"; return 1; }
  nl=$(grep -c . <<<"$JOBS_llama"); ng=$(grep -c . <<<"$JOBS_gpt2")
  [ "$(wc -l <"$WORK/oracle.out")" = $((nl + ng + 1)) ] || { fail "oracle: $(wc -l <"$WORK/oracle.out") answers for $((nl + ng + 1)) jobs"; return 1; }
  sed -n "1,${nl}p" "$WORK/oracle.out" >"$WORK/want.llama"
  sed -n "$((nl + 1)),$((nl + ng))p" "$WORK/oracle.out" >"$WORK/want.gpt2"
  sed -n "$((nl + ng + 1))p" "$WORK/oracle.out" >"$WORK/want.prompt"
}

# compare MODEL: tk generate with each of JOBS_MODEL's settings as flags must print the same new ids
# as transformers.
compare() {
  local k=$1 v=JOBS_$1 want got line n=0 bad=0
  oracle_once || return
  want=$(cat "$WORK/want.$k")
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    n=$((n + 1))
    local ids=${line%% *} rest=${line#* } flags
    flags=$(echo "$rest" | sed -E 's/(^| )([a-z_]+)=/\1--\2 /g' | sed -E 's/--([a-z]+)_([a-z]+)_([a-z]+)_([a-z]+)/--\1-\2-\3-\4/g; s/--([a-z]+)_([a-z]+)_([a-z]+)/--\1-\2-\3/g; s/--([a-z]+)_([a-z]+)/--\1-\2/g')
    # shellcheck disable=SC2086
    got=$("$TK" --json generate "$CK/$k" --ids "$ids" $flags 2>&1 | python3 -c 'import json,sys; print(json.dumps({"ids": json.load(sys.stdin)["ids"]}))' 2>&1)
    local w; w=$(printf '%s\n' "$want" | sed -n "${n}p")
    if [ "$got" != "$w" ]; then
      fail "$k $line: tk $got, transformers $w"; bad=$((bad + 1))
    fi
  done <<<"${!v}"
  [ "$n" -gt 0 ] || fail "no jobs"
  echo "    $k: $n settings compared, $bad differ"
}

t_greedy_and_beams_match_transformers_llama() {
  need_models || return
  compare llama
}

t_greedy_and_beams_match_transformers_gpt2() {
  need_models || return
  compare gpt2
}

t_no_cache_and_batches_agree() {
  need_models || return
  local a b c
  a=$("$TK" --json generate "$CK/llama" --ids 1,50,60,70 --max-new-tokens 16)
  b=$("$TK" --json generate "$CK/llama" --ids 1,50,60,70 --max-new-tokens 16 --no-cache)
  [ "${a%%\"stats*}" = "${b%%\"stats*}" ] || fail "the KV-cache and the recompute paths differ: $a vs $b"
  # three prompts of different lengths in one batch, each as it is alone
  c=$("$TK" --json generate "$CK/gpt2" --ids 0,50,60,70 --ids 9 --ids 0,300,301,302,303,304,305,306 --max-new-tokens 12 --eos-token-id 97 --kv-block-size 8)
  local i p
  i=0
  for p in 0,50,60,70 9 0,300,301,302,303,304,305,306; do
    local one; one=$("$TK" --json generate "$CK/gpt2" --ids "$p" --max-new-tokens 12 --eos-token-id 97 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
    local inb; inb=$(echo "$c" | python3 -c "import json,sys; print(json.load(sys.stdin)[$i]['ids'])")
    [ "$one" = "$inb" ] || fail "prompt $p: alone $one, in the batch $inb"
    i=$((i + 1))
  done
}

t_prompt_text_and_streaming() {
  need_models || return
  local j s want
  oracle_once || return
  j=$("$TK" --json generate "$CK/llama" --prompt "$PROMPT" --max-new-tokens 20)
  want=$(cat "$WORK/want.prompt")
  [ "$(echo "$j" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')" = "$(echo "$want" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')" ] \
    || fail "--prompt: tk $j, transformers $want"
  # the streamed text is the decoded text, and valid UTF-8 as printed
  s=$("$TK" generate "$CK/llama" --prompt "$PROMPT" --max-new-tokens 20 | python3 -c 'import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8"))')
  local t; t=$(echo "$j" | python3 -c 'import json,sys; print(json.load(sys.stdin)["text"])')
  [ "$s" = "$t" ] || fail "streamed '$s', --json text '$t'"
}

t_quantised_weights_and_cache() {
  need_models || return
  local j
  j=$("$TK" --json generate "$CK/gpt2" --ids 0,50,60,70 --max-new-tokens 8 --quant int8 --kv-dtype i8)
  echo "$j" | python3 -c '
import json, sys
d = json.load(sys.stdin)
q, st = d["quant"], d["stats"]
assert q["quant"] == "i8" and q["weights"] == 13 and 3 * q["quant_bytes"] < q["float_bytes"], q
assert 0 < q["prompt_logits_max_abs_diff"] < 0.1 * q["prompt_logits_max_abs"], q
assert st["kv_dtype"] == "i8" and len(d["ids"]) == 8, st' || fail "--quant int8 --kv-dtype i8: $j"
}

# An f32 model's cache in f16 (half its bytes): the stats say so, and the cache holds half the bytes of
# the f32 one for the same tokens; a dtype no cache takes is a clear error with a hint.
t_kv_cache_f16_under_f32() {
  need_models || return
  local j k out
  j=$("$TK" --json generate "$CK/llama" --ids 0,50,60,70 --max-new-tokens 8 --kv-dtype f16) || fail "--kv-dtype f16: $j"
  k=$("$TK" --json generate "$CK/llama" --ids 0,50,60,70 --max-new-tokens 8) || fail "f32 cache: $k"
  python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["stats"]["kv_dtype"] == "f16" and b["stats"]["kv_dtype"] == "f32", (a["stats"], b["stats"])
assert 2 * a["stats"]["kv_bytes"] == b["stats"]["kv_bytes"], (a["stats"], b["stats"])
assert len(a["ids"]) == 8, a' "$j" "$k" || fail "--kv-dtype f16: $j / $k"
  out=$("$TK" generate "$CK/llama" --ids 0,50 --max-new-tokens 2 --kv-dtype f64 2>&1) && fail "--kv-dtype f64 accepted"
  echo "$out" | grep -q "(f32), f16, bf16, or i8 / fp8_e4m3" || fail "--kv-dtype f64: $out"
  echo "$out" | grep -q "HINT:" || fail "--kv-dtype f64 without a hint: $out"
}

# More quantised weights than the first allocation of the table holds (64): growing it moved the
# entries, and their tensors' shape pointers pointed into the freed block (a garbage shape, or a crash).
# Both the references and the fast CPU implementations must run it, to the same ids.
t_quantised_many_weights() {
  need_models || return
  [ -f "$CK/llama12/model.safetensors" ] || "$PY" -c '
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(3)
LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=12,
                             num_attention_heads=2, num_key_value_heads=1)).save_pretrained(sys.argv[1])' "$CK/llama12" \
    >/dev/null 2>&1 || { fail "making a 12-layer llama failed"; return; }
  local a b
  a=$(TK_CPU_IMPL=reference "$TK" --json generate "$CK/llama12" --ids 1,2,3,4 --max-new-tokens 6 --quant int8) ||
    { fail "--quant int8 with 73 weights, references: $a"; return; }
  b=$("$TK" --json generate "$CK/llama12" --ids 1,2,3,4 --max-new-tokens 6 --quant int8) ||
    { fail "--quant int8 with 73 weights: $b"; return; }
  python3 -c '
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a["quant"]["weights"] == 73 and b["quant"]["weights"] == 73, (a["quant"], b["quant"])
assert a["ids"] == b["ids"] and len(a["ids"]) == 6, (a["ids"], b["ids"])' "$a" "$b" || fail "--quant int8, 73 weights: $a / $b"
}

t_sampling_is_seeded() {
  need_models || return
  local a b c
  a=$("$TK" --json generate "$CK/gpt2" --ids 0,50 --do-sample --top-p 0.9 --temperature 1.5 --seed 7 --max-new-tokens 16)
  b=$("$TK" --json generate "$CK/gpt2" --ids 0,50 --do-sample --top-p 0.9 --temperature 1.5 --seed 7 --max-new-tokens 16 --no-cache)
  c=$("$TK" --json generate "$CK/gpt2" --ids 0,50 --do-sample --top-p 0.9 --temperature 1.5 --seed 8 --max-new-tokens 16)
  [ "${a%%\"stats*}" = "${b%%\"stats*}" ] || fail "seed 7 twice gave $a and $b"
  [ "${a%%\"stats*}" != "${c%%\"stats*}" ] || fail "seeds 7 and 8 gave the same tokens: $a"
}

t_bad_input_is_refused_clearly() {
  need_models || return
  expect_rc 2 "$TK" generate "$CK/gpt2" --prompt "" --max-new-tokens 4
  expect_out "prompt 0 is empty"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids "$(seq -s, 1 130)" --max-new-tokens 4
  expect_out "prompt 0 has 130 tokens, but the model's context holds 128 positions"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --max-new-tokens 127
  expect_out "HINT: shorten the prompt or lower max_new_tokens to at most 126"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --max-new-tokens 0
  expect_out "max_new_tokens is 0"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --top-p 1.5
  expect_out "--top-p wants a number in [0, 1]"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --top-p 0 --do-sample
  expect_out "top_p is 0"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --do-sample --temperature 0
  expect_out "temperature is 0"
  expect_rc 8 "$TK" generate "$CK/gpt2" --ids 0,1 --do-sample --num-beams 2
  expect_out "beam sampling"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,5000
  expect_out "outside the vocabulary"
  # an eos the model cannot produce: a warning, and generation ends on length (as transformers does)
  expect_rc 0 "$TK" generate "$CK/gpt2" --ids 0,1 --eos-token-id 9999 --max-new-tokens 3
  expect_out "warning: --eos-token-id 9999 is outside the vocabulary"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,x
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --early-stopping maybe
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --kv-block-size 12
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --frobnicate
  expect_rc 2 "$TK" generate "$CK/gpt2"
  expect_rc 3 "$TK" generate "$WORK/nowhere" --ids 0,1
  expect_rc 1 "$TK" --json generate "$CK/gpt2" --ids 0,1 --max-new-tokens 40 --kv-max-bytes 40000 --kv-block-size 8
  expect_out "kv_max_bytes"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --quant int4
  expect_out "--quant wants int8, fp8 or none"
  expect_rc 0 "$TK" generate --help
  expect_out "--repetition-penalty"
}

# --logprobs against transformers (tests/models/logprob_oracle.py): greedy on batches of prompts with
# --top-logprobs (generate(output_logits=True) gives the same ids, and log_softmax of its raw logits and
# torch.topk the same values within 1e-4), greedy with a repetition penalty (the processed scores,
# output_scores, differ: a logprob taken after the processors fails), and sampling at temperature 0.6
# (tk's own tokens through one forward; a logprob taken after the temperature fails), on Llama and GPT-2.
# Each line: MODEL MODE TOP PROMPTS [key=value ...] (PROMPTS ;-separated, run as one batch).
LP_JOBS="llama generate 5 1,50,60,70;1,9;20 max_new_tokens=10
llama generate 0 1,50,60,70 max_new_tokens=12 repetition_penalty=1.5
llama forward 3 1,50,60,70;1,300,301,302 max_new_tokens=10 do_sample=true temperature=0.6 top_k=0 seed=3
gpt2 generate 4 0,50,60,70;0,9 max_new_tokens=10
gpt2 generate 2 0,300,301,302,303 max_new_tokens=12 repetition_penalty=1.3 no_repeat_ngram_size=2
gpt2 forward 20 0,50,60,70;9 max_new_tokens=10 do_sample=true temperature=0.6 top_k=20 seed=5"

t_logprobs_match_transformers() {
  need_models || return
  local line n=0 model mode top prompts kv flags p
  local -a ids
  : >"$WORK/lp.jobs"
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    n=$((n + 1))
    read -r model mode top prompts kv <<<"$line"
    flags=$(echo "$kv" | sed -E 's/(^| )([a-z_]+)=/\1--\2 /g; s/--do_sample true/--do_sample/; s/_/-/g')
    ids=()
    for p in ${prompts//;/ }; do ids+=(--ids "$p"); done
    # shellcheck disable=SC2086
    "$TK" --json generate "$CK/$model" "${ids[@]}" $flags --logprobs --top-logprobs "$top" >"$WORK/lp.$n.json" 2>"$WORK/lp.$n.err" ||
      { fail "tk generate $model ${ids[*]} $flags --top-logprobs $top: $(cat "$WORK/lp.$n.err" "$WORK/lp.$n.json")"; continue; }
    # the oracle's key=value: generate()'s settings; forward needs the temperature alone
    [ "$mode" = forward ] && kv=$(grep -o 'temperature=[^ ]*' <<<"$kv")
    echo "$CK/$model $mode $top $WORK/lp.$n.json $prompts $kv" >>"$WORK/lp.jobs"
  done <<<"$LP_JOBS"
  "$PY" "$ROOT/tests/models/logprob_oracle.py" <"$WORK/lp.jobs" >"$WORK/lp.out" 2>"$WORK/lp.log" ||
    { fail "logprobs differ from transformers: $(grep MISMATCH "$WORK/lp.out") $(tail -n 3 "$WORK/lp.log")"; return; }
  sed 's/^/    /' "$WORK/lp.out"
  [ "$(grep -c 'max |tk - torch|' "$WORK/lp.out")" = 11 ] || fail "want 11 prompts checked: $(cat "$WORK/lp.out")"
}

# The text table: a row a token (step, id, logprob, text) with its --top-logprobs rows #1..#N below it,
# then the sum; the same numbers as --json (to the table's 6 decimals), the streamed text unchanged.
t_logprobs_text_table() {
  need_models || return
  local j t plain
  j=$("$TK" --json generate "$CK/llama" --prompt "$PROMPT" --max-new-tokens 6 --top-logprobs 2) || { fail "--json: $j"; return; }
  t=$("$TK" generate "$CK/llama" --prompt "$PROMPT" --max-new-tokens 6 --top-logprobs 2) || { fail "text: $t"; return; }
  plain=$("$TK" generate "$CK/llama" --prompt "$PROMPT" --max-new-tokens 6)
  [ "$(head -n 1 <<<"$t")" = "$plain" ] || fail "the text changed with --logprobs: '$(head -n 1 <<<"$t")' vs '$plain'"
  python3 - "$j" "$t" <<'PYEOF' || fail "the table and --json disagree: $t"
import json, re, sys
d, t = json.loads(sys.argv[1]), sys.argv[2].splitlines()
rows = [l.split(None, 3) for l in t if re.match(r"^ *[0-9]+ ", l)]
alts = [l.split(None, 3) for l in t if re.match(r"^ *#[0-9]+ ", l)]
assert [int(r[1]) for r in rows] == d["ids"], (rows, d["ids"])
for r, e in zip(rows, d["logprobs"]):
    assert abs(float(r[2]) - e["logprob"]) < 1e-6, (r, e)
    assert json.loads(r[3]) == e["text"], (r, e)
assert len(alts) == 2 * len(rows), alts
assert [int(a[1]) for a in alts] == [x["id"] for e in d["logprobs"] for x in e["top"]], alts
assert [a[0] for a in alts[:2]] == ["#1", "#2"], alts
s = [l for l in t if l.startswith("sum ")]
assert len(s) == 1 and abs(float(s[0].split()[1]) - d["logprob_sum"]) < 1e-5, (s, d["logprob_sum"])
assert any(l.startswith("logprobs (log_softmax of the raw logits") for l in t), t
PYEOF
  # several prompts: a table after each one's text, named
  t=$("$TK" generate "$CK/gpt2" --ids 0,50 --ids 9 --max-new-tokens 3 --logprobs)
  [ "$(grep -c '^logprobs of prompt [01] ' <<<"$t")" = 2 ] || fail "two prompts, want two tables: $t"
  [ "$(grep -c '^sum ' <<<"$t")" = 2 ] || fail "two prompts, want two sums: $t"
  # without --logprobs, no logprobs in --json
  j=$("$TK" --json generate "$CK/gpt2" --ids 0,50 --max-new-tokens 3)
  case "$j" in *logprob*) fail "logprobs without --logprobs: $j" ;; esac
  # --top-logprobs N implies --logprobs; --logprobs --top-logprobs 0 gives empty tops
  j=$("$TK" --json generate "$CK/gpt2" --ids 0,50 --max-new-tokens 3 --top-logprobs 1)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert len(d["logprobs"]) == 3 and all(len(e["top"]) == 1 for e in d["logprobs"]), d' "$j" ||
    fail "--top-logprobs 1 alone: $j"
  j=$("$TK" --json generate "$CK/gpt2" --ids 0,50 --max-new-tokens 3 --logprobs --top-logprobs 0)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert len(d["logprobs"]) == 3 and all(e["top"] == [] for e in d["logprobs"]), d' "$j" ||
    fail "--logprobs --top-logprobs 0: $j"
}

t_logprobs_bad_input() {
  need_models || return
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --top-logprobs 21
  expect_out "--top-logprobs wants an integer in [0, 20], got '21'"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --logprobs --top-logprobs -1
  expect_out "--top-logprobs wants an integer in [0, 20], got '-1'"
  expect_rc 2 "$TK" generate "$CK/gpt2" --ids 0,1 --top-logprobs
  expect_rc 8 "$TK" generate "$CK/gpt2" --ids 0,1 --logprobs --num-beams 3
  expect_out "not beam search (num_beams 3)"
  expect_out "HINT: use num_beams 1"
  expect_rc 8 "$TK" --json generate "$CK/gpt2" --ids 0,1 --top-logprobs 2 --num-beams 2
  expect_out '"exit_code": 8'
  expect_rc 2 "$TK" generate --diffusion "$CK/llama" --ids 1,2 --logprobs
  expect_out "masked diffusion has no per-token log-probabilities"
}

run_tests
