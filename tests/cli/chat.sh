#!/usr/bin/env bash
# tk chat and chat templates: --render against transformers' apply_chat_template for the public
# templates of Llama 3 and 3.1, ChatML/Qwen2, Mistral, Llama 2, Zephyr, Gemma and Phi-3 (plus one that
# exercises the rest of the Jinja2 subset), with and without the generation prompt
# (tests/models/chat_oracle.py); clear errors for constructs outside the subset, raise_exception,
# limits and missing templates; and a tk chat session on a tiny Llama checkpoint giving the tokens
# tk generate --ids gives for the rendered prompts. Needs the test venv ($TK_PY_VENV, default
# ~/.cache/tk/py-venv) for the oracle and the checkpoint; under CI=true its absence is a failure.
. "$(dirname "$0")/lib.sh"

PY=$TK_PY_VENV/bin/python
CK=   # the folder of the shared tiny checkpoints (tests/models/tiny.sh)

need_venv() {
  if [ ! -x "$PY" ]; then
    if [ "${CI:-}" = true ]; then fail "no oracle venv at $PY (CI=true: a missing oracle is a failure)"; else skip "no venv at $PY (scripts/setup.sh --test)"; fi
    return 1
  fi
  [ -n "$CK" ] && return 0
  local d
  d=$(bash "$ROOT/tests/models/tiny.sh" llama 2>"$WORK/make.log") || { fail "making the tiny llama checkpoint failed:"; tail -n 5 "$WORK/make.log" >&2; return 1; }
  CK=$(dirname "$d")
}

# tpl NAME TEMPLATE_AS_JSON_STRING: a directory with only tokenizer_config.json
tpl() {
  mkdir -p "$WORK/t/$1"
  printf '{"bos_token": "<s>", "eos_token": "</s>", "chat_template": %s}\n' "$2" >"$WORK/t/$1/tokenizer_config.json"
  D=$WORK/t/$1
}

t_render_matches_transformers() {
  need_venv || return
  "$PY" "$ROOT/tests/models/chat_oracle.py" check "$TK" "$WORK/tpl" "$CK/llama/tokenizer.json" >"$WORK/oracle.out" 2>&1 || { fail "tk and transformers differ:"; tail -n 30 "$WORK/oracle.out" >&2; return; }
  grep -q "^72 renderings compared, 0 differ" "$WORK/oracle.out" || fail "unexpected oracle summary: $(tail -n 1 "$WORK/oracle.out")"
  echo "    $(tail -n 1 "$WORK/oracle.out")"
}

t_render_basics_without_the_oracle() {
  tpl plain '"{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"'
  expect_rc 0 "$TK" chat "$D" --render --message user=' Hi ' --message assistant=Yo
  [ "$OUT" = "<s><user>Hi<assistant>Yo<assistant>" ] || fail "rendered '$OUT'"
  expect_rc 0 "$TK" chat "$D" --render --message user=Hi --no-generation-prompt
  [ "$OUT" = "<s><user>Hi" ] || fail "rendered '$OUT'"
  expect_rc 0 "$TK" chat "$D" --render --system S --message user='a=b'
  [ "$OUT" = "<s><system>S<user>a=b<assistant>" ] || fail "rendered '$OUT'"
}

t_unsupported_and_bad_templates_are_refused_clearly() {
  tpl macro '"hello\n{% macro m() %}x{% endmacro %}"'
  expect_rc 8 "$TK" chat "$D" --render --message user=Hi
  expect_out "chat template line 2: the tag 'macro' is not supported"
  expect_out "HINT:"
  tpl map '"{{ messages | map(attribute=\"role\") | join }}"'
  expect_rc 8 "$TK" chat "$D" --render --message user=Hi
  expect_out "chat template line 1: the filter 'map' is not supported"
  tpl call '"{{ strftime_now(\"%Y\") }}"'
  expect_rc 8 "$TK" chat "$D" --render --message user=Hi
  expect_out "the function 'strftime_now' is not supported"
  tpl unclosed '"{% for m in messages %}{{ m.content }}"'
  expect_rc 2 "$TK" chat "$D" --render --message user=Hi
  expect_out "never closed (expected '{% endfor %}')"
  tpl syntax '"{{ messages[0] + }}"'
  expect_rc 2 "$TK" chat "$D" --render --message user=Hi
  expect_out "chat template line 1: expected an expression, found '}}'"
  tpl raise '"{% if messages[0].role != \"user\" %}{{ raise_exception(\"first turn must be the user\") }}{% endif %}ok"'
  expect_rc 2 "$TK" chat "$D" --render --message assistant=Hi
  expect_out "the template raised an exception: first turn must be the user"
  expect_rc 0 "$TK" chat "$D" --render --message user=Hi
  tpl undef '"{{ nothing.field }}"'
  expect_rc 2 "$TK" chat "$D" --render --message user=Hi
  expect_out "'.field' of an undefined value"
  # limits: nesting, steps, string growth
  tpl deep "\"{{ $(printf '(%.0s' $(seq 300))1$(printf ')%.0s' $(seq 300)) }}\""
  expect_rc 2 "$TK" chat "$D" --render --message user=Hi
  expect_out "nested deeper than 128 levels"
  tpl steps '"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"'
  expect_rc 2 "$TK" chat "$D" --render --message user=Hi
  expect_out "range() passes 200000 items"
  tpl steps2 '"{% set l = range(1000) %}{% for i in l %}{% for j in l %}{{ j }}{% endfor %}{% endfor %}"'
  expect_rc 2 "$TK" chat "$D" --render --message user=Hi
  expect_out "the rendering passes 200000 steps"
  tpl grow '"{% set ns = namespace(s=\"xxxxxxxx\") %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}"'
  expect_rc 2 "$TK" chat "$D" --render --message user=Hi
  expect_out "grows past"
  # files
  mkdir -p "$WORK/t/none"; echo '{"bos_token": "<s>"}' >"$WORK/t/none/tokenizer_config.json"
  expect_rc 3 "$TK" chat "$WORK/t/none" --render --message user=Hi
  expect_out "has no chat template"
  expect_out "tk generate --prompt"
  expect_rc 3 "$TK" chat "$WORK/nowhere" --render --message user=Hi
  expect_out "no tokenizer_config.json"
  tpl badtype '42'
  expect_rc 2 "$TK" chat "$D" --render
  expect_out "chat_template is a number"
  tpl list '[{"name": "tool_use", "template": "x"}]'
  expect_rc 2 "$TK" chat "$D" --render
  expect_out "has several chat templates and none named default: tool_use"
  expect_out "HINT: pick one with --template NAME"
  expect_rc 0 "$TK" chat "$D" --render --template tool_use
  [ "$OUT" = "x" ] || fail "--template tool_use rendered '$OUT'"
  expect_rc 3 "$TK" chat "$D" --render --template nosuch
  expect_out "no chat template named 'nosuch'"
  expect_out "(it has: tool_use)"
  expect_rc 0 "$TK" chat "$D" --list-templates
  expect_out "from $D/tokenizer_config.json"
  [ "$("$TK" chat "$D" --list-templates 2>/dev/null)" = "tool_use" ] || fail "--list-templates printed '$OUT'"
  tpl badlist '[{"name": "default"}]'
  expect_rc 2 "$TK" chat "$D" --render
  expect_out "chat_template[0] is not a {\"name\": ..., \"template\": ...} object"
  # usage
  expect_rc 2 "$TK" chat "$D" --render --message Hi
  expect_out "--message wants ROLE=TEXT"
  expect_rc 2 "$TK" chat "$D" --message user=Hi
  expect_out "--message goes with --render"
  expect_rc 2 "$TK" chat
  expect_rc 2 "$TK" chat "$D" --frobnicate
  expect_rc 0 "$TK" chat --help
  expect_out "--system TEXT"
}

t_chat_session_matches_generate() {
  need_venv || return
  local d=$WORK/chatck f
  mkdir -p "$d"
  for f in config.json generation_config.json model.safetensors tokenizer.json; do
    [ -f "$CK/llama/$f" ] && ln -sf "$CK/llama/$f" "$d/$f"
  done
  printf '%s\n' '{"bos_token": "<s>", "eos_token": "</s>", "chat_template": "{% for m in messages %}{{ bos_token + m[\"role\"][0] + \": \" + m[\"content\"] + eos_token }}{% endfor %}{% if add_generation_prompt %}{{ bos_token + \"a:\" }}{% endif %}"}' >"$d/tokenizer_config.json"
  # a model without a template: refused before loading, with the hint
  expect_rc 3 "$TK" chat "$CK/llama" --max-new-tokens 4 </dev/null
  expect_out "tk generate --prompt"
  local j s
  j=$(printf 'Once upon\n\nthe fox\n' | "$TK" --json chat "$d" --system "Be brief." --max-new-tokens 6 2>"$WORK/chat.err") || { fail "tk chat failed: $(cat "$WORK/chat.err")"; return; }
  [ "$(echo "$j" | wc -l)" = 2 ] || fail "want 2 replies (the empty line is skipped), got: $j"
  # each reply: the tokens tk generate --ids gives on the prompt ids, and the prompt is the rendered
  # conversation so far (the earlier reply included as the assistant turn)
  local n=0 line pids ids text want prev_text="" r
  while IFS= read -r line; do
    pids=$(echo "$line" | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["prompt_ids"])))')
    ids=$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
    text=$(echo "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["text"])')
    want=$("$TK" --json generate "$d" --ids "$pids" --max-new-tokens 6 | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')
    [ "$ids" = "$want" ] && [ -n "$ids" ] || fail "turn $n: tk chat $ids, tk generate --ids $want"
    if [ $n = 0 ]; then
      r=$("$TK" --json chat "$d" --render --system "Be brief." --message user="Once upon")
    else
      r=$("$TK" --json chat "$d" --render --system "Be brief." --message user="Once upon" --message assistant="$prev_text" --message user="the fox")
    fi
    [ "$(echo "$r" | python3 -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')" = "$pids" ] || fail "turn $n: the prompt is not the rendered conversation: $pids vs $r"
    prev_text=$text
    n=$((n + 1))
  done <<<"$j"
  # streaming prints the same replies, one per line
  s=$(printf 'Once upon\nthe fox\n' | "$TK" chat "$d" --system "Be brief." --max-new-tokens 6)
  [ "$s" = "$(echo "$j" | python3 -c 'import json,sys; print("\n".join(json.loads(l)["text"] for l in sys.stdin))')" ] || fail "streamed '$s' differs from the --json texts"
  # the conversation outgrowing the context is a clear error
  expect_rc 2 "$TK" chat "$d" --max-new-tokens 100 < <(printf 'a b c d e f g h\n%.0s' 1 2 3 4 5 6)
  expect_out "context"
}

run_tests
