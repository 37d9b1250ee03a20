#!/usr/bin/env bash
# run.sh — host simulation of the attention_decode CUDA-core fallback (kernels-src/flash-attn/
# decode_simple.cu) against tk's CPU reference; see sim.cc. Needs build/libtk.a (make) and g++ with
# C++20. Usage: bash scripts/sim-decode-simple/run.sh [N]   (only the first N cases; TK_BUILD=dir for
# another build folder)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
B=${TK_BUILD:-$root/build}
tmp=$(mktemp -d /tmp/sim-decode-simple.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$root/kernels-src/flash-attn/decode_simple.cu" "$here/common.cuh" "$here/sim.cc" "$tmp/"
libs="$(pkg-config --libs libcurl libarchive libcrypto sqlite3 jansson openblas libpcre2-8 libutf8proc) -ldl -lpthread -lm"
if pkg-config --exists ompi-c; then libs="$libs $(pkg-config --libs ompi-c)"; fi
g++ -std=c++20 -O1 -mf16c -I"$tmp" -I"$root/include" "$tmp/sim.cc" -o "$tmp/sim" "$B/libtk.a" $libs
mkdir -p "$tmp/home"
TK_HOME=$tmp/home stdbuf -oL "$tmp/sim" "$@"
