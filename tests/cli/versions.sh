#!/usr/bin/env bash
# Versions (issue 14, item 7) through the real tk binary, against a registry tree published here:
# exact versions and ranges in tk get, tk versions (text and --json), yanked versions (never picked by a
# range, installed with a warning when named exactly), remote tk info, tk update and tk list --outdated,
# over file:// and over tk serve (http). Also a registry whose versions document names a commit that
# does not hold what it names.
. "$(dirname "$0")/lib.sh"

KEY=$WORK/pub.key
"$TK" keygen "$KEY" >/dev/null || { echo "keygen failed"; exit 1; }
PUB=$(cat "$KEY.pub")

# make_pkg DIR VERSION: a small package "tktest/ver".
make_pkg() {
  local dir=$1 ver=$2
  rm -rf "$dir"; mkdir -p "$dir"
  cat >"$dir/kernel.json" <<EOF
{"name": "tktest/ver", "version": "$ver", "license": "MIT", "description": "version test $ver",
 "kernels": [{"name": "scale_f32", "op": "scale", "source": "scale.cu", "symbol": "scale",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}, {"name": "n", "type": "i64", "value": "numel(out)"}],
   "launch": {"grid": ["cdiv(n, 256)"], "block": ["256"], "smem": "0"}}]}
EOF
  printf 'extern "C" __global__ void scale(float *out, long long n) { /* %s */ }\n' "$ver" >"$dir/scale.cu"
}
publish() { make_pkg "$WORK/p-$2" "$2"; "$TK" publish "$WORK/p-$2" --to "$1" --key "$KEY" -q >/dev/null || { echo "publish $2 failed"; exit 1; }; }

# 1.0.0 1.0.1 1.2.0 1.3.0 (1.3.0 yanked while it heads v1, so no chain reaches it) 1.2.5, then
# 1.1.0-style gaps: 2.0.0 2.1.0; 1.0.1 is yanked too (in the middle of the chain).
REG=$WORK/reg
for v in 1.0.0 1.0.1 1.2.0; do publish "$REG" $v; done
cp -a "$REG" "$WORK/stale"   # a registry copy from before 1.2.5 existed
publish "$REG" 1.3.0
"$TK" yank tktest/ver@1.3.0 --to "$REG" --key "$KEY" --reason "bad numbers" -q >/dev/null || { echo "yank failed"; exit 1; }
publish "$REG" 1.2.5
"$TK" yank tktest/ver@1.0.1 --to "$REG" --key "$KEY" -q >/dev/null || { echo "yank failed"; exit 1; }
for v in 2.0.0 2.1.0; do publish "$REG" $v; done

use_file() { export TK_ENDPOINT=file://$1; }
trust() { "$TK" trust add tktest "$PUB" -q; }

# the checks that both transports share; $1 names the transport in messages
check_resolution() {
  expect_rc 0 "$TK" versions tktest/ver
  expect_out "1.3.0        v1"; expect_out "yanked (bad numbers)"
  expect_out "1.2.5        v1"; expect_out "head of v1"; expect_out "head of v2"
  local lines; lines=$(echo "$OUT" | grep -c '^[12]\.')
  [ "$lines" = 7 ] || fail "$1: tk versions listed $lines versions, want 7"
  # exact
  expect_rc 0 "$TK" get tktest/ver@1.2.0
  expect_out "installed tktest/ver 1.2.0"
  # a range never picks a yanked version: >=1.2,<2 is 1.2.5, not 1.3.0
  "$TK" remove -q tktest/ver
  expect_rc 0 "$TK" get "tktest/ver@>=1.2,<2"
  expect_out "installed tktest/ver 1.2.5"
  expect_no_out "1.3.0"
  "$TK" remove -q tktest/ver
  expect_rc 0 "$TK" get "tktest/ver@<1.2"
  expect_out "installed tktest/ver 1.0.0"       # 1.0.1 is yanked
  "$TK" remove -q tktest/ver
  expect_rc 0 "$TK" get "tktest/ver@>1.0.0, <=2.0.0"
  expect_out "installed tktest/ver 2.0.0"
  # no match: the error lists what there is
  expect_rc 3 "$TK" get "tktest/ver@>=3"
  expect_out "has no version matching >=3"
  expect_out "available: 1.0.0, 1.0.1 (yanked), 1.2.0, 1.2.5, 1.3.0 (yanked), 2.0.0, 2.1.0"
  expect_rc 3 "$TK" get tktest/ver@1.1.0
  expect_out "has no version 1.1.0"
  expect_out "available: 1.0.0"
  # a range that only yanked versions satisfy: not picked, and the hint says how to get one
  expect_rc 3 "$TK" get "tktest/ver@>1.2.5,<2"
  expect_out "never picks a yanked version"
}

t_file_resolution() {
  use_file "$REG"; trust
  check_resolution file
}

t_serve_resolution() {
  : >"$WORK/serve.log"
  "$TK" serve --root "$REG" --listen 127.0.0.1:0 2>>"$WORK/serve.log" &
  local pid=$! port=
  for _ in $(seq 100); do
    port=$(sed -n 's#.*serving .* on http://127.0.0.1:\([0-9]*\).*#\1#p' "$WORK/serve.log"); [ -n "$port" ] && break; sleep 0.05
  done
  [ -n "$port" ] || { fail "tk serve did not start: $(cat "$WORK/serve.log")"; kill $pid; return; }
  export TK_ENDPOINT=http://127.0.0.1:$port; trust
  check_resolution http
  expect_rc 0 curl -fsS "$TK_ENDPOINT/api/kernels/tktest/ver/versions"
  expect_out '"version": "1.3.0"'
  kill $pid; wait $pid 2>/dev/null
}

t_exact_yanked_installs_with_warning() {
  use_file "$REG"; trust
  expect_rc 0 "$TK" get tktest/ver@1.3.0
  expect_out "warning: tktest/ver 1.3.0 was yanked by its publisher (bad numbers)"
  expect_out "installed tktest/ver 1.3.0"
}

t_versions_json_and_filter() {
  use_file "$REG"; trust
  expect_rc 0 "$TK" --json versions tktest/ver
  echo "$OUT" | python3 -c '
import json, sys
d = json.load(sys.stdin)
v = {x["version"]: x for x in d["versions"]}
assert d["name"] == "tktest/ver", d["name"]
assert [x["version"] for x in d["versions"]] == ["2.1.0", "2.0.0", "1.3.0", "1.2.5", "1.2.0", "1.0.1", "1.0.0"], d
assert v["1.3.0"]["yanked"] and v["1.3.0"]["yank_reason"] == "bad numbers"
assert v["1.0.1"]["yanked"] and not v["1.2.5"]["yanked"]
assert v["1.2.5"]["head"] and v["2.1.0"]["head"] and not v["1.3.0"]["head"]
assert all(len(x["commit"]) == 40 and x["published"].endswith("Z") and x["trusted"] for x in d["versions"])
assert v["1.2.0"]["description"] == "version test 1.2.0"
' || fail "tk versions --json: $OUT"
  expect_rc 0 "$TK" --json versions "tktest/ver@>=2"
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert [x["version"] for x in d["versions"]] == ["2.1.0","2.0.0"], d' \
    || fail "filtered: $OUT"
  expect_rc 3 "$TK" versions "tktest/ver@>=9"
  expect_rc 3 "$TK" versions tktest/nope
  expect_out "not found in the registry"
  expect_rc 2 "$TK" versions "tktest/ver@>>1"
  expect_out "is not a version of tktest/ver"
  expect_rc 2 "$TK" get tktest/ver@0.1.0
  expect_out "versions start at 1.0.0"
  expect_rc 4 "$TK" --offline versions tktest/ver
  for bad in "1.2" ">=1.2," ">=" "=>1" "<1.x" "1.2.3.4" "latest"; do
    expect_rc 2 "$TK" get "tktest/ver@$bad"
    expect_out "is not a version of tktest/ver"
  done
}

# Offline, a version spec resolves against what is installed; remove takes a major, not a version.
t_offline_spec_and_remove() {
  use_file "$REG"; trust
  "$TK" get -q tktest/ver@1.2.0 >/dev/null || fail "get 1.2.0"
  expect_rc 0 "$TK" --offline get "tktest/ver@>=1.2,<2"
  expect_out "tktest/ver 1.2.0"
  expect_rc 4 "$TK" --offline get "tktest/ver@>=1.3"
  expect_out "not installed, and tk is offline"
  expect_rc 0 "$TK" info tktest/ver@1.2.0
  expect_out "tktest/ver 1.2.0"
  expect_rc 2 "$TK" remove tktest/ver@1.2.0
  expect_out "not a commit or a version"
  expect_rc 0 "$TK" remove tktest/ver@1
}

t_remote_info() {
  use_file "$REG"; trust
  expect_rc 0 "$TK" info tktest/ver
  expect_out "not installed; from the registry"
  expect_out "newest     2.1.0"
  expect_out "1.3.0 (yanked)"
  expect_rc 0 "$TK" --json info tktest/ver
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["installed"] is False and len(d["versions"]) == 7' \
    || fail "info --json: $OUT"
  expect_rc 3 "$TK" --offline info tktest/ver
  expect_out "not installed"
}

t_update_and_outdated() {
  use_file "$REG"; trust
  "$TK" get -q tktest/ver@1.0.0 >/dev/null || fail "get 1.0.0"
  expect_rc 0 "$TK" list --outdated
  expect_out "tktest/ver"; expect_out "1.0.0      1.2.5      2.1.0"
  expect_rc 0 "$TK" --json list --outdated
  echo "$OUT" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d == [{"name": "tktest/ver", "major": 1, "installed": "1.0.0", "latest": "1.2.5", "newest": "2.1.0"}], d' \
    || fail "list --outdated --json: $OUT"
  expect_rc 0 "$TK" update
  expect_out "tktest/ver: 1.0.0 -> 1.2.5"            # the newest of v1, never 2.x
  expect_rc 0 "$TK" info tktest/ver
  expect_out "tktest/ver 1.2.5"
  expect_rc 0 "$TK" --json update tktest/ver
  expect_out '"from": "1.2.5", "to": "1.2.5", "updated": false'
  "$TK" get -q tktest/ver@2 >/dev/null || fail "get v2"
  expect_rc 0 "$TK" --json list --outdated
  [ "$OUT" = "[]" ] || fail "outdated after installing both heads: $OUT"
  expect_rc 0 "$TK" list --outdated
  expect_out "every installed package is the newest of its major"
  expect_rc 3 "$TK" update tktest/nope
  expect_out "not installed"
  expect_rc 2 "$TK" update tktest/ver@1
}

# Asked for by version, an older version than the one seen installs (the listing still holds the
# one seen); a stale registry that no longer lists it is refused as the rollback it may be.
t_downgrade_by_version() {
  use_file "$REG"; trust
  "$TK" get -q tktest/ver@1.2.5 >/dev/null || fail "get 1.2.5"
  expect_rc 0 "$TK" get tktest/ver@1.2.0
  expect_out "older than 1.2.5 which this machine has seen, because you asked for it"
  expect_out "installed tktest/ver 1.2.0"
  use_file "$WORK/stale"
  expect_rc 5 "$TK" get "tktest/ver@<1.2"
  expect_out "rollback refused"
  expect_rc 0 "$TK" info tktest/ver
  expect_out "tktest/ver 1.2.0"
}

# A versions document naming a commit whose files make another id is refused, as get refuses it.
t_versions_doc_lie_refused() {
  local r=$WORK/lie; rm -rf "$r"; cp -a "$REG" "$r"
  use_file "$r"; trust
  local res=$r/kernels/tktest/ver/resolve c1 c2
  c1=$(python3 -c "import json; d=json.load(open('$r/api/kernels/tktest/ver/versions')); print([x['commit'] for x in d['versions'] if x['version']=='1.3.0'][0])")
  c2=$(python3 -c "import json; d=json.load(open('$r/api/kernels/tktest/ver/versions')); print([x['commit'] for x in d['versions'] if x['version']=='1.2.0'][0])")
  # the yanked (chain-less) commit now holds 1.2.0's signed manifest: its id no longer matches
  cp "$res/$c2/manifest.json" "$res/$c2/manifest.json.sig" "$res/$c1/"
  expect_rc 5 "$TK" versions tktest/ver
  expect_out "does not hold what it names"
  expect_rc 5 "$TK" get "tktest/ver@>=1.2,<2"
  # an oversized versions document is refused, not read
  cp -a "$REG/kernels/tktest/ver/resolve/." "$res/"
  head -c $((5 << 20)) /dev/zero | tr '\0' ' ' >>"$r/api/kernels/tktest/ver/versions"
  expect_rc 5 "$TK" versions tktest/ver
  expect_out "larger than the 4194304 bytes"
}

run_tests
