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
  # not installed and not in the registry: the registry's answer (issue 23, item 10)
  json_check not_found 3 "$TK" --json info nosuch/pkg
  expect_out '"message": "package nosuch/pkg not found in the registry"'; expect_out '"hint": "check the name'
  json_check not_found 3 "$TK" --json --offline info nosuch/pkg
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
  grep -q "^tk: package nosuch/pkg not found in the registry" "$WORK/stderr" || fail "no human message: $(cat "$WORK/stderr")"
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

# Every command in 'tk --help', each with one failing invocation past its option parser: stdout holds
# exactly one {"error": ...} object whose exit_code is the process's, stderr nothing. A command without
# a line in the table fails the test: a new command must say how it fails under --json.
t_every_command_fails_as_json() {
  local W=$WORK; : >"$W/afile"
  # COMMAND|STATUS(ES)|ARGS   (ARGS split on spaces; "@file-home" first: TK_HOME is a plain file;
  # run: -q, as on a GPU machine it installs and compiles before the usage error)
  local table="get|not_found|kernels-community/no-such-package
list|io|@file-home
info|not_found|nosuch/pkg
verify|not_found|nosuch/pkg
remove|not_found|nosuch/pkg
lock|not_found|nosuch/pkg
keygen|io|$W/afile/key.pem
publish|not_found|$W/nodir --to $W/reg --key $W/nokey
yank|not_found|kernels-community/activation@1.0.0 --to $W/reg --key $W/nokey
trust|not_found|remove nosuch-org SHA256:00000000000000000000000000000000
build|not_found|kernels-community/no-such-package
cache|io|@file-home stats
doctor|io|@file-home
run|no_device usage|-q kernels-community/activation silu_and_mul_f32 --shape 4
ops|not_found|no_such_op
run-op|not_found|no_such_op --shape 4
serve|io|--root $W/afile
serve-model|not_found|$W/nodir --listen 127.0.0.1:0
tokenize|not_found|$W/nodir hi
detokenize|usage|$W/nodir 4,x
model|not_found|info $W/nodir
embed|not_found|$W/nodir hi
init|io|x --dir $W/afile
versions|not_found|kernels-community/no-such-package
update|not_found|nosuch/pkg
check|io|@file-home $W/nodir
generate|not_found|$W/nodir --prompt hi
chat|not_found|$W/nodir
selftest|not_found|--forget nosuch/pkg
train|not_found|$W/nodir --data $W/nofile --out $W/tout"
  local cmds c line statuses args home out rc n=0
  cmds=$("$TK" --help | awk '/^Global options/ {exit} /^  [a-z][a-z-]* / {print $1}')
  [ "$(echo "$cmds" | wc -l)" -ge 20 ] || { fail "tk --help lists too few commands: $cmds"; return; }
  for c in $cmds; do
    line=$(printf '%s\n' "$table" | grep "^$c|") || { fail "json.sh has no failing invocation for 'tk $c': add one"; continue; }
    statuses=$(echo "$line" | cut -d'|' -f2); args=$(echo "$line" | cut -d'|' -f3-)
    home=$TK_HOME
    case "$args" in @file-home*) home=$W/afile; args=${args#@file-home} ;; esac
    # shellcheck disable=SC2086
    out=$(TK_HOME=$home timeout 60 "$TK" --json "$c" $args 2>"$WORK/stderr" </dev/null); rc=$?
    [ -s "$WORK/stderr" ] && fail "tk --json $c $args wrote to stderr: $(head -c 300 "$WORK/stderr")"
    echo "$out" | python3 -c '
import json, sys
rc, statuses = int(sys.argv[1]), sys.argv[2].split()
d = json.loads(sys.stdin.read())           # one object: extra text or a second object fails here
assert list(d) == ["error"], d
e = d["error"]
assert set(e) == {"status", "exit_code", "message", "hint"}, e
assert rc != 0 and e["exit_code"] == rc, (rc, e)
assert e["status"] in statuses, (statuses, e)
assert isinstance(e["message"], str) and e["message"] and "HINT" not in e["message"], e
assert e["hint"] is None or (isinstance(e["hint"], str) and e["hint"]), e
' "$rc" "$statuses" || fail "tk --json $c $args (exit $rc) printed: $(echo "$out" | head -c 400)"
    n=$((n + 1))
  done
  [ $n -ge 20 ] || fail "only $n commands checked"
}

# tk cache stats/ls --json: the NVRTC that keys new entries as {version, path} (or null), never the
# internal file id; an entry's package, commit, source file and kernels as fields, not labels.
t_cache_json_shapes() {
  OUT=$("$TK" --json cache stats 2>"$WORK/stderr") || fail "cache stats --json failed: $(cat "$WORK/stderr")"
  echo "$OUT" | python3 -c '
import json, re, sys
d = json.loads(sys.stdin.read())
assert set(d) == {"path", "entries", "bytes", "max_bytes", "nvrtc"}, d
nv = d["nvrtc"]
assert nv is None or (set(nv) == {"version", "path"} and re.fullmatch(r"\d+\.\d+", nv["version"]) and "/" in nv["path"]), nv
assert d["entries"] == 0 and d["bytes"] == 0, d
' || fail "cache stats --json: $OUT"
  OUT=$("$TK" --json doctor 2>/dev/null)
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["cache"]["nvrtc"] == d["nvrtc"], d' ||
    fail "doctor's cache.nvrtc is not its nvrtc: $OUT"
  "$TK" doctor --json 2>/dev/null | grep -q '"nvrtc": {' || { skip "NVRTC not installed: no cache entry to list"; return; }
  expect_rc 0 "$TK" init my-org/jsonpkg --dir "$WORK/jsonpkg"
  expect_rc 0 "$TK" build "$WORK/jsonpkg" --arch sm_80
  OUT=$("$TK" --json cache ls 2>/dev/null) || fail "cache ls --json failed"
  echo "$OUT" | python3 -c '
import json, sys
(e,) = json.loads(sys.stdin.read())
assert set(e) == {"key", "package", "commit", "target", "nvrtc", "size", "created", "last_used", "hits",
                  "source", "kernels", "kernel_count", "selftest"}, e
assert e["selftest"] == [], e   # no self-test recorded (docs/selftest.md)
assert e["package"] == "my-org/jsonpkg" and e["commit"] is None, e   # a directory: no commit
assert e["source"] == "jsonpkg.cu" and e["kernels"] == ["jsonpkg_f32"] and e["kernel_count"] == 1, e
assert e["target"] == "sm_80" and len(e["key"]) == 64, e
' || fail "cache ls --json: $OUT"
  expect_rc 0 "$TK" cache ls
  expect_out "my-org/jsonpkg@local"
  expect_out "jsonpkg.cu: jsonpkg_f32"
}

run_tests
