#!/usr/bin/env bash
# gpu-bundle.sh — builds the self-contained GPU bundle (`make gpu-bundle`) into .gpu/ (git-ignored):
#
#   .gpu/build.tgz   build-gpu/{tk, libtk.so*, registry/, tests/test_gpu_*, tests/test_nvrtc,
#                    examples/, bench/} — built with DEFAULT_ENDPOINT empty (the registry beside the
#                    binaries, api/ctx.c) and an $ORIGIN-relative DT_RPATH ($ORIGIN/lib:$ORIGIN/../lib)
#   .gpu/lib.tgz     build-gpu/lib/: every shared library those binaries load beyond glibc, libstdc++
#                    and libgcc_s (found with ldd)
#   .gpu/MANIFEST    what is inside, and the newest GLIBC_x.y symbol version any file needs
#
# Unpacked anywhere (`tar xzf .gpu/lib.tgz && tar xzf .gpu/build.tgz`), the binaries need no
# LD_LIBRARY_PATH, no TK_ENDPOINT and no make: scripts/gpu-check.sh runs them on a GPU machine, and
# tests/cli/gpu_bundle.sh proves it from a copy. DT_RPATH (not RUNPATH) also covers the libraries'
# own dependencies, and $ORIGIN works through compute-sanitizer and python's ctypes alike.
#
# Usage: scripts/gpu-bundle.sh [--out DIR] [--build DIR] [--no-make]
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu b=build-gpu domake=1
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --build) b=$2; shift 2 ;;
    --no-make) domake=0; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1'" >&2; echo "HINT: scripts/gpu-bundle.sh --help" >&2; exit 2 ;;
  esac
done

if [ $domake = 1 ]; then
  # Only what the bundle holds: not the CPU tests or the fuzz drivers `all` also builds (a third of
  # the compiles, and make test builds this bundle every run).
  targets=("$b/tk" "$b/libtk.so.0" registry "$b/tests/test_nvrtc")
  for src in tests/test_gpu_*.c examples/*.c bench/*.c; do
    [ -f "$src" ] || continue
    n=${src%.c}; targets+=("$b/$n")
  done
  # \$$ORIGIN: make turns $$ into $, the shell's \$ keeps it from being expanded in the recipe
  # MPI=0: Open MPI would bring a dozen libraries and its plugin directory, which a relocated bundle
  # cannot find; on the GPU machine NCCL bootstraps through a file instead (docs/parallel.md)
  make -j"$(nproc)" B="$b" DEFAULT_ENDPOINT= MPI=0 \
    'LDFLAGS=-Wl,--disable-new-dtags,-rpath,\$$ORIGIN/lib:\$$ORIGIN/../lib' "${targets[@]}" >&2
fi

files=("$b/tk" "$b/libtk.so.0" "$b/tests/test_nvrtc")
for f in "$b"/tests/test_gpu_* "$b"/examples/* "$b"/bench/*; do
  [ -f "$f" ] && [ -x "$f" ] && [[ $f != *.d ]] && files+=("$f")
done
# The bundle's binaries without their DWARF (objcopy --strip-debug; the symbol tables stay, so
# backtraces and compute-sanitizer still name functions): debug info is ~70% of each binary, and with
# twenty test and bench binaries linking libtk.a the tarballs would pass the device tool's 64 MiB.
# Only files that still have it are stripped, so a second run leaves them (and the tarballs) alone.
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "gpu-bundle: $f is missing" >&2; echo "HINT: run without --no-make" >&2; exit 1; }
  if readelf -S "$f" 2>/dev/null | grep -q '\.debug_info'; then
    objcopy --strip-debug "$f" || { echo "gpu-bundle: cannot strip $f" >&2; exit 1; }
  fi
done
for f in "${files[@]}"; do
  rp=$(readelf -d "$f" | sed -n 's/.*(RPATH).*\[\(.*\)\]/\1/p')
  [ "$rp" = '$ORIGIN/lib:$ORIGIN/../lib' ] || {
    echo "gpu-bundle: $f has RPATH '$rp', not \$ORIGIN/lib:\$ORIGIN/../lib" >&2
    echo "HINT: rm -rf $b and run 'make gpu-bundle' (the build must link with the bundle's LDFLAGS)" >&2; exit 1; }
done
grep -q '^#define TK_DEFAULT_ENDPOINT ""$' "$b/gen/tk_default.h" || {
  echo "gpu-bundle: $b was built with a fixed default endpoint ($(grep ENDPOINT "$b/gen/tk_default.h"))" >&2
  echo "HINT: rm -rf $b and run 'make gpu-bundle'" >&2; exit 1; }

# The libraries: everything ldd resolves except the C runtime the GPU image has anyway.
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s)\.so'
# ldd with the bundle's own lib/ aside, or the $ORIGIN RPATH would resolve to the copies
rm -rf "$b/lib.prev"; [ -d "$b/lib" ] && mv "$b/lib" "$b/lib.prev"
missing=$(ldd "${files[@]}" 2>/dev/null | grep 'not found' || true)
[ -z "$missing" ] || { echo "gpu-bundle: unresolved libraries:" >&2; echo "$missing" >&2; exit 1; }
libs=$(ldd "${files[@]}" 2>/dev/null | awk '/=> \//{print $1" "$3}' | sort -u | while read -r name path; do
  [[ $name =~ $system ]] || echo "$name $path"; done)

# Tarballs newer than everything they hold (a make test after changes elsewhere) are kept: packing
# 50 MB is most of the 10 s of CPU such a run took. A library counts by its change time: dpkg gives
# an upgraded file its package's older modification time.
fresh=0
if [ -f "$out/build.tgz" ] && [ -f "$out/lib.tgz" ] && [ -d "$b/lib.prev" ]; then
  fresh=1 packed=$(stat -c %Y "$out/lib.tgz")
  [ "$(stat -c %Y "$out/build.tgz")" -lt "$packed" ] && packed=$(stat -c %Y "$out/build.tgz")
  for f in "${files[@]}" "$b/libtk.so" "$b/registry/.stamp" "$0" $(awk '{print $2}' <<<"$libs"); do
    [ "$(stat -L -c %Y "$f")" -lt "$packed" ] && [ "$(stat -L -c %Z "$f")" -lt "$packed" ] || { fresh=0; break; }
  done
  [ "$(ls "$b/lib.prev" | wc -l)" = "$(grep -c . <<<"$libs")" ] || fresh=0
fi
if [ $fresh = 1 ]; then
  mv "$b/lib.prev" "$b/lib"
else
  rm -rf "$b/lib.prev"; mkdir -p "$b/lib"
  while read -r name path; do cp -L "$path" "$b/lib/$name"; done <<<"$libs"
fi

# The newest glibc symbol version needed by anything in the bundle.
glibc=$(for f in "${files[@]}" "$b"/lib/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -n1)

mkdir -p "$out"
if [ $fresh = 1 ]; then
  echo "gpu-bundle: $out/*.tgz are newer than everything they hold: kept" >&2
else
  rm -f "$out/build.tgz" "$out/lib.tgz"
  tar czf "$out/lib.tgz" "$b/lib"
  rel=("${files[@]}" "$b/libtk.so" "$b/registry")
  tar czf "$out/build.tgz" --exclude='*.d' --exclude='.stamp' "${rel[@]}"
fi
{
  echo "tk GPU bundle, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty')"
  echo "build dir: $b"
  echo "glibc needed: $glibc"
  echo "built on: $(ldd --version | head -n1)"
  echo "libraries: $(ls "$b/lib" | wc -l) ($(du -sh "$b/lib" | cut -f1) raw)"
  echo "binaries: ${files[*]}"
  ls -l "$out/lib.tgz" "$out/build.tgz" | awk '{print "tarball: "$NF" "$5" bytes"}'
} >"$out/MANIFEST"
echo "$glibc" >"$out/GLIBC"
cat "$out/MANIFEST" >&2
total=$(du -cb "$out"/*.tgz | tail -n1 | cut -f1)
[ "$total" -lt $((60 * 1024 * 1024)) ] || { echo "gpu-bundle: $total bytes: over the 60 MiB budget" >&2; exit 1; }
