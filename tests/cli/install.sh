#!/usr/bin/env bash
# install.sh — `make install` into scratch prefixes: the layout and names (no Tcl/Tk clash), the
# pkg-config and CMake files, C and C++ host programs built with each and run, the default endpoint
# following the install (prefix, DESTDIR staging, moved prefix), only `tk serve` linking
# libmicrohttpd, the manual page, and `make uninstall`.
. "$(dirname "$0")/lib.sh"

if [ "${TK_BUILD:-build}" != build ]; then
  echo "skip install.sh: make install is tested on the default build (TK_BUILD=${TK_BUILD})"; exit 0
fi
for t in cmake pkg-config c++; do
  command -v $t >/dev/null || { [ -n "${CI:-}" ] && { echo "FAIL: $t is missing (scripts/setup.sh)"; exit 1; }
                                echo "skip install.sh: no $t (scripts/setup.sh installs it)"; exit 0; }
done

P=$WORK/prefix
HOSTSRC=$ROOT/tests/install
install_into() { # install_into PREFIX [DESTDIR]
  OUT=$(make -s -C "$ROOT" install PREFIX="$1" DESTDIR="${2:-}" 2>&1) || { fail "make install PREFIX=$1 DESTDIR=${2:-}: $OUT"; return 1; }
}
install_into "$P" || { echo "FAIL: make install"; exit 1; }
pc() { PKG_CONFIG_PATH=$P/lib/pkgconfig pkg-config "$@"; }

t_layout_no_tcl_tk_names() {
  local f
  for f in bin/tk lib/libtkhub.so.0 lib/libtkhub.so lib/libtkhub.a lib/libtkhub-serve.so.0 lib/libtkhub-serve.a \
           include/tkhub/tk.h lib/pkgconfig/tkhub.pc lib/pkgconfig/tkhub-serve.pc lib/cmake/tkhub/tkhubConfig.cmake \
           lib/cmake/tkhub/tkhubConfigVersion.cmake share/tkhub/registry share/doc/tkhub/README.md \
           share/doc/tkhub/docs/package-format.md; do
    [ -e "$P/$f" ] || fail "missing $P/$f"
  done
  # nothing under Tcl/Tk's names
  for f in lib/libtk.so lib/libtk.a lib/libtk.so.0 include/tk.h lib/pkgconfig/tk.pc; do
    [ -e "$P/$f" ] && fail "installed $f: Tcl/Tk's name"
  done
  [ -e "$P/share/tkhub/registry/.stamp" ] && fail "the build's stamp file was installed"
  expect_rc 0 pc --modversion tkhub; expect_out "0.1"
  expect_rc 0 pc --libs tkhub; expect_out "-L$P/lib -ltkhub"; expect_no_out microhttpd
  expect_rc 0 pc --cflags tkhub; expect_out "-I$P/include"
  expect_rc 0 pc --static --libs tkhub; expect_out "-lcurl"; expect_out "-ljansson"; expect_no_out microhttpd
  expect_rc 0 pc --static --libs tkhub-serve; expect_out "-ltkhub-serve"; expect_out "-lmicrohttpd"
  expect_rc 0 pc --exists tk --print-errors; [ -n "$(pc --variable=prefix tk 2>/dev/null | grep "$P")" ] && fail "pkg-config tk names our prefix"
}

t_only_serve_links_microhttpd() {
  ldd "$P/lib/libtkhub.so.0" | grep -q microhttpd && fail "libtkhub.so links libmicrohttpd"
  ldd "$P/lib/libtkhub-serve.so.0" | grep -q microhttpd || fail "libtkhub-serve.so does not link libmicrohttpd"
  ldd "$P/bin/tk" | grep -q microhttpd || fail "tk does not link libmicrohttpd"
  nm -D --defined-only "$P/lib/libtkhub.so.0" | grep -q ' tk_server_new$' && fail "libtkhub.so has the server"
  nm -D --defined-only "$P/lib/libtkhub-serve.so.0" | grep -q ' tk_server_new$' || fail "libtkhub-serve.so lacks tk_server_new"
  nm -D --defined-only "$P/lib/libtkhub.so.0" | grep -q ' tk_pkg_get$' || fail "libtkhub.so lacks tk_pkg_get"
  # in the tree too: build/libtk.so (the tests', examples' and python's) does not link it either
  ldd "$B/libtk.so.0" | grep -q microhttpd && fail "build/libtk.so links libmicrohttpd"
  # the build directory's registry path is in no installed library or program
  grep -q "$B/registry" "$P/bin/tk" "$P/lib/libtkhub.so.0" "$P/lib/libtkhub.a" && fail "an installed file names $B/registry"
  return 0
}

t_installed_tk_uses_installed_registry() {
  OUT=$("$P/bin/tk" doctor --json 2>&1); expect_out "\"endpoint\": \"file://$P/share/tkhub/registry\""
  expect_rc 0 "$P/bin/tk" get kernels-community/activation; expect_out "kernels-community/activation"
  expect_rc 0 "$P/bin/tk" verify kernels-community/activation
}

# (tk doctor exits non-zero on a machine without a GPU: its JSON is what counts here)
# check_host PROGRAM [PREFIX]: it ran against the installed registry of PREFIX and got the package.
check_host() {
  expect_rc 0 "$1"; expect_out "endpoint file://${2:-$P}/share/tkhub/registry"
  expect_out "got kernels-community/activation"; expect_out "version 0.1"
}

t_pkg_config_c_cxx_static() {
  local d=$WORK/pc; mkdir -p "$d"
  # shellcheck disable=SC2046
  # the README's line for a prefix the loader does not search: the rpath from tkhub.pc's libdir
  cc -Wall -Werror "$HOSTSRC/host.c" -o "$d/host_c" $(pc --cflags --libs tkhub) -Wl,-rpath,"$(pc --variable=libdir tkhub)" || { fail "cc host.c"; return; }
  # shellcheck disable=SC2046
  c++ -Wall -Werror "$HOSTSRC/host.cpp" -o "$d/host_cxx" $(pc --cflags --libs tkhub) -Wl,-rpath,"$P/lib" || { fail "c++ host.cpp"; return; }
  # static: libtkhub.a and the libraries Libs.private names
  # shellcheck disable=SC2046
  cc "$HOSTSRC/host.c" -o "$d/host_static" $(pc --cflags --static --libs tkhub | sed 's/-ltkhub /-l:libtkhub.a /') || { fail "cc host.c static"; return; }
  ldd "$d/host_c" | grep -q "libtkhub.so.0 => $P/lib/" || fail "host_c does not load $P/lib/libtkhub.so.0"
  ldd "$d/host_static" | grep -q libtkhub && fail "host_static loads libtkhub.so"
  check_host "$d/host_c"
  check_host "$d/host_cxx"; expect_out "(c++)"
  check_host "$d/host_static"
  # with Tcl/Tk's include directory first, <tkhub/tk.h> is still ours
  mkdir -p "$d/tcltk"; echo '#error "this is Tcl/Tk'"'"'s tk.h"' >"$d/tcltk/tk.h"
  # shellcheck disable=SC2046
  cc -I"$d/tcltk" "$HOSTSRC/host.c" -o "$d/host_c2" $(pc --cflags --libs tkhub) || fail "a tk.h first in the path broke the build"
}

t_cmake_c_cxx_static() {
  local d=$WORK/cmake
  OUT=$(cmake -S "$HOSTSRC" -B "$d" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_RPATH="$P/lib" 2>&1) || { fail "cmake configure: $OUT"; return; }
  OUT=$(cmake --build "$d" 2>&1) || { fail "cmake build: $OUT"; return; }
  check_host "$d/host_c"
  check_host "$d/host_cxx"; expect_out "(c++)"
  check_host "$d/host_static"
  # a version the install does not have is refused
  mkdir -p "$WORK/cmake-v2"; sed 's/find_package(tkhub 0.1 REQUIRED)/find_package(tkhub 1.0 REQUIRED)/' "$HOSTSRC/CMakeLists.txt" >"$WORK/cmake-v2/CMakeLists.txt"
  cp "$HOSTSRC"/host.c "$HOSTSRC"/host.cpp "$WORK/cmake-v2/"
  expect_rc 1 cmake -S "$WORK/cmake-v2" -B "$WORK/cmake-v2/b" -DCMAKE_PREFIX_PATH="$P"; expect_out "tkhub"
}

t_destdir_and_moved_prefix() {
  local stage=$WORK/stage dest=/opt/tkhub-test-$$
  install_into "$dest" "$stage" || return
  [ -e "$dest" ] && { fail "DESTDIR install wrote to $dest"; return; }
  [ -x "$stage$dest/bin/tk" ] || { fail "no $stage$dest/bin/tk"; return; }
  # the staged tree is not at its prefix: the command finds ../share/tkhub/registry beside itself
  OUT=$("$stage$dest/bin/tk" doctor --json 2>&1); expect_out "\"endpoint\": \"file://$stage$dest/share/tkhub/registry\""
  expect_rc 0 "$stage$dest/bin/tk" get kernels-community/rmsnorm
  # a moved prefix: the shared library finds the registry beside itself too
  local moved=$WORK/moved; cp -a "$P" "$moved"
  # shellcheck disable=SC2046
  cc "$HOSTSRC/host.c" -o "$WORK/host_moved" $(PKG_CONFIG_PATH=$moved/lib/pkgconfig pkg-config --cflags tkhub) \
     -L"$moved/lib" -ltkhub -Wl,-rpath,"$moved/lib" || { fail "cc host.c (moved)"; return; }
  mv "$P" "$P.away"
  TK_HOME=$WORK/home-moved check_host "$WORK/host_moved" "$moved"
  mv "$P.away" "$P"
}

# docs/tk.1: renders without a warning, names every command of cli/main.c's table (and each with the
# options its --help lists), the version of this build, every TK_* variable the code reads, the
# exit codes of cli/cli.h; installed as share/man/man1/tk.1 and read by man from there.
t_man_page() {
  local page=$ROOT/docs/tk.1 c v o
  command -v groff >/dev/null || { [ -n "${CI:-}" ] && fail "groff is missing (scripts/setup.sh)"; skip "no groff"; return; }
  OUT=$(groff -man -Tutf8 -ww -z "$page" 2>&1); [ -z "$OUT" ] || fail "groff warns about docs/tk.1: $OUT"
  local text; text=$(LC_ALL=C.UTF-8 MANWIDTH=200 groff -man -Tutf8 -rLL=200n "$page" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g; s/.\x08//g')
  for c in $(sed -n 's/^ *{"\([a-z-]*\)", tk_cmd_[a-z_]*, ".*/\1/p' "$ROOT/cli/main.c"); do
    case "$text" in *"tk $c "*|*"tk $c"$'\n'*) ;; *) fail "docs/tk.1 does not describe 'tk $c'" ;; esac
    # every long option the command's --help names is in the page
    for o in $("$TK" "$c" --help 2>/dev/null | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
      case "$o" in --help|--json|--quiet|--verbose|--offline) continue ;; esac
      case "$text" in *"$o"*) ;; *) fail "docs/tk.1 lacks $o of tk $c" ;; esac
    done
  done
  [ "$(sed -n 's/^ *{"\([a-z-]*\)", tk_cmd_.*/\1/p' "$ROOT/cli/main.c" | wc -l)" -ge 20 ] || fail "read too few commands from cli/main.c"
  v=$("$TK" --version | awk '{print $2}')
  grep -q "^\.TH TK 1 .*\"tk $v\"" "$page" || fail "docs/tk.1's .TH does not say tk $v"
  for v in $(cd "$ROOT" && grep -rhoE 'getenv\("TK_[A-Z0-9_]+"\)|"TK_[A-Z_]+", "CUDA_HOME"' api hub jit ops cache cli common models 2>/dev/null |
             grep -oE 'TK_[A-Z0-9_]+' | sort -u); do
    case "$text" in *"$v"*) ;; *) fail "docs/tk.1's ENVIRONMENT lacks $v, which the code reads" ;; esac
  done
  for v in $(sed -n 's/^ *TK_EXIT_[A-Z_]* = \([0-9]\),.*/\1/p' "$ROOT/cli/cli.h"); do
    printf '%s\n' "$text" | grep -qE "^ +$v +[A-Z]" || fail "docs/tk.1's EXIT STATUS lacks $v"
  done
  [ -f "$P/share/man/man1/tk.1" ] || { fail "make install did not install share/man/man1/tk.1"; return; }
  cmp -s "$page" "$P/share/man/man1/tk.1" || fail "the installed tk.1 differs from docs/tk.1"
  if command -v man >/dev/null; then
    OUT=$(MANPATH=$P/share/man LC_ALL=C.UTF-8 MANWIDTH=100 man tk 2>&1); expect_out "a kernel hub and JIT kernel package manager"
    expect_out "EXIT STATUS"
  fi
}

t_uninstall() {
  local u=$WORK/uninst; install_into "$u" || return
  expect_rc 0 make -s -C "$ROOT" uninstall PREFIX="$u"
  local left; left=$(find "$u" -type f -o -type l)
  [ -z "$left" ] || fail "make uninstall left: $left"
}

run_tests
