#!/usr/bin/env bash
# tiny.sh KIND — prints the directory of the tiny checkpoint `gen_oracle.py make DIR KIND` writes
# (KIND: llama or gpt2), made once and shared by every test that needs it (tests/test_generate.c,
# tests/cli/generate.sh, tests/cli/chat.sh): each made its own before, five torch + transformers
# processes per suite run for the same seeded bytes. Tests only read it.
#
# The copy lives in $TK_BUILD/tiny-gen/KEY/KIND, KEY a hash of gen_oracle.py and of the versions of
# torch, transformers and tokenizers in the test venv, so a change to either makes a new one. It is
# written under a lock into a temporary directory and renamed into place, so a test never sees half
# a checkpoint and two suites running at once make it once. Exit 1 (gen_oracle.py's stderr on
# stderr) when it cannot be made.
set -u
cd "$(dirname "$0")/../.."
. scripts/py-venv.sh
kind=${1:?usage: tests/models/tiny.sh llama|gpt2}
case $kind in llama|gpt2) ;; *) echo "tiny.sh: unknown kind '$kind' (llama or gpt2)" >&2; exit 2 ;; esac
py=$TK_PY_VENV/bin/python
B=${TK_BUILD:-build}
# versions without importing the packages (importing torch alone takes seconds)
versions=$("$py" -c 'import importlib.metadata as m
for p in ("torch", "transformers", "tokenizers"): print(p, m.version(p))' 2>/dev/null) || {
  echo "tiny.sh: the test venv $TK_PY_VENV lacks torch, transformers or tokenizers (scripts/setup.sh --test)" >&2; exit 1; }
key=$({ sha256sum tests/models/gen_oracle.py; echo "$versions"; } | sha256sum | cut -c1-16)
root=$(cd "$B" && pwd)/tiny-gen
dir=$root/$key/$kind
if [ ! -f "$dir/.done" ]; then
  mkdir -p "$root/$key"
  exec 9>"$root/$key/.lock"
  flock 9
  if [ ! -f "$dir/.done" ]; then
    tmp=$(mktemp -d "$root/$key/.$kind.XXXXXX")
    if ! "$py" tests/models/gen_oracle.py make "$tmp/$kind" "$kind" >/dev/null 2>"$tmp/err"; then
      echo "tiny.sh: gen_oracle.py make $kind failed:" >&2; tail -n 20 "$tmp/err" >&2; rm -rf "$tmp"; exit 1
    fi
    touch "$tmp/$kind/.done"
    rm -rf "$dir"; mv "$tmp/$kind" "$dir"; rm -rf "$tmp"
    # older keys: checkpoints of an earlier gen_oracle.py or venv
    for old in "$root"/*/; do [ "$old" = "$root/$key/" ] || rm -rf "$old"; done
  fi
  exec 9>&-
fi
echo "$dir"
