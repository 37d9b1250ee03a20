#!/usr/bin/env bash
# Exit 0 when the compiler ($1, default clang) can build a libFuzzer target with ASan and UBSan.
cc=${1:-clang}
command -v "$cc" >/dev/null 2>&1 || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n' >"$tmp/t.c"
"$cc" -fsanitize=fuzzer,address,undefined "$tmp/t.c" -o "$tmp/t" >/dev/null 2>&1
