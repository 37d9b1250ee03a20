#!/usr/bin/env bash
# CPU decode throughput, tk generate vs transformers' generate(), on the same checkpoint, prompt and
# settings in one run: greedy, f32, a 32-token prompt and 64 new tokens on the Llama-shaped random
# checkpoint of bench/make_bench_llama.py (~57M parameters, vocab 32000). tk runs with its paged KV cache; decode tokens/s counts the tokens
# after the first over the time from the first to the last, on both sides. The two must also agree
# on the ids. Needs the test venv (TK_PY_VENV).
#
#     bash bench/generate_cpu.sh [prompt_tokens=32] [new_tokens=64]
#     BENCH_ONE_CORE=1 bash bench/generate_cpu.sh   both pinned to core 0, one thread each
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
. scripts/py-venv.sh
PY=$TK_PY_VENV/bin/python
P=${1:-32}; N=${2:-64}
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "generate_cpu: no venv at $PY (scripts/setup.sh --test)"; exit 1; }
LL=$B/bench-models/llama-57m
[ -f "$LL/config.json" ] || "$PY" bench/make_bench_llama.py "$LL" >/dev/null 2>&1 || { echo "generate_cpu: cannot write $LL"; exit 1; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
PIN=()
if [ -n "${BENCH_ONE_CORE:-}" ]; then
  PIN=(taskset -c 0); export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; echo "pinned to core 0, 1 thread"
fi
ids=$(python3 -c "print(','.join(str(1 + i % 31999) for i in range($P)))")
tk=$("${PIN[@]}" "$B/tk" --json generate "$LL" --ids "$ids" --max-new-tokens "$N") || { echo "generate_cpu: tk failed"; exit 1; }
hf=$("${PIN[@]}" "$PY" bench/hf_generate.py "$LL" "$P" "$N" 2>/dev/null) || { echo "generate_cpu: transformers failed"; exit 1; }
python3 - "$tk" "$hf" <<'PYEOF'
import json, sys
tk, hf = json.loads(sys.argv[1]), json.loads(sys.argv[2])
st = tk["stats"]
print("llama-57m  prompt %d, %d new tokens (greedy)  tk %.1f tok/s (prefill %.0f ms, KV %d KiB %s)  "
      "transformers %.1f tok/s (prefill %.0f ms, torch %s, %d threads)  tk/transformers %.2f  same ids: %s"
      % (st["prefill_tokens"], len(tk["ids"]), st["decode_tokens_per_s"], st["prefill_ms"], st["kv_bytes"] // 1024,
         st["kv_dtype"], hf["decode_tokens_per_s"], hf["prefill_ms"], hf["torch"], hf["threads"],
         st["decode_tokens_per_s"] / hf["decode_tokens_per_s"], tk["ids"] == hf["ids"]))
PYEOF
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
