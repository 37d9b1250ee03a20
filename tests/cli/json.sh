#!/usr/bin/env bash
# json.sh — --json contracts (docs/json.md): success prints JSON on stdout; every failure prints one
# {"error": {"status", "exit_code", "message", "hint"}} object on stdout and nothing on stderr, with
# the exit code of the failure; verify --json names each bad file.
. "$(dirname "$0")/lib.sh"

# json_check STATUS EXIT CMD...: runs CMD with --json; stdout must be exactly one error object.
json_check() {
  local status=$1 want=$2; shift 2
  local out err rc
  out=$("$@" 2>"$WORK/stderr"); rc=$?
  err=$(cat "$WORK/stderr")
  [ "$rc" = "$want" ] || fail "line ${BASH_LINENO[0]}: '$*' exited $rc, want $want"
  # stderr: nothing, unless the command did work first (progress of the packages before the failure)
  [ -z "$err" ] || [ -n "${PROGRESS_OK:-}" ] || fail "line ${BASH_LINENO[0]}: '$*' wrote to stderr: $err"
  case "$err" in *'"error"'*) fail "line ${BASH_LINENO[0]}: the error object went to stderr" ;; esac
  echo "$out" | python3 -c '
import json, sys
status, code = sys.argv[1], int(sys.argv[2])
d = json.loads(sys.stdin.read())
e = d["error"]
assert set(e) == {"status", "exit_code", "message", "hint"}, e
assert e["status"] == status, e
assert e["exit_code"] == code, e
assert isinstance(e["message"], str) and e["message"] and "HINT" not in e["message"], e
assert e["hint"] is None or (isinstance(e["hint"], str) and e["hint"]), e
' "$status" "$want" || fail "line ${BASH_LINENO[0]}: '$*' printed: $out"
  OUT=$out
}

t_error_objects() {
  json_check not_found 3 "$TK" --json info nosuch/pkg
  expect_out '"hint": "run '"'"'tk get nosuch/pkg'"'"'"'
  json_check usage 2 "$TK" info --json --bogus
  expect_out "usage: tk info"
  json_check usage 2 "$TK" --json frobnicate
  json_check invalid 2 "$TK" --json get 'not a ref'
  json_check not_found 3 "$TK" --json get kernels-community/no-such-package
  json_check not_found 3 "$TK" --json remove kernels-community/no-such-package
  # without --json the same failure is one human line on stderr, nothing on stdout
  local out; out=$("$TK" info nosuch/pkg 2>"$WORK/stderr")
  [ -z "$out" ] || fail "human failure wrote to stdout: $out"
  grep -q "^tk: nosuch/pkg is not installed" "$WORK/stderr" || fail "no human message: $(cat "$WORK/stderr")"
}

t_success_is_json() {
  OUT=$("$TK" --json get kernels-community/activation 2>/dev/null) || fail "get --json failed"
  echo "$OUT" | python3 -c 'import json,sys; assert json.loads(sys.stdin.read())[0]["name"] == "kernels-community/activation"' || fail "get --json: $OUT"
  # a get of several where one fails: only the error object, no half array
  PROGRESS_OK=1 json_check not_found 3 "$TK" --json get kernels-community/rmsnorm kernels-community/no-such-package
  local cmd
  for cmd in "list" "info kernels-community/activation" "verify" "trust list"; do
    # shellcheck disable=SC2086
    OUT=$("$TK" --json $cmd 2>/dev/null) || fail "tk --json $cmd failed"
    echo "$OUT" | python3 -c 'import json,sys; json.loads(sys.stdin.read())' || fail "tk --json $cmd: not JSON: $OUT"
  done
}

t_verify_json_names_bad_files() {
  expect_rc 0 "$TK" get -q kernels-community/activation
  local sha path f
  # the store object of one file: tamper with it, remove another
  sha=$("$TK" --json info kernels-community/activation | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["files"][0]["sha256"], d["files"][0]["path"], d["files"][1]["sha256"], d["files"][1]["path"])')
  set -- $sha
  f=$(find "$TK_HOME" -type f -path "*objects*" -name "$1*" | head -n 1)
  [ -n "$f" ] || { fail "no store object for $2"; return; }
  chmod u+w "$f"; echo x >>"$f"
  local g; g=$(find "$TK_HOME" -type f -path "*objects*" -name "$3*" | head -n 1)
  chmod u+w "$(dirname "$g")"; rm -f "$g"
  OUT=$("$TK" --json verify 2>"$WORK/stderr"); local rc=$?
  [ $rc = 5 ] || fail "verify --json exited $rc, want 5"
  [ -s "$WORK/stderr" ] && fail "verify --json wrote to stderr: $(cat "$WORK/stderr")"
  echo "$OUT" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["ok"] is False and d["bad_count"] == 2, d
bad = {b["file"]: b for b in d["bad_files"]}
assert bad[sys.argv[1]]["problem"] == "altered" and bad[sys.argv[1]]["want"] == sys.argv[2], bad
assert bad[sys.argv[1]]["sha256"] != sys.argv[2]
assert bad[sys.argv[3]]["problem"] == "missing" and bad[sys.argv[3]]["sha256"] is None, bad
assert all(b["package"] == "kernels-community/activation" for b in d["bad_files"])
' "$2" "$1" "$4" || fail "verify --json: $OUT"
}

run_tests
