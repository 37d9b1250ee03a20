#!/usr/bin/env bash
# registry_ux.sh — the everyday registry paths of issue 23 through the real tk binary, real registry
# trees (file://), a real `tk serve` on 127.0.0.1 and real NVRTC: publish compiles before it signs
# (item 7), yanking a major's only version (8), tk info on a name that is not installed (10), commit
# prefixes as @ref (11), and several registries in tk list --outdated / tk update (12).
. "$(dirname "$0")/lib.sh"

KEY=$WORK/pub.key
"$TK" keygen "$KEY" >/dev/null || { echo "keygen failed"; exit 1; }
PUB=$(cat "$KEY.pub")

# make_pkg DIR NAME VERSION [BODY]: a one-kernel package; BODY replaces the kernel's body.
make_pkg() {
  local dir=$1 name=$2 ver=$3 body=${4:-"/* $3 */"}
  rm -rf "$dir"; mkdir -p "$dir"
  cat >"$dir/kernel.json" <<EOF
{"name": "$name", "version": "$ver", "license": "MIT", "description": "registry ux $ver",
 "kernels": [{"name": "scale_f32", "op": "scale", "source": "scale.cu", "symbol": "scale",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}, {"name": "n", "type": "i64", "value": "numel(out)"}],
   "launch": {"grid": ["cdiv(n, 256)"], "block": ["256"], "smem": "0"}}]}
EOF
  printf 'extern "C" __global__ void scale(float *out, long long n) { %s }\n' "$body" >"$dir/scale.cu"
}
# publish TREE NAME VERSION: publishes a good version (quietly).
publish() {
  local d=$WORK/p-$RANDOM$RANDOM
  make_pkg "$d" "$2" "$3"
  "$TK" publish "$d" --to "$1" --key "$KEY" -q >/dev/null || fail "publish $2 $3"
  rm -rf "$d"
}
trust() { "$TK" trust add tktest "$PUB" -q; }
# tree_state TREE: a digest of everything in a tree (names, link targets, contents), to show that a
# refused command wrote nothing.
tree_state() { [ -e "$1" ] || { echo absent; return; }; (cd "$1" && find . -printf '%p %l\n' | sort && find . -type f -exec sha256sum {} + | sort) | sha256sum; }

# start_serve ROOT: tk serve on a free port; sets URL and SERVE_PID.
SERVE_PID=
start_serve() {
  : >"$WORK/serve.log"; : >"$WORK/serve.url"
  "$TK" serve --root "$1" --listen 127.0.0.1:0 >"$WORK/serve.url" 2>>"$WORK/serve.log" &
  SERVE_PID=$!; URL=
  for _ in $(seq 100); do URL=$(head -n 1 "$WORK/serve.url"); [ -n "$URL" ] && break; sleep 0.05; done
  [ -n "$URL" ] || { fail "tk serve did not start: $(cat "$WORK/serve.log")"; return 1; }
}
stop_serve() { [ -n "$SERVE_PID" ] || return 0; kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=; }
trap 'stop_serve; cleanup' EXIT

have_nvrtc() {
  make_pkg "$WORK/probe" tktest/probe 1.0.0
  "$TK" check "$WORK/probe" --arch sm_80 >/dev/null 2>&1 && return 0
  [ "${CI:-}" = true ] && { fail "NVRTC is needed in CI"; return 1; }
  skip "no NVRTC"; return 1
}

# ---- item 7: publish compiles before it signs -------------------------------------------------------

t_publish_refuses_a_kernel_that_does_not_compile() {
  have_nvrtc || return 0
  local reg=$WORK/reg7 before
  publish "$reg" tktest/cc 1.0.0
  before=$(tree_state "$reg")
  make_pkg "$WORK/bad" tktest/cc 1.1.0 'int x = ; /* not C++ */'
  expect_rc 7 "$TK" publish "$WORK/bad" --to "$reg" --key "$KEY"
  expect_out "scale.cu"; expect_out "not published"
  expect_out "HINT:"; expect_out "--no-compile"
  [ "$(tree_state "$reg")" = "$before" ] || fail "a refused publish changed the registry tree"
  # a fresh tree is not even created
  expect_rc 7 "$TK" publish "$WORK/bad" --to "$WORK/fresh7" --key "$KEY"
  [ -e "$WORK/fresh7" ] && fail "a refused publish created the registry directory"
  # the configured archs are the ones compiled: a kernel that only breaks on sm_90
  make_pkg "$WORK/arch" tktest/cc 1.2.0 '
#if __CUDA_ARCH__ >= 900
  int y = ;
#endif
'
  echo '{"archs": ["sm_80"]}' >"$TK_HOME/config.json"
  expect_rc 0 "$TK" publish "$WORK/arch" --to "$WORK/reg7b" --key "$KEY"
  echo '{"archs": ["sm_80", "sm_90"]}' >"$TK_HOME/config.json"
  expect_rc 7 "$TK" publish "$WORK/arch" --to "$WORK/reg7c" --key "$KEY"
  expect_out "sm_90"
  rm -f "$TK_HOME/config.json"
  # --no-compile opts out
  expect_rc 0 "$TK" publish "$WORK/bad" --to "$reg" --key "$KEY" --no-compile
  expect_out "not compiled"
  # a kernel whose constraints rule out sm_80 and sm_90 is compiled for its own arch
  make_pkg "$WORK/new" tktest/newarch 1.0.0 'int z = ;'
  sed -i 's/"launch"/"constraints": {"min_cc": 100}, "launch"/' "$WORK/new/kernel.json"
  expect_rc 7 "$TK" publish "$WORK/new" --to "$WORK/reg7d" --key "$KEY"
  expect_out "sm_100"
}

t_publish_without_nvrtc_says_it_did_not_compile() {
  make_pkg "$WORK/ok" tktest/nonv 1.0.0
  # a library that is not NVRTC stands for a machine without it
  TK_NVRTC=/lib/x86_64-linux-gnu/libz.so.1 expect_rc 0 "$TK" publish "$WORK/ok" --to "$WORK/reg-nonv" --key "$KEY"
  expect_out "not compiled"; expect_out "NVRTC"
  [ -L "$WORK/reg-nonv/kernels/tktest/nonv/resolve/v1" ] || fail "not published"
}

t_upload_refuses_a_kernel_that_does_not_compile() {
  have_nvrtc || return 0
  local srv=$WORK/srv7 token before
  token=$("$TK" serve token add --org tktest --root "$srv" -q) || { fail "token add"; return; }
  "$TK" serve trust add tktest "$PUB" --root "$srv" >/dev/null || { fail "serve trust add"; return; }
  start_serve "$srv" || return
  before=$(tree_state "$srv/kernels")
  make_pkg "$WORK/bad" tktest/cc 1.0.0 'int x = ;'
  TK_TOKEN=$token expect_rc 7 "$TK" publish "$WORK/bad" --registry "$URL" --key "$KEY"
  expect_out "not published"
  grep -q "PUT /api/upload" "$WORK/serve.log" && fail "the client uploaded a package that does not compile"
  [ "$(tree_state "$srv/kernels")" = "$before" ] || fail "the server's tree changed"
  make_pkg "$WORK/good" tktest/cc 1.0.0
  TK_TOKEN=$token expect_rc 0 "$TK" publish "$WORK/good" --registry "$URL" --key "$KEY"
  expect_out "published"
  stop_serve
}

# ---- item 8: yanking a major's only version -----------------------------------------------------------

# check_only_version_yanked ENDPOINT TREE: after tktest/solo 1.0.0 (the only v1) was yanked.
check_only_version_yanked() {
  export TK_ENDPOINT=$1; local tree=$2
  [ -e "$tree/kernels/tktest/solo/resolve/v1" ] && fail "branch v1 still exists"
  [ -e "$tree/kernels/tktest/solo/resolve/main" ] && fail "main still points somewhere"
  [ -e "$tree/api/kernels/tktest/solo/revision/v1" ] && fail "revision/v1 left behind"
  [ -e "$tree/api/kernels/tktest/solo/tree/v1" ] && fail "the Hub listing tree/v1 left behind"
  [ -e "$tree/api/kernels/tktest/solo/tree/main" ] && fail "the Hub listing tree/main left behind"
  python3 - "$tree" <<'EOF' || fail "refs or index still name a head"
import json, sys
t = sys.argv[1]
refs = json.load(open(f"{t}/api/kernels/tktest/solo/refs"))
assert refs["branches"] == [], refs
idx = json.load(open(f"{t}/index.json"))
e = idx["packages"]["tktest/solo"]
assert e["main"] is None and e["latest_major"] == 0, e
EOF
  # the commit itself stays, with its info document: locks and exact pins still work
  local c; c=$(cat "$WORK/solo.commit")
  [ -f "$tree/kernels/tktest/solo/resolve/$c/manifest.json" ] || fail "the yanked commit's files are gone"
  trust
  expect_rc 3 "$TK" get tktest/solo
  expect_out "1.0.0 was yanked by its publisher (first release broken)"
  expect_out "tk get tktest/solo@1.0.0"
  expect_rc 3 "$TK" get tktest/solo@1
  expect_out "was yanked"; expect_out "first release broken"
  expect_rc 0 "$TK" get tktest/solo@1.0.0
  expect_out "warning: tktest/solo 1.0.0 was yanked by its publisher (first release broken)"
  expect_out "installed tktest/solo 1.0.0"
  expect_rc 0 "$TK" versions tktest/solo
  expect_out "yanked (first release broken)"
  # the commit prefix that tk get printed works too
  "$TK" remove -q tktest/solo
  expect_rc 0 "$TK" get "tktest/solo@${c:0:12}"
  expect_out "installed tktest/solo 1.0.0"
  unset TK_ENDPOINT
}

t_yank_only_version_static() {
  local reg=$WORK/reg8
  publish "$reg" tktest/solo 1.0.0
  readlink "$reg/kernels/tktest/solo/resolve/v1" >"$WORK/solo.commit"
  expect_rc 0 "$TK" yank tktest/solo@1.0.0 --to "$reg" --key "$KEY" --reason "first release broken"
  [ "$(echo "$OUT" | grep -c .)" = 1 ] || fail "yank printed more than one line: $OUT"
  expect_out "yanked tktest/solo@1.0.0"
  check_only_version_yanked "file://$reg" "$reg"
  # a fixed release makes the branch again
  publish "$reg" tktest/solo 1.0.1
  [ -L "$reg/kernels/tktest/solo/resolve/v1" ] || fail "publishing 1.0.1 did not recreate v1"
  TK_ENDPOINT=file://$reg expect_rc 0 "$TK" get tktest/solo
  expect_out "installed tktest/solo 1.0.1"
}

t_yank_only_version_of_one_major_keeps_the_others() {
  local reg=$WORK/reg8b
  publish "$reg" tktest/two 1.0.0
  publish "$reg" tktest/two 2.0.0
  expect_rc 0 "$TK" yank tktest/two@2.0.0 --to "$reg" --key "$KEY" --reason "oops"
  [ "$(readlink "$reg/kernels/tktest/two/resolve/main")" = "$(readlink "$reg/kernels/tktest/two/resolve/v1")" ] ||
    fail "main does not move to v1's head"
  export TK_ENDPOINT=file://$reg; trust
  expect_rc 0 "$TK" get tktest/two
  expect_out "installed tktest/two 1.0.0"
  expect_rc 3 "$TK" get tktest/two@2
  expect_out "2.0.0 was yanked by its publisher (oops)"
}

t_yank_only_version_serve() {
  local srv=$WORK/srv8 token
  token=$("$TK" serve token add --org tktest --root "$srv" -q) || { fail "token add"; return; }
  "$TK" serve trust add tktest "$PUB" --root "$srv" >/dev/null || { fail "serve trust add"; return; }
  start_serve "$srv" || return
  make_pkg "$WORK/solo" tktest/solo 1.0.0
  TK_TOKEN=$token "$TK" publish "$WORK/solo" --registry "$URL" --key "$KEY" -q >/dev/null || { fail "upload"; return; }
  readlink "$srv/kernels/tktest/solo/resolve/v1" >"$WORK/solo.commit"
  TK_TOKEN=$token expect_rc 0 "$TK" yank tktest/solo@1.0.0 --registry "$URL" --key "$KEY" --reason "first release broken"
  [ "$(echo "$OUT" | grep -c .)" = 1 ] || fail "yank printed more than one line: $OUT"
  check_only_version_yanked "$URL" "$srv"
  # the server's own answers: no refs, the repository page still there
  expect_rc 0 curl -fsS "$URL/api/kernels/tktest/solo/refs"
  expect_out '"branches": []'
  expect_rc 0 curl -fsS "$URL/"
  expect_rc 0 curl -fsS "$URL/?q=solo"
  stop_serve
}

# ---- item 10: tk info on a name that is not installed ---------------------------------------------------

t_info_asks_the_registry() {
  local reg=$WORK/reg10
  publish "$reg" tktest/activation 1.0.0
  publish "$reg" tktest/casted 1.0.0
  export TK_ENDPOINT=file://$reg; trust
  expect_rc 3 "$TK" info tktest/activaton
  expect_out "not found"; expect_out "did you mean 'tktest/activation'?"
  expect_no_out "run 'tk get"
  # nothing close: no suggestion (it once suggested casted for nope)
  expect_rc 3 "$TK" info tktest/nope
  expect_no_out "did you mean"
  expect_rc 3 "$TK" get tktest/nope
  expect_no_out "did you mean"; expect_no_out "casted"
  # a package in the registry, not installed: what the registry has
  expect_rc 0 "$TK" info tktest/casted
  expect_out "not installed; from the registry"
  # --json: the error object
  OUT=$("$TK" --json info tktest/activaton 2>/dev/null)
  expect_out '"status": "not_found"'; expect_out "did you mean"
  # offline: the local answer
  TK_OFFLINE=1 expect_rc 3 "$TK" info tktest/activaton
  expect_out "not installed"
}

# ---- item 11: commit prefixes ------------------------------------------------------------------------

t_commit_prefix_as_ref() {
  local reg=$WORK/reg11 c1 c2
  publish "$reg" tktest/pfx 1.0.0
  c1=$(readlink "$reg/kernels/tktest/pfx/resolve/v1")
  publish "$reg" tktest/pfx 1.1.0
  c2=$(readlink "$reg/kernels/tktest/pfx/resolve/v1")
  export TK_ENDPOINT=file://$reg; trust
  # the 12 hex that tk get and tk list print
  expect_rc 0 "$TK" get "tktest/pfx@${c1:0:12}"
  expect_out "installed tktest/pfx 1.0.0 (v1, commit ${c1:0:12})"
  expect_rc 0 "$TK" info "tktest/pfx@${c1:0:7}"
  expect_out "commit     $c1"
  "$TK" remove -q tktest/pfx
  expect_rc 0 "$TK" get "tktest/pfx@${c2:0:7}"
  expect_out "installed tktest/pfx 1.1.0"
  # too short, or no such commit
  expect_rc 2 "$TK" get "tktest/pfx@abc12"      # hex, but too short to be a commit
  expect_out "at least 7"
  expect_rc 3 "$TK" get "tktest/pfx@0000000"
  expect_out "no commit starting with 0000000"
  # offline: the installed commit resolves from its prefix
  TK_OFFLINE=1 expect_rc 0 "$TK" get "tktest/pfx@${c2:0:9}"
}

t_commit_prefix_ambiguous() {
  # Two versions whose commits share their first 7 hex digits. Commit ids are sha256-derived
  # (docs/registry.md), so the test makes a pair: it pads each version's signature file with JSON
  # whitespace (still a valid signature file) until the two ids collide on 7 hex (a birthday search
  # over 2 x 65536 paddings), then moves each version to the id its files make (recommit, lib.sh).
  local reg=$WORK/reg11b
  publish "$reg" tktest/amb 1.0.0
  publish "$reg" tktest/amb 2.0.0
  python3 - "$reg/kernels/tktest/amb/resolve" <<'PYEOF' || { fail "no colliding pair found"; return; }
import hashlib, itertools, json, sys
res = sys.argv[1]
ws = [" ", "\n", "\t", "\r"]
sha = lambda b: hashlib.sha256(b).hexdigest()
def variants(branch):
    import os
    c = os.readlink(f"{res}/{branch}")
    m = open(f"{res}/{c}/manifest.json", "rb").read()
    sig = open(f"{res}/{c}/manifest.json.sig", "rb").read().rstrip(b"\n")
    a = json.loads(m)["archive"]
    out = {}
    for pad in itertools.product(ws, repeat=8):
        s = sig + "".join(pad).encode() + b"\n"
        text = f"tk-commit-1\n{'0' * 40}\nmanifest.json {sha(m)}\nmanifest.json.sig {sha(s)}\n{a['path']} {a['sha256']}\n"
        out.setdefault(sha(text.encode())[:7], s)
    return c, out
c1, v1 = variants("v1")
c2, v2 = variants("v2")
common = next((p for p in v1 if p in v2), None)
if common is None:
    sys.exit(1)
open(f"{res}/{c1}/manifest.json.sig", "wb").write(v1[common])
open(f"{res}/{c2}/manifest.json.sig", "wb").write(v2[common])
PYEOF
  local a b
  a=$(recommit "$reg" tktest/amb v1); b=$(recommit "$reg" tktest/amb v2)
  [ "${a:0:7}" = "${b:0:7}" ] || { fail "the commits do not collide: $a $b"; return; }
  export TK_ENDPOINT=file://$reg; trust
  expect_rc 0 "$TK" get tktest/amb@1.0.0    # the moved commits are valid commits
  expect_rc 2 "$TK" get "tktest/amb@${a:0:7}"
  expect_out "ambiguous"; expect_out "${a:0:12} (1.0.0)"; expect_out "${b:0:12} (2.0.0)"
  expect_out "HINT:"
  # one more digit that differs picks one (they differ somewhere within 40)
  local n=7; while [ "${a:$n:1}" = "${b:$n:1}" ]; do n=$((n + 1)); done
  expect_rc 0 "$TK" get "tktest/amb@${b:0:$((n + 1))}"
  expect_out "installed tktest/amb 2.0.0"
  # the installed ones are ambiguous locally too
  TK_OFFLINE=1 expect_rc 2 "$TK" info "tktest/amb@${a:0:7}"
  expect_out "ambiguous"
}

# ---- item 12: several registries ------------------------------------------------------------------------

t_outdated_and_update_ask_each_packages_registry() {
  command -v nginx >/dev/null || { skip "no nginx"; return; }
  local a=$WORK/regA b=$WORK/regB
  # A (over HTTP, nginx, first in the config): tktest/m 1.0.0 1.1.0 1.2.0, tktest/both 1.0.0.
  # B (file://): tktest/m 2.0.0 2.1.0 (no v1), tktest/both 1.0.0 1.5.0, tktest/y 1.0.0 1.1.0 and
  # 1.2.0 (yanked).
  for v in 1.0.0 1.1.0 1.2.0; do publish "$a" tktest/m $v; done
  publish "$a" tktest/both 1.0.0
  for v in 2.0.0 2.1.0; do publish "$b" tktest/m $v; done
  for v in 1.0.0 1.5.0; do publish "$b" tktest/both $v; done
  for v in 1.0.0 1.1.0 1.2.0; do publish "$b" tktest/y $v; done
  "$TK" yank tktest/y@1.2.0 --to "$b" --key "$KEY" -q >/dev/null || fail "yank"
  start_nginx "$a" || { fail "nginx"; return; }
  trust
  TK_ENDPOINT=$NGINX_URL expect_rc 0 "$TK" get tktest/m@1.1.0
  TK_ENDPOINT=file://$b expect_rc 0 "$TK" get tktest/m@2.0.0
  TK_ENDPOINT=file://$b expect_rc 0 "$TK" get tktest/both@1.5.0
  TK_ENDPOINT=file://$b expect_rc 0 "$TK" get tktest/y@1.2.0     # yanked, named exactly
  echo "{\"registries\": [\"$NGINX_URL\", \"file://$b\"]}" >"$TK_HOME/config.json"
  expect_rc 0 "$TK" list --outdated
  expect_out "tktest/m                                 1.1.0      1.2.0"
  expect_out "tktest/m                                 2.0.0      2.1.0"
  # A's tktest/both (1.0.0) and B's tktest/y head (1.1.0) are older than what is installed
  expect_no_out "tktest/both"; expect_no_out "tktest/y"
  expect_rc 0 "$TK" --json list --outdated
  echo "$OUT" | python3 -c '
import json, sys
d = json.load(sys.stdin)
got = sorted((x["name"], x["major"], x["installed"], x["latest"]) for x in d)
assert got == [("tktest/m", 1, "1.1.0", "1.2.0"), ("tktest/m", 2, "2.0.0", "2.1.0")], got
' || fail "list --outdated --json: $OUT"
  expect_rc 0 "$TK" update
  expect_out "tktest/m: 1.1.0 -> 1.2.0"; expect_out "tktest/m: 2.0.0 -> 2.1.0"
  expect_out "tktest/both: 1.5.0 is the newest of v1"
  expect_out "tktest/y: 1.2.0"; expect_no_out "tktest/y: 1.2.0 -> "
  expect_rc 0 "$TK" list
  expect_out "tktest/both                              1.5.0"
  expect_out "tktest/y                                 1.2.0"
  # each came from its own registry
  expect_rc 0 "$TK" --json list
  echo "$OUT" | python3 -c '
import json, sys
r = {(x["name"], x["major"]): x["registry"] for x in json.load(sys.stdin)}
assert r[("tktest/m", 1)].startswith("http://"), r
assert r[("tktest/m", 2)].startswith("file://") and r[("tktest/both", 1)].startswith("file://"), r
' || fail "registries: $OUT"
  stop_nginx
}

run_tests
