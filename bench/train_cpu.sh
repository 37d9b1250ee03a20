#!/usr/bin/env bash
# Training throughput on the CPU, tk vs PyTorch eager, on the same checkpoints and batch in one run:
# a Llama and a GPT-2 of ~57M parameters (bench/make_bench_train.py), BATCH sequences of SEQ random
# tokens, f32, one process each with the same thread count (every core, or BENCH_THREADS): the step
# is forward + loss + backward + clip_grad_norm_ + AdamW. tk runs its CPU default (logits, then
# cross_entropy), then the fused loss without and with activation checkpointing; the activation
# bytes are tk's planned arena (tk_train_info_json), the peak RSS the process's. Needs the test venv (TK_PY_VENV). Results go in bench/RESULTS.md with the load.
#
#     bash bench/train_cpu.sh [seq=256] [batch=4] [steps=3]
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
PY=${TK_PY_VENV:-build/py-venv}/bin/python
SEQ=${1:-256}; BATCH=${2:-4}; STEPS=${3:-3}
TH=${BENCH_THREADS:-$(nproc)}
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "train_cpu: no venv at $PY"; exit 1; }
M=$B/bench-models/train
[ -f "$M/gpt2/config.json" ] || "$PY" bench/make_bench_train.py "$M" >/dev/null 2>&1 || { echo "train_cpu: cannot write $M"; exit 1; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "batch $BATCH x $SEQ tokens, $STEPS timed steps after 1 warm-up, $TH threads"
export OPENBLAS_NUM_THREADS=$TH OMP_NUM_THREADS=$TH
for m in llama gpt2; do
  # tk's CPU default (logits + cross_entropy), then the fused loss without and with checkpointing (the
  # logits are not a layer's activations: the fused pair measures what checkpointing saves)
  tk=$("$B/bench/train_step" "$M/$m" "$SEQ" "$BATCH" "$STEPS" 0 -1) || { echo "train_cpu: tk failed on $m"; continue; }
  tkf=$("$B/bench/train_step" "$M/$m" "$SEQ" "$BATCH" "$STEPS" 0 1) || { echo "train_cpu: tk (fused) failed on $m"; continue; }
  tkc=$("$B/bench/train_step" "$M/$m" "$SEQ" "$BATCH" "$STEPS" 1 1) || { echo "train_cpu: tk (checkpointing) failed on $m"; continue; }
  pt=$("$PY" bench/train_torch.py "$M/$m" "$SEQ" "$BATCH" "$STEPS" "$TH" 2>/dev/null) || { echo "train_cpu: pytorch failed on $m"; continue; }
  python3 - "$m" "$tk" "$tkf" "$tkc" "$pt" <<'PYEOF'
import json, sys
m, tk, tkf, tkc, pt = sys.argv[1], *map(json.loads, sys.argv[2:])
mib = lambda b: b / 2**20
print("%-6s tk %6.1f tok/s (%.2f s/step, peak RSS %.0f MiB) | pytorch %6.1f tok/s (%.2f s/step, peak RSS %.0f MiB) | "
      "tk/pytorch %.2fx" % (m, tk["tokens_per_s"], tk["step_s"], mib(tk["peak_rss_bytes"]), pt["tokens_per_s"],
                            pt["step_s"], mib(pt["peak_rss_bytes"]), tk["tokens_per_s"] / pt["tokens_per_s"]))
print("       fused loss: %6.1f tok/s, activations %.0f MiB, peak RSS %.0f MiB | + checkpointing: %6.1f tok/s, "
      "activations %.0f MiB, peak RSS %.0f MiB: %.2fx less activation memory, %+.0f%% time"
      % (tkf["tokens_per_s"], mib(tkf["activation_bytes"]), mib(tkf["peak_rss_bytes"]), tkc["tokens_per_s"],
         mib(tkc["activation_bytes"]), mib(tkc["peak_rss_bytes"]), tkf["activation_bytes"] / tkc["activation_bytes"],
         100 * (tkc["step_s"] / tkf["step_s"] - 1)))
PYEOF
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
