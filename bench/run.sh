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
echo "== $B/bench/jit_build"
"$B/bench/jit_build" kernels-community/activation sm_80; "$B/bench/jit_build" kernels-community/activation sm_90
echo "== $B/bench/ce_memory (fused linear + cross-entropy vs unfused, CPU reference; minutes on 2 cores)"
"$B/bench/ce_memory" 1024 1024 32768 1
. scripts/py-venv.sh
PY=$TK_PY_VENV/bin/python
if [ -x "$PY" ]; then
  echo "== bench/python_overhead.py (per-call cost of an op from Python, CPU)"
  PYTHONPATH=python "$PY" bench/python_overhead.py
  echo "== bench/moe_cpu.py (MoE layer tokens/s: the moe op vs transformers' eager block, CPU, 1 thread)"
  OPENBLAS_NUM_THREADS=1 PYTHONPATH=python "$PY" bench/moe_cpu.py 1
fi
