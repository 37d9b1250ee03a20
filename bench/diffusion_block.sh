#!/usr/bin/env bash
# Block diffusion (DiffusionGemma) generation on the CPU with the encoder's keys and values cached (the
# default) and recomputed on every denoising step (TK_DGEMMA_CACHE=0), alternated ROUNDS times on the same
# build, checkpoint, prompt and seed: bench/make_bench_dgemma.py's random DiffusionGemma (~10M parameters,
# canvas_length 16, sliding window 64, f32). tokens/s = the generated tokens over the sampling loop's time
# (`tk generate --json`'s stats; the model load excluded). Both paths must give the same ids and forwards.
# The random checkpoint has no eos, so every block runs; its logits are near uniform, so the entropy bound
# accepts about one position a step and each block takes all STEPS steps. Needs the test venv (to write the
# checkpoint once).
#
# With HF=1, transformers' own generate() on the same checkpoint, prompt, gen_length and steps joins each
# round (bench/dgemma_transformers.py: its own noise, so other tokens; its step count is printed beside
# tk's).
#
#     bash bench/diffusion_block.sh [prompt_tokens=128] [gen_length=128] [steps=8] [rounds=3]
#     BENCH_ONE_CORE=1 bash bench/diffusion_block.sh   pinned to core 0, one thread
#     HF=1 bash bench/diffusion_block.sh               and transformers (the test venv)
#     DEVICE=cuda HF=1 bash bench/diffusion_block.sh   both on the GPU (tk --device cuda, transformers .to("cuda"))
set -u
cd "$(dirname "$0")/.." || exit 1
B=${TK_BUILD:-build}
P=${1:-128}; G=${2:-128}; S=${3:-8}; R=${4:-3}
DG=$B/bench-models/dgemma-10m
. scripts/py-venv.sh
if [ ! -f "$DG/config.json" ]; then
  "$TK_PY_VENV/bin/python" bench/make_bench_dgemma.py "$DG" >/dev/null 2>&1 || { echo "diffusion_block: cannot write $DG (scripts/setup.sh --test)"; exit 1; }
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
PIN=()
if [ -n "${BENCH_ONE_CORE:-}" ]; then
  PIN=(taskset -c 0); export TK_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1; echo "pinned to core 0, 1 thread"
fi
HF=${HF:-0} DEVICE=${DEVICE:-cpu}
ids=$(python3 -c "print(','.join(str(1 + (i * 37) % 4000) for i in range($P)))")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$R"); do
  for c in 1 0; do
    TK_DGEMMA_CACHE=$c "${PIN[@]}" "$B/tk" generate "$DG" --ids "$ids" --gen-length "$G" --steps "$S" --seed 1 --device "$DEVICE" --json \
      >"$out/$c-$r.json" || { echo "diffusion_block: tk failed (TK_DGEMMA_CACHE=$c)"; exit 1; }
  done
  if [ "$HF" = 1 ]; then
    "${PIN[@]}" "$TK_PY_VENV/bin/python" bench/dgemma_transformers.py "$DG" "$ids" "$G" "$S" "$DEVICE" 2>/dev/null | tail -n 1 \
      >"$out/hf-$r.json" || { echo "diffusion_block: transformers failed"; exit 1; }
  fi
done
echo "device: $DEVICE"
python3 - "$out" "$R" "$P" "$G" "$S" "$HF" <<'PYEOF'
import json, statistics, sys
d, R = sys.argv[1], int(sys.argv[2])
P, G, S = sys.argv[3:6]
runs = {c: [json.load(open(f"{d}/{c}-{r}.json")) for r in range(1, R + 1)] for c in (1, 0)}
first = runs[1][0]
print(f"prompt {P}, gen_length {G} ({first['stats']['blocks']} blocks of {first['stats']['block_length']}), "
      f"steps {S}: {first['stats']['forward_passes']} denoising steps")
tps = {}
for c, name in ((1, "cached (default)"), (0, "recomputed (TK_DGEMMA_CACHE=0)")):
    tps[c] = [x["stats"]["tokens_per_s"] for x in runs[c]]
    ms = [x["stats"]["ms"] for x in runs[c]]
    smp = [x["stats"]["sampler_ms"] for x in runs[c]]
    print(f"{name}: median {statistics.median(tps[c]):.1f} tokens/s; runs " +
          ", ".join(f"{t:.1f} ({m:.0f} ms, sampler {s:.0f} ms)" for t, m, s in zip(tps[c], ms, smp)))
print(f"ratio cached / recomputed (medians): {statistics.median(tps[1]) / statistics.median(tps[0]):.2f}x")
if sys.argv[6] == "1":
    hf = [json.load(open(f"{d}/hf-{r}.json")) for r in range(1, R + 1)]
    t = [x["tokens_per_s"] for x in hf]
    print(f"transformers generate(): median {statistics.median(t):.1f} tokens/s; runs " +
          ", ".join(f"{x['tokens_per_s']:.1f} ({x['ms']:.0f} ms, {x['steps']} steps)" for x in hf) +
          f"; tk cached / transformers (medians): {statistics.median(tps[1]) / statistics.median(t):.1f}x")
same = all(x["ids"] == first["ids"] and x["stats"]["forward_passes"] == first["stats"]["forward_passes"]
           for c in runs for x in runs[c])
print("ids and forwards agree" if same else "IDS OR FORWARDS DIFFER between runs")
sys.exit(0 if same else 1)
PYEOF
