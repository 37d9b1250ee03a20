#!/usr/bin/env bash
# The GPU bundle of `make gpu-bundle` (.gpu/*.tgz) is self-contained: unpacked into another directory,
# every binary and libtk.so.0 (also through python's ctypes) resolve each library to the bundle's lib/
# or to glibc/libstdc++/libgcc_s, nothing to the build tree; the RPATH is $ORIGIN-relative DT_RPATH;
# `tk get` works against the bundled registry with no TK_ENDPOINT; the glibc it needs is recorded; the
# bundle's MPICH (tk-mpi, mpiexec.hydra) starts ranks that join one communicator.
# In CI a missing bundle is a failure (make test builds it).
. "$(dirname "$0")/lib.sh"

system='^/(usr/)?lib(64)?(/x86_64-linux-gnu)?/(ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s)\.so'

unpack() {
  [ -f "$ROOT/.gpu/build.tgz" ] && [ -f "$ROOT/.gpu/lib.tgz" ] || {
    [ -n "${CI:-}" ] && { fail "no bundle in $ROOT/.gpu (make gpu-bundle)"; return 1; }
    skip "no bundle in .gpu; run make gpu-bundle"; return 1; }
  C=$WORK/elsewhere/copy
  mkdir -p "$C" && cp "$ROOT"/.gpu/*.tgz "$ROOT/.gpu/GLIBC" "$C/" &&
    tar xzf "$C/lib.tgz" -C "$C" && tar xzf "$C/build.tgz" -C "$C" || { fail "cannot unpack"; return 1; }
  G=$C/build-gpu
}

elfs() { for f in "$G/tk" "$G/tk-mpi" "$G/libtk.so.0" "$G"/tests/test_* "$G"/examples/* "$G"/bench/*; do
  [ -f "$f" ] && [ -x "$f" ] && echo "$f"; done; }

t_every_binary_resolves_into_the_bundle() {
  unpack || return
  local n=0 f
  for f in $(elfs); do
    n=$((n + 1))
    local d; d=$(readelf -d "$f")
    echo "$d" | grep -q 'RUNPATH' && fail "$f has a RUNPATH (want DT_RPATH: it also covers dependencies)"
    echo "$d" | grep -qF '(RPATH)              Library rpath: [$ORIGIN/lib:$ORIGIN/../lib]' ||
      fail "$f: RPATH is not \$ORIGIN/lib:\$ORIGIN/../lib: $(echo "$d" | grep -i path)"
    local libs; libs=$(env -u LD_LIBRARY_PATH ldd "$f" 2>&1)
    echo "$libs" | grep -q 'not found' && fail "$f: $(echo "$libs" | grep 'not found')"
    local p
    for p in $(echo "$libs" | awk '/=> \//{print $3} /^\t\//{print $1}' | xargs -r realpath -s); do
      case $p in "$G"/lib/*) ;; *) [[ $p =~ $system ]] || fail "$f loads $p from outside the bundle" ;; esac
      case $p in "$ROOT"/*) fail "$f loads $p from the build tree" ;; esac
    done
  done
  [ $n -ge 11 ] || fail "only $n binaries in the bundle (tk, libtk.so.0, 8 GPU tests, test_nvrtc, ...)"
  [ "$(ls "$G/lib" | wc -l)" -ge 10 ] || fail "the bundle's lib/ has $(ls "$G/lib" | wc -l) libraries"
}

# What the loader really does (LD_DEBUG), for tk itself and for libtk.so.0 through python's ctypes.
t_loader_and_ctypes_load_from_the_bundle() {
  unpack || return
  LD_DEBUG=libs env -u LD_LIBRARY_PATH "$G/tk" --version >/dev/null 2>"$WORK/ld.txt" || fail "tk --version failed"
  grep -q "calling init: $G/lib/libcurl" "$WORK/ld.txt" || fail "libcurl not loaded from the bundle: $(grep curl "$WORK/ld.txt" | head -3)"
  grep 'calling init:' "$WORK/ld.txt" | awk '{print $NF}' | while read -r p; do
    case $p in "$G"/*) ;; *) [[ $p =~ $system ]] || echo "outside: $p" ;; esac
  done >"$WORK/outside.txt"
  [ -s "$WORK/outside.txt" ] && fail "$(cat "$WORK/outside.txt")"
  # libtk.so.0 from python: its own RPATH finds the libraries, and the default registry is the one
  # beside it (dladdr), with no TK_ENDPOINT
  expect_rc 0 env -u LD_LIBRARY_PATH -u TK_ENDPOINT TK_HOME="$WORK/pyhome" python3 - "$G/libtk.so.0" <<'PYEOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
ctx = ctypes.c_void_p()
lib.tk_ctx_endpoint.restype = ctypes.c_char_p
lib.tk_ctx_endpoint.argtypes = [ctypes.c_void_p]
assert lib.tk_ctx_new(ctypes.byref(ctx), None) == 0
print("endpoint", lib.tk_ctx_endpoint(ctx).decode())
for line in open("/proc/self/maps"):
    if ".so" in line:
        print("mapped", line.split()[-1])
PYEOF
  expect_out "endpoint file://$G/registry"
  echo "$OUT" | grep '^mapped .*lib\(curl\|archive\|sqlite3\|jansson\)' | grep -v "$G/lib/" && fail "a library mapped from outside the bundle"
  echo "$OUT" | grep -q "^mapped $G/lib/libarchive" || fail "libarchive not mapped from the bundle"
}

t_tk_get_uses_the_bundled_registry() {
  unpack || return
  expect_rc 0 env -u TK_ENDPOINT -u LD_LIBRARY_PATH TK_HOME="$WORK/h" "$G/tk" get kernels-community/activation
  expect_out "installed kernels-community/activation"
  OUT=$(env -u TK_ENDPOINT TK_HOME="$WORK/h" "$G/tk" doctor --json 2>&1)   # exits 7 without a GPU
  expect_out "\"endpoint\": \"file://$G/registry\""
  expect_no_out "$ROOT/"
  # a GPU test binary lists its ops from the copy (no GPU needed)
  expect_rc 0 "$G/tests/test_gpu_attention" --list-ops
  expect_out "attention_decode"
  # TK_ENDPOINT still overrides
  OUT=$(env TK_ENDPOINT=file://$WORK/nowhere TK_HOME="$WORK/h2" "$G/tk" doctor --json 2>&1)
  expect_out "\"endpoint\": \"file://$WORK/nowhere\""
}

# The bundle was built to resolve the registry beside it, not at the build machine's path.
t_no_absolute_registry_path() {
  unpack || return
  grep -q '^#define TK_DEFAULT_ENDPOINT ""$' "$ROOT/build-gpu/gen/tk_default.h" ||
    fail "build-gpu has a fixed default endpoint: $(grep ENDPOINT "$ROOT/build-gpu/gen/tk_default.h")"
  strings "$G/tk" "$G/libtk.so.0" | grep -F "file://$ROOT" && fail "the build tree's registry path is compiled in"
}

t_glibc_recorded_and_size() {
  unpack || return
  local need; need=$(cat "$C/GLIBC")
  [[ $need =~ ^2\.[0-9]+$ ]] || fail "GLIBC file holds '$need'"
  local max; max=$(for f in $(elfs) "$G"/lib/*; do objdump -T "$f" 2>/dev/null; done |
    grep -o 'GLIBC_2\.[0-9]*' | sed 's/GLIBC_//' | sort -V | tail -n1)
  [ "$need" = "$max" ] || fail "GLIBC says $need, the files need $max"
  grep -q "glibc needed: $need" "$ROOT/.gpu/MANIFEST" || fail "MANIFEST lacks the glibc line"
  local bytes; bytes=$(du -cb "$ROOT"/.gpu/*.tgz | tail -n1 | cut -f1)
  [ "$bytes" -lt $((60 * 1024 * 1024)) ] || fail "the bundle is $bytes bytes (the device tool carries 64 MiB in all)"
}

# tk-mpi (tk against the bundle's MPICH, for gpu-check's phase 1f) under the bundle's mpiexec.hydra, from
# the copy: libmpi.so.12 and its libfabric/UCX come from the bundle, and 2 ranks join one MPI
# communicator (tk doctor under it: MPICH, 2 ranks).
t_bundled_mpich_runs_two_ranks() {
  unpack || return
  grep -q '^mpich: [0-9]' "$ROOT/.gpu/MANIFEST" || {
    [ -n "${CI:-}" ] && { fail "the bundle has no tk-mpi: $(grep '^mpich:' "$ROOT/.gpu/MANIFEST")"; return; }
    skip "the bundle has no tk-mpi: $(grep '^mpich:' "$ROOT/.gpu/MANIFEST")"; return; }
  [ -x "$G/tk-mpi" ] && [ -x "$G/mpich/bin/mpiexec.hydra" ] && [ -x "$G/mpich/bin/hydra_pmi_proxy" ] ||
    { fail "tk-mpi or MPICH's launcher is missing from the bundle"; return; }
  local libs; libs=$(env -u LD_LIBRARY_PATH ldd "$G/tk-mpi")
  grep -q "libmpi.so.12 => $G/lib/libmpi.so.12" <<<"$libs" || fail "libmpi.so.12 not from the bundle: $libs"
  grep -q "libfabric.so.1 => $G/lib/mpich/libfabric.so.1" <<<"$libs" || fail "libfabric not from the bundle: $libs"
  expect_rc 0 env -u LD_LIBRARY_PATH TK_HOME="$WORK/mh" TK_COMM_TIMEOUT=60 timeout 120 \
    "$G/mpich/bin/mpiexec.hydra" -launcher fork -n 2 "$G/tk-mpi" doctor
  expect_out "MPICH Version:"
  expect_out "ranks:    2, started by MPICH, backend mpi"
}

run_tests
