#!/usr/bin/env bash
# The package path end to end through the real tk binary: publish to a static tree, serve it with
# nginx on 127.0.0.1 (and as file://), get, and every bad-input case of the package-path issue.
. "$(dirname "$0")/lib.sh"

KEY=$WORK/pub.key
"$TK" keygen "$KEY" >/dev/null || { echo "keygen failed"; exit 1; }
PUB=$(cat "$KEY.pub")

# make_pkg DIR VERSION [EXTRA_BYTES]: a small package "tktest/demo".
make_pkg() {
  local dir=$1 ver=$2 extra=${3:-0}
  rm -rf "$dir"; mkdir -p "$dir/include"
  cat >"$dir/kernel.json" <<EOF
{"name": "tktest/demo", "version": "$ver", "license": "MIT", "description": "test package",
 "kernels": [{"name": "scale_f32", "op": "scale", "source": "scale.cu", "symbol": "scale",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}, {"name": "n", "type": "i64", "value": "numel(out)"}],
   "launch": {"grid": ["cdiv(n, 256)"], "block": ["256"], "smem": "0"}}]}
EOF
  printf 'extern "C" __global__ void scale(float *out, long long n) { /* %s */ }\n' "$ver" >"$dir/scale.cu"
  printf '#pragma once\n' >"$dir/include/util.cuh"
  echo "demo $ver" >"$dir/README.md"
  [ "$extra" -gt 0 ] && head -c "$extra" /dev/urandom >"$dir/blob.bin"
  return 0
}

REG=$WORK/reg
make_pkg "$WORK/pkg" 1.0.0
"$TK" publish "$WORK/pkg" --to "$REG" --key "$KEY" -q >/dev/null || { echo "publish failed"; exit 1; }
DEMO_DIR=$REG/kernels/tktest/demo/resolve

use_file() { export TK_ENDPOINT=file://$1; }

t_get_file_endpoint() {
  use_file "$REG"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "not trusted for org 'tktest'"
  expect_out "tk trust add tktest $PUB"
  expect_rc 0 "$TK" trust add tktest "$PUB"
  expect_rc 0 "$TK" get tktest/demo
  expect_out "installed tktest/demo 1.0.0"
  expect_rc 0 "$TK" verify tktest/demo
  expect_rc 0 "$TK" get tktest/demo
  expect_out "up to date"
}

t_get_nginx_request_count() {
  start_nginx "$REG" || { fail "nginx"; return; }
  export TK_ENDPOINT=$NGINX_URL
  "$TK" trust add tktest "$PUB" -q
  local before; before=$(nginx_requests)
  expect_rc 0 "$TK" get tktest/demo@1
  local n=$(( $(nginx_requests) - before ))
  # refs + manifest + signature + the commit's info document (its parent) + archive
  [ "$n" -eq 5 ] || fail "get made $n requests, want 5 (refs, then at most four)"
  before=$(nginx_requests)
  expect_rc 0 "$TK" get tktest/demo
  n=$(( $(nginx_requests) - before ))
  [ "$n" -eq 1 ] || fail "a get of an installed package made $n requests, want 1 (refs)"
  expect_rc 0 "$TK" --json info tktest/demo
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["name"]=="tktest/demo" and d["major"]==1 and len(d["files"])==3, d' \
    || fail "info --json is not the expected JSON"
  expect_rc 0 "$TK" list --json
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d)==1 and d[0]["version"]=="1.0.0"' \
    || fail "list --json"
  stop_nginx
}

t_trust_flag_and_list() {
  use_file "$REG"
  expect_rc 0 "$TK" get --trust tktest/demo
  expect_out "trusting new signer SHA256:"
  expect_rc 0 "$TK" trust list --json
  expect_out "$PUB"
  local id; id=$(echo "$OUT" | python3 -c 'import json,sys; print([k["keyid"] for k in json.load(sys.stdin) if k["org"]=="tktest"][0])')
  expect_rc 0 "$TK" trust remove tktest "$id"
  expect_rc 0 "$TK" remove tktest/demo
  expect_rc 5 "$TK" get tktest/demo
}

# --trust is trust on first use: an org that has a key never gains a second one from a download.
t_trust_flag_never_adds_a_second_key() {
  "$TK" keygen "$WORK/evil.key" >/dev/null; local evil; evil=$(cat "$WORK/evil.key.pub")
  local evilreg=$WORK/evilreg; rm -rf "$evilreg"
  make_pkg "$WORK/evilpkg" 1.0.0
  "$TK" publish "$WORK/evilpkg" --to "$evilreg" --key "$WORK/evil.key" -q >/dev/null || { fail "publish"; return; }
  # first contact with --trust, but the package is refused (its archive does not match): no key is
  # left trusted, since the key is recorded with the install
  copy_reg; echo junk >>"$BAD/source.tar.gz"
  expect_rc 5 "$TK" get --trust tktest/demo
  expect_out "does not match"
  expect_rc 0 "$TK" --json trust list
  [ "$(echo "$OUT" | python3 -c 'import json,sys; print(len([k for k in json.load(sys.stdin) if k["org"]=="tktest"]))')" = 0 ] \
    || fail "a refused first-contact package left its key trusted: $OUT"
  "$TK" trust add tktest "$PUB" -q
  local pinned; pinned=$("$TK" --json trust list | python3 -c 'import json,sys; print([k["keyid"] for k in json.load(sys.stdin) if k["org"]=="tktest"][0])')
  local evilid; evilid=$(python3 -c "import hashlib; print('SHA256:'+hashlib.sha256(bytes.fromhex('${evil#ed25519:}')).hexdigest()[:32])")
  use_file "$evilreg"
  for flags in "" "--trust"; do
    expect_rc 5 "$TK" get $flags tktest/demo
    expect_out "pinned to key $pinned"
    expect_out "$evilid"
    expect_out "tk trust add tktest $evil"
    expect_no_out "trusting new signer"
  done
  expect_rc 0 "$TK" --json trust list
  [ "$(echo "$OUT" | python3 -c 'import json,sys; print(len([k for k in json.load(sys.stdin) if k["org"]=="tktest"]))')" = 1 ] \
    || fail "the trust store gained a key for tktest: $OUT"
  expect_rc 0 "$TK" list --json
  [ "$OUT" = "[]" ] || fail "a package signed by a stranger was installed: $OUT"
  # the build's own org is pinned by the built-in key, even with an empty trust store
  local org; org=$("$TK" --json trust list | python3 -c 'import json,sys; print([k["org"] for k in json.load(sys.stdin) if k.get("builtin")][0])')
  make_pkg "$WORK/evilpkg2" 1.0.0; sed -i "s#tktest/demo#$org/demo#" "$WORK/evilpkg2/kernel.json"
  "$TK" publish "$WORK/evilpkg2" --to "$evilreg" --key "$WORK/evil.key" -q >/dev/null || { fail "publish"; return; }
  expect_rc 5 "$TK" get --trust "$org/demo"
  expect_out "org '$org' is pinned to key"
  # the rotation the README describes still works: 'tk trust add' the new key, then get
  expect_rc 0 "$TK" trust add tktest "$evil"
  expect_rc 0 "$TK" get tktest/demo
}

t_unknown_package_and_version() {
  use_file "$REG"
  "$TK" trust add tktest "$PUB" -q
  expect_rc 3 "$TK" get tktest/dem
  expect_out "did you mean 'tktest/demo'"
  expect_rc 3 "$TK" get tktest/demo@7
  expect_out "available: v1"
  expect_rc 3 "$TK" get tktest/demo@0123456789012345678901234567890123456789
  expect_rc 2 "$TK" get 'not a name'
  expect_rc 2 "$TK" get tktest/demo@latest
}

# copy_reg: a private copy of the registry to tamper with.
copy_reg() { rm -rf "$WORK/bad"; cp -a "$REG" "$WORK/bad"; use_file "$WORK/bad"; BAD=$WORK/bad/kernels/tktest/demo/resolve/$(readlink "$WORK/bad/kernels/tktest/demo/resolve/v1"); }
# recommit_bad: after editing $BAD's files, moves them to the commit id they make (as a hostile
# registry would), so the test reaches the check it is about rather than the commit-id check.
recommit_bad() { recommit "$WORK/bad" tktest/demo v1 >/dev/null; BAD=$WORK/bad/kernels/tktest/demo/resolve/$(readlink "$WORK/bad/kernels/tktest/demo/resolve/v1"); }

t_tampered_manifest() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  sed -i 's/test package/evil package/' "$BAD/manifest.json"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "signature does not match"
  expect_rc 0 "$TK" list
  expect_no_out "tktest/demo"
}

t_missing_and_garbage_signature() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  rm "$BAD/manifest.json.sig"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "no signature"
  echo 'not json' >"$BAD/manifest.json.sig"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "not valid JSON"
}

t_malformed_manifest_validly_signed() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  # Signed by the trusted key, but broken: the signature passes and the parser must refuse it.
  printf '{"format_version": 1, "name": "tktest/demo", "version": "1.0.0", "files": 3}' >"$BAD/manifest.json"
  sign_file "$KEY" "$BAD/manifest.json"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "manifest"
  printf '{"format_version": 99}' >"$BAD/manifest.json"; sign_file "$KEY" "$BAD/manifest.json"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "upgrade tk"
  printf '{"format_version": 1,' >"$BAD/manifest.json"; sign_file "$KEY" "$BAD/manifest.json"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "not valid JSON"
}

t_bad_launch_rule_refused_at_install() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  sed -i 's/cdiv(n, 256)/cdiv(n, 256) + bogus.shape[0]/' "$BAD/manifest.json"
  sign_file "$KEY" "$BAD/manifest.json"; recommit_bad
  expect_rc 5 "$TK" get tktest/demo
  expect_out "launch.grid[0]"
  expect_out "bogus"
}

# A signed manifest that needs a newer device toolkit (<tk/device.cuh>) than this tk has is refused at
# install with the versions and a hint, and nothing is installed.
t_newer_device_toolkit_refused_at_install() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); m["device_toolkit"] = 99; json.dump(m, open(sys.argv[1], "w"))' \
    "$BAD/manifest.json"
  sign_file "$KEY" "$BAD/manifest.json"; recommit_bad
  expect_rc 5 "$TK" get tktest/demo
  expect_out "needs device toolkit 99; this tk has <tk/device.cuh> version 1"
  expect_out "HINT: upgrade tk"
  expect_rc 0 "$TK" list
  expect_no_out "tktest/demo"
}

# Workspace and optional params are checked at install too: a workspace needs a size, no expression
# may read a workspace (it is a pointer), and only tensors can be optional.
t_bad_workspace_and_optional_params_refused() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  local orig=$WORK/manifest.orig; cp "$BAD/manifest.json" "$orig"
  for kind in nosize usedinrule optscalar; do
    python3 - "$orig" "$BAD/manifest.json" "$kind" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); k = m["kernels"][0]; kind = sys.argv[3]
if kind == "nosize":
    k["params"].append({"name": "ws", "type": "workspace"})
elif kind == "usedinrule":
    k["params"].append({"name": "ws", "type": "workspace", "value": "64"})
    k["launch"]["grid"][0] = k["launch"]["grid"][0] + " + ws"
else:
    k["params"].append({"name": "flag", "type": "i64", "optional": True})
json.dump(m, open(sys.argv[2], "w"))
EOF
    sign_file "$KEY" "$BAD/manifest.json"; recommit_bad
    expect_rc 5 "$TK" get tktest/demo
    case $kind in
      nosize) expect_out "needs a 'value'" ;;
      usedinrule) expect_out "launch.grid[0]" ;;
      *) expect_out "only tensors can be optional" ;;
    esac
  done
}

t_wrong_archive_digest() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  make_pkg "$WORK/pkg2" 1.0.0
  echo "// tampered" >>"$WORK/pkg2/scale.cu"   # other content, still a kernel that compiles
  "$TK" publish "$WORK/pkg2" --to "$WORK/other" --key "$KEY" -q >/dev/null
  cp "$WORK/other/kernels/tktest/demo/resolve/main/source.tar.gz" "$BAD/source.tar.gz"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "does not match"
  # nothing partial was left installed or in the store
  [ -z "$(find "$TK_HOME/store/objects" -type f)" ] || fail "objects left in the store"
}

t_hostile_archive_validly_signed() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  # An archive whose entry escapes with "..", listed with its real digest in a re-signed manifest.
  python3 - "$BAD" <<'EOF'
import hashlib, io, json, sys, tarfile
d = sys.argv[1]
data = b"owned\n"
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as t:
    ti = tarfile.TarInfo("../escape.cu"); ti.size = len(data); t.addfile(ti, io.BytesIO(data))
arc = buf.getvalue()
open(d + "/source.tar.gz", "wb").write(arc)
m = json.load(open(d + "/manifest.json"))
m["archive"]["sha256"] = hashlib.sha256(arc).hexdigest(); m["archive"]["size"] = len(arc)
open(d + "/manifest.json", "w").write(json.dumps(m, indent=2) + "\n")
EOF
  sign_file "$KEY" "$BAD/manifest.json"; recommit_bad
  expect_rc 5 "$TK" get tktest/demo
  expect_out "escape.cu"
  [ ! -e "$TK_HOME/store/escape.cu" ] && [ ! -e "$TK_HOME/escape.cu" ] || fail "archive escaped"
}

# A commit id names its content: a mirror that serves 1.0.0's signed files under 1.1.0's commit is
# refused, by commit and by branch, on a machine that never saw 1.1.0.
t_commit_holds_what_it_names() {
  "$TK" trust add tktest "$PUB" -q
  local r=$WORK/swap; rm -rf "$r"; cp -a "$REG" "$r"
  make_pkg "$WORK/pkgsw" 1.1.0
  local c0 c1; c0=$(readlink "$r/kernels/tktest/demo/resolve/v1")
  c1=$("$TK" publish "$WORK/pkgsw" --to "$r" --key "$KEY" -q) || { fail "publish"; return; }
  rm "$r/kernels/tktest/demo/resolve/$c1"/*
  cp "$r/kernels/tktest/demo/resolve/$c0"/* "$r/kernels/tktest/demo/resolve/$c1/"
  use_file "$r"
  expect_rc 5 "$TK" get "tktest/demo@$c1"
  expect_out "commit $c1 does not hold what it names"
  expect_out "tktest/demo 1.0.0"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "does not hold what it names"
  # a forged parent in the info document does not help: the id is a hash over it
  python3 - "$r/api/kernels/tktest/demo/revision/$c1" "$c0" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1])); d["tk"]["parent"] = sys.argv[2]; json.dump(d, open(sys.argv[1], "w"))
EOF
  expect_rc 5 "$TK" get "tktest/demo@$c1"
  expect_out "does not hold what it names"
  # an info document without the parent (an older tk's tree) is refused with a hint, not trusted
  python3 - "$r/api/kernels/tktest/demo/revision/$c1" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1])); del d["tk"]["parent"]; json.dump(d, open(sys.argv[1], "w"))
EOF
  expect_rc 5 "$TK" get "tktest/demo@$c1"
  expect_out "does not give the commit's parent"
  expect_out "HINT"
  rm "$r/api/kernels/tktest/demo/revision/$c1"
  expect_rc 5 "$TK" get "tktest/demo@$c1"
  expect_out "no info document for commit $c1"
  expect_rc 0 "$TK" list --json
  [ "$OUT" = "[]" ] || fail "something was installed: $OUT"
  # the honest commits still install, each as the version it names
  expect_rc 0 "$TK" get "tktest/demo@$c0"
  expect_out "1.0.0"
}

# A tree written before commit ids were checked has no parents in its info documents: its commits
# are refused until a publish (identical content: a no-op) records them, recomputed from the ids.
t_old_tree_gets_parents_on_publish() {
  "$TK" trust add tktest "$PUB" -q
  local r=$WORK/oldtree; rm -rf "$r"; cp -a "$REG" "$r"
  make_pkg "$WORK/pkgold" 1.0.1
  local c0 c1; c0=$(readlink "$r/kernels/tktest/demo/resolve/v1")
  c1=$("$TK" publish "$WORK/pkgold" --to "$r" --key "$KEY" -q) || { fail "publish"; return; }
  python3 - "$r/api/kernels/tktest/demo" <<'EOF'
import json, os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        p = os.path.join(root, f); d = json.load(open(p))
        if isinstance(d, dict) and "tk" in d: d["tk"].pop("parent", None); json.dump(d, open(p, "w"))
EOF
  use_file "$r"
  expect_rc 5 "$TK" get "tktest/demo@$c0"
  expect_out "does not give the commit's parent"
  expect_rc 0 "$TK" publish "$WORK/pkgold" --to "$r" --key "$KEY"
  expect_out "already published"
  [ "$(python3 -c "import json; print(json.load(open('$r/api/kernels/tktest/demo/revision/$c1'))['tk']['parent'])")" = "$c0" ] \
    || fail "the parent of $c1 was not recorded as $c0"
  expect_rc 0 "$TK" get "tktest/demo@$c0"
  expect_out "1.0.0"
  expect_rc 0 "$TK" get tktest/demo
  expect_out "1.0.1"
}

t_rollback_refused() {
  "$TK" trust add tktest "$PUB" -q
  rm -rf "$WORK/newer"; cp -a "$REG" "$WORK/newer"
  make_pkg "$WORK/pkg3" 1.1.0
  "$TK" publish "$WORK/pkg3" --to "$WORK/newer" --key "$KEY" -q >/dev/null
  use_file "$WORK/newer"
  expect_rc 0 "$TK" get tktest/demo
  expect_out "1.1.0"
  use_file "$REG"   # a stale (or malicious) mirror still offering 1.0.0
  expect_rc 5 "$TK" get tktest/demo
  expect_out "rollback refused"
  expect_rc 0 "$TK" info tktest/demo
  expect_out "1.1.0"
}

t_yank_moves_branch_back_and_keeps_locks() {
  "$TK" trust add tktest "$PUB" -q
  local r=$WORK/yk; rm -rf "$r" "$WORK/yk-pre" "$WORK/yk-forged"; cp -a "$REG" "$r"
  make_pkg "$WORK/y2" 1.0.1; "$TK" publish "$WORK/y2" --to "$r" --key "$KEY" -q >/dev/null
  cp -a "$r" "$WORK/yk-pre"
  use_file "$r"
  expect_rc 0 "$TK" get tktest/demo
  expect_out "1.0.1"
  (cd "$WORK" && "$TK" lock -o "$WORK/yk.lock" >/dev/null) || fail "lock"
  expect_rc 0 "$TK" yank tktest/demo@1.0.1 --to "$r" --key "$KEY" --reason "wrong results on sm_90"
  [ "$(readlink "$r/kernels/tktest/demo/resolve/v1")" = "$(readlink "$REG/kernels/tktest/demo/resolve/v1")" ] \
    || fail "branch v1 did not move back to 1.0.0"
  grep -q "$(readlink "$REG/kernels/tktest/demo/resolve/v1")" "$r/api/kernels/tktest/demo/refs" || fail "refs not rewritten"
  expect_rc 0 "$TK" yank tktest/demo@1.0.1 --to "$r" --key "$KEY"   # again: nothing changes
  # this machine saw 1.0.1; it accepts 1.0.0 because the publisher's key signed the yank
  expect_rc 0 "$TK" get tktest/demo
  expect_out "yanked by its publisher (wrong results on sm_90)"
  expect_out "1.0.0"
  # the lock that pins the yanked commit still installs it
  "$TK" remove -q tktest/demo
  expect_rc 0 "$TK" get --locked "$WORK/yk.lock"
  expect_out "1.0.1"
  # the last version of a major can be yanked too (its branch goes: registry_ux.sh), a yanked
  # version is never published again, and a missing version is a clear error
  expect_rc 0 "$TK" yank tktest/demo@1.0.0 --to "$r" --key "$KEY"
  expect_out "branch v1 removed"
  make_pkg "$WORK/y3" 1.0.1; echo "// again" >>"$WORK/y3/scale.cu"
  expect_rc 5 "$TK" publish "$WORK/y3" --to "$r" --key "$KEY"
  expect_out "was yanked"
  expect_rc 3 "$TK" yank tktest/demo@1.0.7 --to "$r" --key "$KEY"
  expect_out "no version 1.0.7"
  expect_rc 2 "$TK" yank tktest/demo --to "$r" --key "$KEY"
  # a yank signed by a key nobody trusts does not excuse a rollback on a machine that saw 1.0.1
  "$TK" keygen "$WORK/stranger.key" >/dev/null
  cp -a "$WORK/yk-pre" "$WORK/yk-forged"
  "$TK" -q yank tktest/demo@1.0.1 --to "$WORK/yk-forged" --key "$WORK/stranger.key" >/dev/null || fail "forged yank"
  export TK_HOME=$WORK/home-b; "$TK" trust add tktest "$PUB" -q
  use_file "$WORK/yk-pre"; expect_rc 0 "$TK" get tktest/demo
  use_file "$WORK/yk-forged"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "rollback refused"
  # --trust changes nothing: a yank statement never adds a key, so the stranger's yank excuses nothing
  expect_rc 5 "$TK" get --trust tktest/demo
  expect_out "rollback refused"
  expect_no_out "trusting new signer"
  expect_rc 0 "$TK" --json trust list
  [ "$(echo "$OUT" | python3 -c 'import json,sys; print(len([k for k in json.load(sys.stdin) if k["org"]=="tktest"]))')" = 1 ] \
    || fail "a stranger's yank added a key: $OUT"
  expect_rc 0 "$TK" info tktest/demo
  expect_out "1.0.1"
}

t_publish_rules_and_history() {
  local r=$WORK/hist; rm -rf "$r"
  make_pkg "$WORK/p" 1.0.0
  local c1 c1b c2
  c1=$("$TK" publish "$WORK/p" --to "$r" --key "$KEY" -q)
  c1b=$("$TK" publish "$WORK/p" --to "$r" --key "$KEY" -q)
  [ "$c1" = "$c1b" ] || fail "republishing identical content made a new commit"
  echo "// change" >>"$WORK/p/scale.cu"
  expect_rc 5 "$TK" publish "$WORK/p" --to "$r" --key "$KEY"
  expect_out "not newer"
  sed -i 's/"1.0.0"/"1.0.1"/' "$WORK/p/kernel.json"
  c2=$("$TK" publish "$WORK/p" --to "$r" --key "$KEY" -q)
  [ "$c2" != "$c1" ] || fail "new version, same commit"
  [ "$(readlink "$r/kernels/tktest/demo/resolve/v1")" = "$c2" ] || fail "branch v1 not moved"
  [ -f "$r/kernels/tktest/demo/resolve/$c1/manifest.json" ] || fail "history lost"
  python3 -c "import json; d=json.load(open('$r/api/kernels/tktest/demo/refs')); assert {b['name'] for b in d['branches']}=={'v1','main'}" || fail "refs"
  "$TK" trust add tktest "$PUB" -q
  use_file "$r"
  expect_rc 0 "$TK" get "tktest/demo@$c1"
  expect_out "1.0.0"
  # major 2 on its own branch; the default is the highest major
  sed -i 's/"1.0.1"/"2.0.0"/' "$WORK/p/kernel.json"
  "$TK" publish "$WORK/p" --to "$r" --key "$KEY" -q >/dev/null
  expect_rc 0 "$TK" get tktest/demo
  expect_out "using v2, the highest major"
  expect_rc 0 "$TK" list
  expect_out "v1"
  expect_out "v2"
}

t_offline() {
  use_file "$REG"; "$TK" trust add tktest "$PUB" -q
  TK_OFFLINE=1 expect_rc 4 "$TK" get tktest/demo
  expect_out "offline"
  expect_rc 0 "$TK" get tktest/demo
  TK_ENDPOINT=http://127.0.0.1:9 expect_rc 0 "$TK" get --offline tktest/demo
  expect_out "up to date"
}

t_lock_and_locked() {
  use_file "$REG"; "$TK" trust add tktest "$PUB" -q
  "$TK" get -q tktest/demo >/dev/null
  (cd "$WORK" && expect_rc 0 "$TK" lock -o "$WORK/tk.lock")
  expect_rc 0 "$TK" remove tktest/demo
  expect_rc 0 "$TK" get --locked "$WORK/tk.lock"
  expect_out "installed tktest/demo 1.0.0"
  sed -i 's/"manifest_sha256": "\(.\)/"manifest_sha256": "0/' "$WORK/tk.lock"
  expect_rc 0 "$TK" remove tktest/demo
  expect_rc 5 "$TK" get --locked "$WORK/tk.lock"
  expect_out "lock file pins"
}

t_verify_detects_tampering() {
  use_file "$REG"; "$TK" trust add tktest "$PUB" -q
  "$TK" get -q tktest/demo >/dev/null
  local f; f=$(find "$TK_HOME/store/objects" -type f | head -n 1)
  chmod u+w "$f"; echo x >>"$f"
  expect_rc 5 "$TK" verify
  expect_out "failed verification"
  expect_rc 0 "$TK" get --force tktest/demo
  expect_rc 0 "$TK" verify
}

# A symlink planted at each path tk writes under its home, pointing outside it: tk refuses the link,
# naming it, and nothing outside the home changes (files, sizes, times, modes and contents checked).
t_planted_symlinks_never_followed() {
  use_file "$REG"
  local out=$WORK/outside m asha fsha i=0
  rm -rf "$out"; mkdir -p "$out/dir"
  m=$DEMO_DIR/$(readlink "$DEMO_DIR/v1")/manifest.json
  asha=$(python3 -c "import json; print(json.load(open('$m'))['archive']['sha256'])")
  fsha=$(python3 -c "import json; print(json.load(open('$m'))['files'][0]['sha256'])")
  cp "$DEMO_DIR/v1/source.tar.gz" "$out/archive-copy"
  echo precious >"$out/victim"; echo keep >"$out/dir/unreferenced"
  snap() { (cd "$out" && find . -printf '%p %s %T@ %m %n\n' | sort && find . -type f -exec sha256sum {} + | sort); }
  local before; before=$(snap)
  local cases=(
    "store/tmp/$asha-source.tar.gz.part|$out/victim"
    "store/tmp/$asha-source.tar.gz.lock|$out/created-lock"
    "store/tmp/$asha-source.tar.gz|$out/archive-copy"
    "store/objects/${fsha:0:2}|$out/dir"
    "store/objects/${fsha:0:2}/$fsha|$out/victim"
    "store/.lock|$out/created-store-lock"
    "state.db-wal|$out/created-wal"
    "state.db-shm|$out/created-shm"
    "store/tmp|$out/dir"
    "state.db|$out/created-db"
    "cache/cache.db|$out/created-cache-db"
    "cache/cache.db-wal|$out/created-cache-wal"
    "cache|$out/dir"
  )
  local c rel target
  for c in "${cases[@]}"; do
    rel=${c%%|*}; target=${c#*|}; i=$((i + 1))
    export TK_HOME=$WORK/home-sym-$i; rm -rf "$TK_HOME"; mkdir -p "$TK_HOME"
    if [ "$rel" != state.db ]; then "$TK" trust add tktest "$PUB" -q || { fail "trust add ($rel)"; continue; }; fi
    case $rel in store/tmp|cache) rm -rf "${TK_HOME:?}/$rel" ;; esac
    mkdir -p "$(dirname "$TK_HOME/$rel")"; ln -s "$target" "$TK_HOME/$rel"
    case $rel in
      state.db) expect_rc 6 "$TK" trust add tktest "$PUB" ;;
      cache|cache/*) expect_rc 6 "$TK" cache stats ;;   # the compiled-binary cache (SQLite)
      *) expect_rc 6 "$TK" get tktest/demo ;;
    esac
    expect_out "$TK_HOME/$rel"
    [ "$(snap)" = "$before" ] || { fail "a link at $rel changed something outside the home:"; diff <(echo "$before") <(snap) >&2; }
    rm "$TK_HOME/$rel"
    [ "$rel" = state.db ] && "$TK" trust add tktest "$PUB" -q
    case $rel in cache*) expect_rc 0 "$TK" cache stats ;; esac
    expect_rc 0 "$TK" get tktest/demo
  done
  # verify: an object replaced by a link to an identical copy outside is tampering
  local obj; obj=$TK_HOME/store/objects/${fsha:0:2}/$fsha
  cp "$obj" "$out/same"; chmod u+w "$obj"; rm -f "$obj"; ln -s "$out/same" "$obj"
  before=$(snap)
  expect_rc 5 "$TK" verify
  expect_out "symbolic link"
  expect_out "tampering"
  # a planted objects/<ab> link to a directory elsewhere: remove (which collects unreferenced
  # objects) deletes nothing there
  rm "$obj"; ln -s "$out/dir" "$TK_HOME/store/objects/zz"
  expect_rc 0 "$TK" remove tktest/demo
  [ "$(snap)" = "$before" ] || { fail "remove changed something outside the home:"; diff <(echo "$before") <(snap) >&2; }
}

t_remove_collects_files() {
  use_file "$REG"; "$TK" trust add tktest "$PUB" -q
  "$TK" get -q tktest/demo >/dev/null
  [ -n "$(find "$TK_HOME/store/objects" -type f)" ] || fail "no objects after get"
  expect_rc 0 "$TK" remove tktest/demo
  [ -z "$(find "$TK_HOME/store/objects" -type f)" ] || fail "objects left after remove"
  expect_rc 3 "$TK" remove tktest/demo
}

t_concurrent_gets() {
  use_file "$REG"; "$TK" trust add tktest "$PUB" -q
  local pids=() i rc=0
  for i in 1 2 3 4; do "$TK" get -q tktest/demo >"$WORK/c$i.log" 2>&1 & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc = 0 ] || { fail "a concurrent get failed:"; cat "$WORK"/c*.log >&2; }
  [ "$(find "$TK_HOME/store/objects" -type f | wc -l)" -eq 3 ] || fail "store does not hold exactly one copy of each file"
  expect_rc 0 "$TK" verify
  expect_rc 0 "$TK" list --json
  [ "$(echo "$OUT" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1 ] || fail "not one package row"
}

t_sigkill_mid_get() {
  # A 3 MB package served at 256 KB/s: kill tk mid-download, then check the state and finish.
  local r=$WORK/bigreg; rm -rf "$r"
  make_pkg "$WORK/big" 1.0.0 3000000
  "$TK" publish "$WORK/big" --to "$r" --key "$KEY" -q >/dev/null
  start_nginx "$r" 256k || { fail nginx; return; }
  export TK_ENDPOINT=$NGINX_URL; "$TK" trust add tktest "$PUB" -q
  "$TK" get -q tktest/demo >/dev/null 2>&1 & local pid=$!
  sleep 2; kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  expect_rc 0 "$TK" list --json
  [ "$OUT" = "[]" ] || fail "a killed get left a package installed: $OUT"
  expect_rc 0 "$TK" verify
  local part; part=$(find "$TK_HOME/store/tmp" -name '*.part' -size +0 | head -n 1)
  [ -n "$part" ] || fail "no partial download kept for resuming"
  stop_nginx; start_nginx "$r" || { fail nginx; return; }
  export TK_ENDPOINT=$NGINX_URL
  expect_rc 0 "$TK" get tktest/demo
  grep -q ' 206 ' "$WORK/nginx/access.log" || fail "the second get did not resume (no 206 in the access log)"
  expect_rc 0 "$TK" verify
  stop_nginx
}

# One exit code per class of failure, as 'tk --help' documents them: 5 a package refused, 6 local I/O
# (disk full, read-only home), 4 the network.
t_exit_codes_package_refused() {
  copy_reg; "$TK" trust add tktest "$PUB" -q
  local orig=$WORK/class-orig; rm -rf "$orig"; cp -a "$BAD" "$orig"
  local kind
  for kind in longname deep; do
    rm -f "$BAD"/*; cp "$orig"/* "$BAD/"
    # a validly signed package whose archive (and manifest) hold a hostile path
    python3 - "$BAD" "$kind" <<'EOF'
import hashlib, io, json, sys, tarfile
d, kind = sys.argv[1:3]
name = ("n" * 300 + ".cu") if kind == "longname" else "/".join(["d"] * 200) + "/x.cu"
data = b"x\n"
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as t:
    ti = tarfile.TarInfo(name); ti.size = len(data); t.addfile(ti, io.BytesIO(data))
arc = buf.getvalue()
open(d + "/source.tar.gz", "wb").write(arc)
m = json.load(open(d + "/manifest.json"))
m["files"] = [{"path": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}]
m["archive"]["sha256"] = hashlib.sha256(arc).hexdigest(); m["archive"]["size"] = len(arc)
open(d + "/manifest.json", "w").write(json.dumps(m, indent=2) + "\n")
EOF
    sign_file "$KEY" "$BAD/manifest.json"; recommit_bad
    expect_rc 5 "$TK" get tktest/demo
    expect_out "not a safe relative path"
  done
  # oversized signature and manifest, over file:// as over http: a refused package, not the network
  rm -f "$BAD"/*; cp "$orig"/* "$BAD/"
  head -c 20000 /dev/zero | tr '\0' ' ' >>"$BAD/manifest.json.sig"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "manifest.json.sig is larger than"
  cp "$orig/manifest.json.sig" "$BAD/"
  head -c $((5 << 20)) /dev/zero | tr '\0' ' ' >>"$BAD/manifest.json"
  expect_rc 5 "$TK" get tktest/demo
  expect_out "manifest.json is larger than"
  start_nginx "$WORK/bad" || { fail "nginx"; return; }
  export TK_ENDPOINT=$NGINX_URL
  expect_rc 5 "$TK" get tktest/demo
  expect_out "manifest.json is larger than"
  stop_nginx
  expect_rc 0 "$TK" list --json
  [ "$OUT" = "[]" ] || fail "a refused package was installed: $OUT"
}

t_exit_codes_local_io() {
  local mnt=$WORK/tiny-io; mkdir -p "$mnt"
  mount -t tmpfs -o size=1m tmpfs "$mnt" 2>/dev/null || { skip "cannot mount a tmpfs here (needs root)"; return; }
  use_file "$REG"
  export TK_HOME=$mnt/home
  "$TK" trust add tktest "$PUB" -q || fail "trust add"
  dd if=/dev/zero of="$mnt/fill" bs=4k 2>/dev/null   # the disk is full now
  local c
  for c in "list" "verify" "trust add tktest2 $PUB" "get tktest/demo"; do
    expect_rc 6 "$TK" $c
    expect_out "HINT"
  done
  rm -f "$mnt/fill"
  "$TK" get -q tktest/demo >/dev/null || fail "get after freeing space"
  mount -o remount,ro "$mnt" || { fail "remount read-only"; umount "$mnt"; return; }
  for c in "list" "verify" "remove tktest/demo"; do
    expect_rc 6 "$TK" $c
    expect_out "$mnt/home"
  done
  TK_HOME=$mnt/absent expect_rc 6 "$TK" list
  expect_out "Read-only file system"
  umount "$mnt"
}

t_exit_codes_network() {
  local port; port=$(free_port)   # nothing listens there
  export TK_ENDPOINT=http://127.0.0.1:$port
  "$TK" trust add tktest "$PUB" -q
  expect_rc 4 "$TK" get tktest/demo
  TK_OFFLINE=1 expect_rc 4 "$TK" get tktest/demo
  expect_out "offline"
}

t_full_disk() {
  local mnt=$WORK/tiny; mkdir -p "$mnt"
  mount -t tmpfs -o size=2m tmpfs "$mnt" 2>/dev/null || { skip "cannot mount a tmpfs here (needs root)"; return; }
  local r=$WORK/bigreg2; rm -rf "$r"
  make_pkg "$WORK/big2" 1.0.0 3000000
  "$TK" publish "$WORK/big2" --to "$r" --key "$KEY" -q >/dev/null
  use_file "$r"
  TK_HOME=$mnt/home "$TK" trust add tktest "$PUB" -q
  TK_HOME=$mnt/home expect_rc 6 "$TK" get tktest/demo
  expect_out "No space left"
  expect_out "HINT"
  TK_HOME=$mnt/home expect_rc 0 "$TK" list --json
  [ "$OUT" = "[]" ] || fail "a get that hit a full disk left something installed"
  umount "$mnt"
}

run_tests
