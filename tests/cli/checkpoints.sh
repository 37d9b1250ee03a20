#!/usr/bin/env bash
# Checkpoints as transformers 5 writes them (tests/models/layouts.py makes them with save_pretrained and
# records transformers' answers): sharded safetensors with an index, "dtype" instead of "torch_dtype",
# tie_word_embeddings absent, generation_config.json without eos, tokenizer.json without
# tokenizer_config.json, added tokens with every flag, chat templates in each of transformers' places
# (chat_template.jinja, additional_chat_templates/, tokenizer_config.json's string or list,
# chat_template.json) with --template NAME, tokenizer_config.json's "no limit" model_max_length
# (1e30, past int64), bos/eos ids outside the vocabulary, and a 34-layer model generating 3 prompts
# at once past every growth step of models/ (quantised weights, KV blocks, activations), plain and
# with --quant int8 / fp8 against transformers on the same weights quantised here. Run under ASan too
# (TK_BUILD=build-asan). Needs the test venv ($TK_PY_VENV, default build/py-venv) to make the
# checkpoints; under CI=true its absence is a failure.
. "$(dirname "$0")/lib.sh"

PY=${TK_PY_VENV:-$ROOT/build/py-venv}/bin/python
LAY=$B/layouts

# Makes the checkpoints once per change of layouts.py (or of the scripts it imports).
layouts() {
  if [ ! -x "$PY" ]; then
    if [ "${CI:-}" = true ]; then fail "no oracle venv at $PY (CI=true: a missing oracle is a failure)"; else skip "no venv at $PY (scripts/setup.sh --test)"; fi
    return 1
  fi
  local stamp
  stamp=$(cat "$ROOT/tests/models/layouts.py" "$ROOT/tests/models/gen_oracle.py" "$ROOT/tests/models/chat_oracle.py" | sha256sum | cut -c1-16)
  [ "$(cat "$LAY/.stamp" 2>/dev/null)" = "$stamp" ] && return 0
  # another build's (build/ for build-asan/): the same files
  if [ "$(cat "$ROOT/build/layouts/.stamp" 2>/dev/null)" = "$stamp" ]; then LAY=$ROOT/build/layouts; return 0; fi
  rm -rf "$LAY"
  echo "    making the checkpoints with transformers (once; a few minutes on a loaded machine)"
  HF_HUB_OFFLINE=1 "$PY" "$ROOT/tests/models/layouts.py" make "$LAY" >"$WORK/make.log" 2>&1 \
    || { fail "layouts.py make failed:"; grep -v "Writing\|Loading" "$WORK/make.log" | tail -n 20 >&2; return 1; }
  echo "$stamp" >"$LAY/.stamp"
}

# check GROUP: every case of GROUP gives what transformers gave.
check() {
  layouts || return
  local out
  out=$(python3 "$ROOT/tests/models/layouts.py" check "$TK" "$LAY" "$1" 2>&1) || { fail "$out"; return; }
  echo "    $out"
  case "$out" in *"AddressSanitizer"*|*"runtime error"*) fail "$out" ;; esac
}

t_sharded_v5_checkpoint_with_no_limit_tokenizer() { check sharded; }
t_bf16_weights_with_v5_dtype() { check bf16-dtype; }
t_tie_word_embeddings_absent() { check tie-absent; }
t_generation_config_without_eos() { check gen-no-eos; }
t_tokenizer_json_without_tokenizer_config() { check tok-no-config; }
t_added_tokens_with_flags() { check added-tokens; }
t_chat_templates_as_a_list_in_tokenizer_config() { check chat-list; }
t_chat_templates_as_jinja_files() { check chat-multi; }
t_named_chat_templates_without_default() { check chat-no-default; }
t_chat_template_jinja_over_tokenizer_config() { check chat-jinja-wins; }
t_chat_template_json_of_a_processor() { check chat-json; }
t_special_ids_outside_the_vocabulary_warn() { check eos-oov; }
t_deep_model_batched_generation() { check deep; }
t_deep_model_int8_weights() { check deep-int8; }
t_deep_model_fp8_weights() { check deep-fp8; }

t_template_listing() {
  layouts || return
  expect_rc 0 "$TK" --json chat "$LAY/chat-multi" --list-templates
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["templates"] == ["default", "rag", "tool_use"], d; assert "chat_template.jinja" in d["source"], d' \
    || fail "--list-templates --json: $OUT"
  expect_rc 0 "$TK" chat "$LAY/chat-list" --list-templates
  expect_out "tool_use"
  expect_out "tokenizer_config.json"
  expect_rc 3 "$TK" chat "$LAY/bf16-dtype" --list-templates
  expect_out "has no chat template"
  expect_rc 2 "$TK" chat "$LAY/chat-list" --list-templates --render
}

t_json_floats_have_9_significant_digits() {
  layouts || return
  expect_rc 0 "$TK" --json generate "$LAY/sharded" --ids 1,50 --max-new-tokens 2 --quant int8
  echo "$OUT" | python3 -c '
import json, re, sys
text = sys.stdin.read()
json.loads(text)
long = [m for m in re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?", text) if len(re.sub(r"[^0-9]", "", m.split("e")[0]).lstrip("0")) > 9]
assert not long, long' || fail "floats printed past 9 significant digits: $OUT"
}

run_tests
