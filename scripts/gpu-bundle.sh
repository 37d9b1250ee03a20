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
# With MPICH (PyPI's mpich wheel: --mpich WHEEL|DIR, else $TK_MPICH, else the wheel cached in
# ~/.cache/tk/mpich/, fetched there with pip once when missing) the bundle also holds build-gpu/tk-mpi
# (the same tk linked against MPICH's libmpi.so.12: `make tk-mpi`) and tests/test_comm-mpi (test_comm's
# MPI workers against it), build-gpu/mpich/bin/{mpiexec.hydra,
# hydra_pmi_proxy}, and lib/libmpi.so.12 with lib/mpich/ (its libfabric and UCX): gpu-check's phase 1f
# runs a model split over 2 ranks on one GPU with them. Without MPICH it is left out and MANIFEST
# says why.
#
# Unpacked anywhere (`tar xzf .gpu/lib.tgz && tar xzf .gpu/build.tgz`), the binaries need no
# LD_LIBRARY_PATH, no TK_ENDPOINT and no make: scripts/gpu-check.sh runs them on a GPU machine, and
# tests/cli/gpu_bundle.sh proves it from a copy. DT_RPATH (not RUNPATH) also covers the libraries'
# own dependencies, and $ORIGIN works through compute-sanitizer and python's ctypes alike.
#
# Usage: scripts/gpu-bundle.sh [--out DIR] [--build DIR] [--no-make] [--mpich WHEEL|DIR | --no-mpich]
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu b=build-gpu domake=1 mpich=${TK_MPICH:-} usempich=1
MPICH_VERSION=5.0.2
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --build) b=$2; shift 2 ;;
    --no-make) domake=0; shift ;;
    --mpich) mpich=$2; shift 2 ;;
    --no-mpich) usempich=0; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1'" >&2; echo "HINT: scripts/gpu-bundle.sh --help" >&2; exit 2 ;;
  esac
done

# MPICH for tk-mpi: unpacked into $b/mpich-dist (once per wheel); $mdir: its bin/ include/ lib/, or
# empty with $mwhy saying why not
mdir= mwhy= msrc=
find_mpich() {
  local cache=$HOME/.cache/tk/mpich src=$mpich
  if [ -z "$src" ]; then
    src=$(ls "$cache"/mpich-$MPICH_VERSION-*manylinux*x86_64.whl 2>/dev/null | head -n1 || true)
    if [ -z "$src" ] && [ "$(uname -m)" = x86_64 ]; then
      mkdir -p "$cache"
      timeout 120 python3 -m pip download --quiet --no-deps --only-binary=:all: --retries 0 --timeout 15 \
        --platform manylinux_2_28_x86_64 --python-version 3 -d "$cache" "mpich==$MPICH_VERSION" >&2 2>"$cache/pip.log" || true
      src=$(ls "$cache"/mpich-$MPICH_VERSION-*manylinux*x86_64.whl 2>/dev/null | head -n1 || true)
    fi
    [ -n "$src" ] || { mwhy="no MPICH wheel ($cache: pip download mpich==$MPICH_VERSION failed; --mpich names one)"; return; }
  fi
  msrc=$src
  if [ -d "$src" ]; then mdir=$(cd "$src" && pwd)
  elif [ -f "$src" ]; then
    local d=$b/mpich-dist stamp
    stamp=$(sha256sum "$src" | cut -c1-16)
    if [ "$(cat "$d/.stamp" 2>/dev/null)" != "$stamp" ]; then
      rm -rf "$d"; mkdir -p "$d"
      python3 -m zipfile -e "$src" "$d" || { mwhy="cannot unpack $src"; return; }
      chmod +x "$d"/mpich-*.data/data/bin/* "$d"/mpich-*.data/data/lib/*.so* 2>/dev/null || true # zipfile keeps no modes
      echo "$stamp" >"$d/.stamp"
    fi
    mdir=$(cd "$d" && ls -d "$PWD"/mpich-*.data/data 2>/dev/null | head -n1 || true)
  else mwhy="--mpich $src: no such wheel or directory"; return
  fi
  for f in include/mpi.h lib/libmpi.so.12 bin/mpiexec.hydra bin/hydra_pmi_proxy; do
    [ -f "$mdir/$f" ] || { mwhy="$src lacks $f"; mdir=; return; }
  done
}
[ $usempich = 1 ] && find_mpich
[ $usempich = 1 ] || mwhy="--no-mpich"
[ -z "$mwhy" ] || echo "gpu-bundle: no tk-mpi in the bundle: $mwhy" >&2

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
  [ -n "$mdir" ] && targets+=("$b/tk-mpi" "$b/tests/test_comm-mpi")
  make -j"$(nproc)" B="$b" DEFAULT_ENDPOINT= MPI=0 MPICH_DIR="$mdir" \
    'LDFLAGS=-Wl,--disable-new-dtags,-rpath,\$$ORIGIN/lib:\$$ORIGIN/../lib' "${targets[@]}" >&2
fi

files=("$b/tk" "$b/libtk.so.0" "$b/tests/test_nvrtc")
[ -n "$mdir" ] && files+=("$b/tk-mpi" "$b/tests/test_comm-mpi")
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
# (MPICH's own libraries resolve from its lib/, and are copied apart below as the tree they are)
rm -rf "$b/lib.prev"; [ -d "$b/lib" ] && mv "$b/lib" "$b/lib.prev"
lddp() { LD_LIBRARY_PATH=${mdir:+$mdir/lib} ldd "$@" 2>/dev/null; }
missing=$(lddp "${files[@]}" | grep 'not found' || true)
[ -z "$missing" ] || { echo "gpu-bundle: unresolved libraries:" >&2; echo "$missing" >&2; exit 1; }
libs=$(lddp "${files[@]}" | awk '/=> \//{print $1" "$3}' | sort -u | while read -r name path; do
  [[ $name =~ $system ]] || { [ -n "$mdir" ] && [[ $path == "$mdir"/* ]]; } || echo "$name $path"; done)
# MPICH's launcher beside the binaries, its library and plugins under lib/ (libmpi.so.12's RUNPATH is
# $ORIGIN:$ORIGIN/mpich)
mfiles=()
[ -n "$mdir" ] && mfiles=("$mdir/bin/mpiexec.hydra" "$mdir/bin/hydra_pmi_proxy" "$mdir/lib/libmpi.so.12")

# Tarballs newer than everything they hold (a make test after changes elsewhere) are kept: packing
# 50 MB is most of the 10 s of CPU such a run took. A library counts by its change time: dpkg gives
# an upgraded file its package's older modification time.
fresh=0
if [ -f "$out/build.tgz" ] && [ -f "$out/lib.tgz" ] && [ -d "$b/lib.prev" ]; then
  fresh=1 packed=$(stat -c %Y "$out/lib.tgz")
  [ "$(stat -c %Y "$out/build.tgz")" -lt "$packed" ] && packed=$(stat -c %Y "$out/build.tgz")
  for f in "${files[@]}" "${mfiles[@]}" "$b/libtk.so" "$b/registry/.stamp" "$0" $(awk '{print $2}' <<<"$libs"); do
    [ "$(stat -L -c %Y "$f")" -lt "$packed" ] && [ "$(stat -L -c %Z "$f")" -lt "$packed" ] || { fresh=0; break; }
  done
  [ "$(ls "$b/lib.prev" | grep -cvxE 'libmpi\.so\.12|mpich')" = "$(grep -c . <<<"$libs")" ] || fresh=0
  { [ -n "$mdir" ] && [ -f "$b/lib.prev/libmpi.so.12" ]; } || { [ -z "$mdir" ] && [ ! -e "$b/lib.prev/libmpi.so.12" ]; } || fresh=0
  { [ -n "$mdir" ] && [ -x "$b/mpich/bin/mpiexec.hydra" ]; } || { [ -z "$mdir" ] && [ ! -e "$b/mpich" ]; } || fresh=0
fi
if [ $fresh = 1 ]; then
  mv "$b/lib.prev" "$b/lib"
else
  rm -rf "$b/lib.prev" "$b/mpich"; mkdir -p "$b/lib"
  while read -r name path; do cp -L "$path" "$b/lib/$name"; done <<<"$libs"
  if [ -n "$mdir" ]; then
    mkdir -p "$b/mpich/bin"
    cp -L "$mdir/bin/mpiexec.hydra" "$mdir/bin/hydra_pmi_proxy" "$b/mpich/bin/"
    cp -L "$mdir/lib/libmpi.so.12" "$b/lib/" && cp -rL "$mdir/lib/mpich" "$b/lib/mpich"
  fi
fi

# The newest glibc symbol version needed by anything in the bundle.
glibc=$(for f in "${files[@]}" $(find "$b/lib" "$b/mpich" -type f 2>/dev/null); do objdump -T "$f" 2>/dev/null || true; done |
  grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -n1)

mkdir -p "$out"
if [ $fresh = 1 ]; then
  echo "gpu-bundle: $out/*.tgz are newer than everything they hold: kept" >&2
else
  rm -f "$out/build.tgz" "$out/lib.tgz"
  tar czf "$out/lib.tgz" "$b/lib"
  rel=("${files[@]}" "$b/libtk.so" "$b/registry")
  [ -n "$mdir" ] && rel+=("$b/mpich")
  tar czf "$out/build.tgz" --exclude='*.d' --exclude='.stamp' "${rel[@]}"
fi
{
  echo "tk GPU bundle, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo '+dirty')"
  echo "build dir: $b"
  echo "glibc needed: $glibc"
  echo "built on: $(ldd --version | head -n1)"
  echo "libraries: $(ls "$b/lib" | wc -l) ($(du -sh "$b/lib" | cut -f1) raw)"
  echo "binaries: ${files[*]}"
  if [ -n "$mdir" ]; then echo "mpich: $MPICH_VERSION from $msrc: $b/tk-mpi, $b/mpich/bin/mpiexec.hydra, $b/lib/libmpi.so.12 and lib/mpich/"
  else echo "mpich: none ($mwhy): gpu-check's phase 1f (the split on the GPU) skips"; fi
  ls -l "$out/lib.tgz" "$out/build.tgz" | awk '{print "tarball: "$NF" "$5" bytes"}'
} >"$out/MANIFEST"
echo "$glibc" >"$out/GLIBC"
cat "$out/MANIFEST" >&2
total=$(du -cb "$out"/*.tgz | tail -n1 | cut -f1)
[ "$total" -lt $((60 * 1024 * 1024)) ] || { echo "gpu-bundle: $total bytes: over the 60 MiB budget" >&2; exit 1; }
