#!/usr/bin/env bash
# CPU masked diffusion throughput, tk generate --diffusion vs the Python reference loop over
# transformers (bench/hf_diffusion.py: LLaDA's published sampler), on the same checkpoint, prompt and
# settings in one run: LLaDA's sampler at temperature 0 (low_confidence remasking), f32, over the
# Llama-shaped random checkpoint of bench/make_bench_llama.py (~57M parameters, vocab 32000) run
# bidirectionally (--bidirectional, mask id 31999). tokens/s = gen_length over the sampling loop's
# time (the model load excluded on both sides). The two must agree on the ids. Needs the test venv.
#
#     bash bench/diffusion_cpu.sh [prompt_tokens=16] [gen_length=32] [block_length=16] [steps=32]
#     BENCH_ONE_CORE=1 bash bench/diffusion_cpu.sh   both pinned to core 0, one thread each
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
. scripts/py-venv.sh
PY=$TK_PY_VENV/bin/python
P=${1:-16}; G=${2:-32}; BL=${3:-16}; S=${4:-32}
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "diffusion_cpu: no venv at $PY (scripts/setup.sh --test)"; exit 1; }
LL=$B/bench-models/llama-57m
[ -f "$LL/config.json" ] || "$PY" bench/make_bench_llama.py "$LL" >/dev/null 2>&1 || { echo "diffusion_cpu: cannot write $LL"; exit 1; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
PIN=()
if [ -n "${BENCH_ONE_CORE:-}" ]; then
  PIN=(taskset -c 0); export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; echo "pinned to core 0, 1 thread"
fi
ids=$(python3 -c "print(','.join(str(1 + i % 31999) for i in range($P)))")
tk=$("${PIN[@]}" "$B/tk" --json generate "$LL" --diffusion --bidirectional --mask-token-id 31999 --ids "$ids" \
       --gen-length "$G" --block-length "$BL" --steps "$S") || { echo "diffusion_cpu: tk failed"; exit 1; }
hf=$("${PIN[@]}" "$PY" bench/hf_diffusion.py "$LL" "$P" "$G" "$BL" "$S" 31999 2>/dev/null) || { echo "diffusion_cpu: the Python loop failed"; exit 1; }
python3 - "$tk" "$hf" "$P" "$G" "$BL" "$S" <<'PYEOF'
import json, sys
tk, hf = json.loads(sys.argv[1]), json.loads(sys.argv[2])
P, G, BL, S = sys.argv[3:7]
st = tk["stats"]
print(f"prompt {P}, gen_length {G}, block_length {BL}, steps {S} ({st['forward_passes']} forwards of {int(P) + int(G)} positions)")
print(f"tk generate --diffusion: {st['tokens_per_s']:.1f} tokens/s ({st['ms']:.0f} ms)")
print(f"Python loop over transformers ({hf['threads']} torch threads): {hf['tokens_per_s']:.1f} tokens/s ({hf['ms']:.0f} ms)")
print(f"ratio tk / transformers: {st['tokens_per_s'] / hf['tokens_per_s']:.2f}x")
print("ids agree" if tk["ids"] == hf["ids"] else f"IDS DIFFER: tk {tk['ids']} vs {hf['ids']}")
PYEOF
