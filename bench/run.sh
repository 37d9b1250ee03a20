#!/usr/bin/env bash
# Runs every benchmark in bench/ and prints their results. Record figures in bench/RESULTS.md with
# the machine, the date and the command.
set -u
cd "$(dirname "$0")/.."
for b in bench/*.sh; do
  [ "$(basename "$b")" = run.sh ] && continue
  echo "== $b"; bash "$b" || echo "(failed: $b)"
done
