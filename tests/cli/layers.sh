#!/usr/bin/env bash
# The layer rules of docs/hacking.md: every #include of every .c and .h follows the layer table
# (tests/layers.py reads it); the checker itself catches a bad include, a backwards table, a folder
# without a row and a stale exception, on a scratch tree. And the layout: `make format-check` (every
# C file matches .clang-format), and the check fails on a file that does not match.
. "$(dirname "$0")/lib.sh"

LAYERS=$ROOT/tests/layers.py

t_tree_follows_the_table() {
  expect_rc 0 python3 "$LAYERS" "$ROOT"
}

# A scratch tree with the real docs/hacking.md and one source per folder that is allowed.
scratch_tree() {
  local t=$WORK/tree; rm -rf "$t"; mkdir -p "$t/docs" "$t/common" "$t/hub" "$t/api" "$t/include" "$t/cli"
  cp "$ROOT/docs/hacking.md" "$t/docs/"
  # a known exception, so the checker's handling of one is tested whether or not the tree has any
  python3 - "$t/docs/hacking.md" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
s = re.sub(r"(<!-- layer-exceptions -->\n\| file \| includes \| issue \|\n\|---\|---\|---\|\n)",
           r"\1| `hub/serve.c` | `api/api.h` | 99 |\n", s)
open(p, "w").write(s)
PY
  printf '#include "tk.h"\n' >"$t/include/tk.h"
  printf '#include "tk.h"\n#include "common/common.h"\n' >"$t/common/common.h"
  printf '#include "common/common.h"\n#include "hub/hub.h"\n' >"$t/hub/hub.h"
  printf '#include "api/api.h"\n' >"$t/hub/serve.c"   # the known exception
  printf '#include "hub/hub.h"\n#include "common/common.h"\n' >"$t/api/api.h"
  printf '#include "tk.h"\n#include "cli.h"\n' >"$t/cli/cli.h"
  echo "$t"
}

t_checker_catches_violations() {
  local t; t=$(scratch_tree)
  expect_rc 0 python3 "$LAYERS" "$t"
  # a lower folder including a higher one's header
  printf '#include "hub/hub.h"\n' >"$t/common/bad.c"
  expect_rc 1 python3 "$LAYERS" "$t"
  expect_out "common/bad.c:1: includes hub/hub.h: common/ may include only include"
  rm "$t/common/bad.c"
  # cli reaching past tk.h
  printf '#include "tk.h"\n#include "common/common.h"\n' >"$t/cli/cmd_x.c"
  expect_rc 1 python3 "$LAYERS" "$t"
  expect_out "cli/cmd_x.c:2: includes common/common.h"
  rm "$t/cli/cmd_x.c"
  # a folder with C sources and no row
  mkdir -p "$t/newdir"; printf 'int x;\n' >"$t/newdir/x.c"
  expect_rc 1 python3 "$LAYERS" "$t"
  expect_out "folder newdir/ holds C sources but has no row"
  rm -r "$t/newdir"
  # the exception fixed but still listed
  printf '#include "hub/hub.h"\n' >"$t/hub/serve.c"
  expect_rc 1 python3 "$LAYERS" "$t"
  expect_out "hub/serve.c no longer includes api/api.h: remove its row (issue 99)"
}

t_table_must_point_one_way() {
  local t; t=$(scratch_tree)
  # common naming hub, a row below it: a cycle the table must not allow
  sed -i 's/^| `common` | `include` |/| `common` | `include`, `hub` |/' "$t/docs/hacking.md"
  expect_rc 1 python3 "$LAYERS" "$t"
  expect_out "layer table: common may include hub, which is not a row above it"
}

# clang-format 18 or newer (the config's AlignTrailingComments: Leave), or "".
clang_format() {
  local c v
  for c in clang-format-19 clang-format-18 clang-format; do
    command -v "$c" >/dev/null || continue
    v=$("$c" --version | grep -o 'version [0-9]*' | grep -o '[0-9]*')
    [ "${v:-0}" -ge 18 ] && { echo "$c"; return; }
  done
}

t_format_check() {
  local cf; cf=$(clang_format)
  if [ -z "$cf" ]; then
    if [ -n "${CI:-}" ]; then fail "CI=true but no clang-format 18 or newer (scripts/setup.sh installs clang-format-19)"
    else skip "no clang-format 18 or newer (scripts/setup.sh installs clang-format-19)"; fi
    return
  fi
  expect_rc 0 make -s -C "$ROOT" format-check CLANG_FORMAT="$cf"
  # the check is real: a badly laid out file in a folder it covers fails it
  local t=$WORK/fmt; rm -rf "$t"; mkdir -p "$t"
  cp "$ROOT/.clang-format" "$t/"; printf 'int  f( void ){return 0;}\n' >"$t/bad.c"
  expect_rc 1 "$cf" --dry-run -Werror "$t/bad.c"
  expect_out "code should be clang-formatted"
  # and no file is left out of it: no ignore list, and every C file of the tree is one make formats
  [ ! -e "$ROOT/.clang-format-ignore" ] || fail ".clang-format-ignore is back: make format skips what it lists"
  local listed; listed=$(make -s -C "$ROOT" -n format CLANG_FORMAT=CF | tr ' ' '\n' | grep '\.[ch]$' | sort)
  (cd "$ROOT" && git ls-files '*.c' '*.h' 2>/dev/null | grep -v '^kernels-src/' | sort) |
    comm -23 - <(echo "$listed") | grep . && fail "C files make format leaves alone (above)"
}

t_no_function_over_120_lines() {
  python3 "$ROOT/tests/fnlen.py" "$ROOT" >"$WORK/fnlen.out" 2>&1 || { fail "functions over 120 lines:"; cat "$WORK/fnlen.out" >&2; }
  # and the checker sees a long function when there is one
  mkdir -p "$WORK/fl/models"
  { echo 'static int f(void)'; echo '{'; for i in $(seq 130); do echo "    x();"; done; echo '}'; } >"$WORK/fl/models/long.c"
  python3 "$ROOT/tests/fnlen.py" "$WORK/fl" >"$WORK/fnlen2.out" 2>&1 && fail "fnlen.py missed a 133-line function"
  grep -q "models/long.c:1: f is 133 lines" "$WORK/fnlen2.out" || { fail "fnlen.py's report:"; cat "$WORK/fnlen2.out" >&2; }
}

run_tests
