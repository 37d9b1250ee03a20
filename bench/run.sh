#!/usr/bin/env bash
# Runs every benchmark in bench/ and prints their results. Record figures in bench/RESULTS.md with
# the machine, the date and the command.
set -u
cd "$(dirname "$0")/.."
for b in bench/*.sh; do
  [ "$(basename "$b")" = run.sh ] && continue
  echo "== $b"; bash "$b" || echo "(failed: $b)"
done
B=${TK_BUILD:-build}
for b in "$B"/bench/*; do
  [ -x "$b" ] || continue
  echo "== $b"; "$b" kernels-community/activation sm_80; "$b" kernels-community/activation sm_90
done
