#!/usr/bin/env bash
# Per-family CPU rows, tk vs transformers on the same checkpoint (issue 27's benchmark): for each causal
# family tk runs, a small random checkpoint of one shape (bench/make_bench_families.py: hidden 512, 4
# layers, 8/4 heads, intermediate 1408, vocab 16000, f32; the MoE ones with the same active width), a
# 128-token forward (mean of 3 after a warm-up: bench/model_forward vs bench/hf_forward.py) and greedy
# decode of 32 new tokens after a 32-token prompt (tk generate vs bench/hf_generate.py, which must agree
# on the ids). Both sides use every core unless BENCH_ONE_CORE=1 (both pinned to core 0, one thread).
# Needs the test venv (TK_PY_VENV).
#
#     bash bench/families_cpu.sh [FAMILY ...]
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
. scripts/py-venv.sh
PY=$TK_PY_VENV/bin/python
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "families_cpu: no venv at $PY (scripts/setup.sh --test)"; exit 1; }
D=$B/bench-models/families
"$PY" bench/make_bench_families.py "$D" "$@" >/dev/null 2>&1 || { echo "families_cpu: cannot write $D"; exit 1; }
[ -x "$B/bench/model_forward" ] || make -s "$B/bench/model_forward" >/dev/null || exit 1
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
PIN=()
if [ -n "${BENCH_ONE_CORE:-}" ]; then
  PIN=(taskset -c 0); export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; echo "pinned to core 0, 1 thread"
fi
ids=$(python3 -c "print(','.join(str(1 + i % 15999) for i in range(32)))")
printf '%-10s | %9s %9s %6s | %9s %9s %6s %s\n' family "fwd tk" "fwd hf" ratio "dec tk" "dec hf" ratio "same ids"
for f in ${@:-llama mistral qwen2 qwen3 olmo2 granite smollm3 gemma gemma2 gemma3 phi3 mixtral qwen3_moe}; do
  d=$D/$f
  ftk=$("${PIN[@]}" "$B/bench/model_forward" "$d" 128 3 2>/dev/null) || { echo "$f: tk forward failed"; continue; }
  fhf=$("${PIN[@]}" "$PY" bench/hf_forward.py "$d" 128 3 2>/dev/null) || { echo "$f: transformers forward failed"; continue; }
  gtk=$("${PIN[@]}" "$B/tk" --json generate "$d" --ids "$ids" --max-new-tokens 32 2>/dev/null) || { echo "$f: tk generate failed"; continue; }
  ghf=$("${PIN[@]}" "$PY" bench/hf_generate.py "$d" 32 32 2>/dev/null) || { echo "$f: transformers generate failed"; continue; }
  python3 - "$f" "$ftk" "$fhf" "$gtk" "$ghf" <<'PYEOF'
import json, sys
f, ftk, fhf, gtk, ghf = sys.argv[1], *(json.loads(a) for a in sys.argv[2:])
dtk, dhf = gtk["stats"]["decode_tokens_per_s"], ghf["decode_tokens_per_s"]
print("%-10s | %9.1f %9.1f %6.2f | %9.1f %9.1f %6.2f %s" % (f, ftk["tokens_per_s"], fhf["tokens_per_s"],
      ftk["tokens_per_s"] / fhf["tokens_per_s"], dtk, dhf, dtk / dhf, gtk["ids"] == ghf["ids"]))
PYEOF
done
echo "(tokens/s; fwd: 128-token forward; dec: decode after a 32-token prompt)"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
