#!/usr/bin/env bash
# Projects, locks and several registries through the real tk binary (docs/project.md): two real
# registries built with tk publish (one served by nginx, one by tk serve), a project file (tk.json)
# and its errors, tk lock's contents, tk get --locked all or nothing on a fresh home, the registry
# each package came from remembered, scoped registries and TK_ENDPOINT.
. "$(dirname "$0")/lib.sh"

if ! command -v nginx >/dev/null; then echo "skip: nginx not installed"; echo "0 passed, 0 failed, 1 skipped"; exit 0; fi

KEYA=$WORK/a.key KEYB=$WORK/b.key
"$TK" keygen "$KEYA" >/dev/null && "$TK" keygen "$KEYB" >/dev/null || { echo "keygen failed"; exit 1; }
PUBA=$(cat "$KEYA.pub") PUBB=$(cat "$KEYB.pub")
keyid() { python3 -c "import hashlib,sys; print('SHA256:'+hashlib.sha256(bytes.fromhex(sys.argv[1][8:])).hexdigest()[:32])" "$1"; }
IDA=$(keyid "$PUBA") IDB=$(keyid "$PUBB")

# publish REG NAME VERSION KEY: a small package NAME@VERSION published into the tree REG.
publish() {
  local reg=$1 name=$2 ver=$3 key=$4 dir=$WORK/src-${2//\//-}-$3
  rm -rf "$dir"; mkdir -p "$dir"
  cat >"$dir/kernel.json" <<JSON
{"name": "$name", "version": "$ver", "license": "MIT", "description": "test package",
 "kernels": [{"name": "scale_f32", "op": "scale", "source": "scale.cu", "symbol": "scale",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}, {"name": "n", "type": "i64", "value": "numel(out)"}],
   "launch": {"grid": ["cdiv(n, 256)"], "block": ["256"], "smem": "0"}}]}
JSON
  printf 'extern "C" __global__ void scale(float *out, long long n) { /* %s %s */ }\n' "$name" "$ver" >"$dir/scale.cu"
  echo "$name $ver" >"$dir/README.md"
  "$TK" publish "$dir" --to "$reg" --key "$key" -q >/dev/null || { echo "publish $name $ver failed"; exit 1; }
}

# Registry A (nginx): alpha/one 1.0.0 and 1.2.0, gamma/both 1.0.0. Registry B (tk serve): beta/two
# 1.0.0, gamma/both 1.1.0 (the same name in both, so where a package comes from is visible).
RA=$WORK/reg-a RB=$WORK/reg-b
publish "$RA" alpha/one 1.0.0 "$KEYA"; publish "$RA" alpha/one 1.2.0 "$KEYA"; publish "$RA" gamma/both 1.0.0 "$KEYA"
publish "$RB" beta/two 1.0.0 "$KEYB"; publish "$RB" gamma/both 1.1.0 "$KEYA"
start_nginx "$RA" || exit 1
URLA=$NGINX_URL
# serve ROOT: tk serve on a free port; prints its URL (tk serve prints it on stdout).
serve() {
  local out; out=$(mktemp "$WORK/serve.XXXXXX.url")
  "$TK" serve --root "$1" --listen 127.0.0.1:0 >"$out" 2>>"$WORK/serve.log" &
  echo "$!" >>"$WORK/serve.pids"   # a file, not a variable: serve runs in $(...), a subshell
  for _ in $(seq 100); do [ -s "$out" ] && break; sleep 0.05; done
  head -n 1 "$out"
}
stop_serves() { [ -f "$WORK/serve.pids" ] && xargs -r kill <"$WORK/serve.pids" 2>/dev/null; return 0; }
trap 'stop_serves; cleanup' EXIT
URLB=$(serve "$RB")
case "$URLB" in http://127.0.0.1:[1-9]*) ;; *) echo "tk serve did not start: $(cat "$WORK/serve.log")"; exit 1 ;; esac

# at DIR CMD...: runs CMD in DIR in this shell (expect_rc's OUT and failures must not be lost in a subshell).
at() { local d=$1; shift; pushd "$d" >/dev/null || return; "$@"; popd >/dev/null; }
commit_of() { readlink "$1/kernels/$2/resolve/v$3"; }
msha_of() { sha256sum "$1/kernels/$2/resolve/$(commit_of "$1" "$2" "$3")/manifest.json" | cut -d' ' -f1; }

# config REG...: config.json's "registries" (each a URL or a JSON object).
config() {
  local list="" r
  for r in "$@"; do case "$r" in '{'*) list="$list${list:+, }$r" ;; *) list="$list${list:+, }\"$r\"" ;; esac; done
  echo "{\"registries\": [$list]}" >"$TK_HOME/config.json"
}
trust_all() { "$TK" trust add alpha "$PUBA" -q && "$TK" trust add beta "$PUBB" -q && "$TK" trust add gamma "$PUBA" -q; }

# project DIR: a project asking for alpha/one (a range) and beta/two (a major).
project() {
  mkdir -p "$1"
  cat >"$1/tk.json" <<JSON
{
  "packages": {
    "alpha/one": ">=1.1,<2",
    "beta/two": {"version": "1"}
  }
}
JSON
}

t_project_get_from_two_registries() {
  config "$URLA" "$URLB"; trust_all
  project "$WORK/p1"; mkdir -p "$WORK/p1/sub/dir"
  # found from a subdirectory, like git
  at "$WORK/p1/sub/dir" expect_rc 0 "$TK" -q get --no-build --json
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert sorted(p["name"] for p in d)==["alpha/one","beta/two"], d' \
    || fail "get --json in a project: not both packages"
  "$TK" info --json alpha/one | python3 -c '
import json, sys; d = json.load(sys.stdin); assert d["version"] == "1.2.0" and d["registry"] == sys.argv[1], d' "$URLA" || fail "alpha/one: not 1.2.0 from $URLA"
  "$TK" info --json beta/two | python3 -c '
import json, sys; d = json.load(sys.stdin); assert d["version"] == "1.0.0" and d["registry"] == sys.argv[1], d' "$URLB" || fail "beta/two: not from $URLB"
  # a second get downloads nothing
  at "$WORK/p1" expect_rc 0 "$TK" get --no-build
  expect_out "up to date: alpha/one 1.2.0"
}

t_lock_pins_exactly_the_project() {
  config "$URLA" "$URLB"; trust_all
  "$TK" get -q --no-build gamma/both >/dev/null || fail "get gamma/both"   # installed, not in the project
  project "$WORK/p2"
  at "$WORK/p2" expect_rc 0 "$TK" -q lock --json
  [ -f "$WORK/p2/tk.lock" ] || { fail "no tk.lock beside tk.json"; return; }
  cmp -s <(echo "$OUT") "$WORK/p2/tk.lock" || fail "lock --json printed something else than tk.lock"
  python3 - "$WORK/p2/tk.lock" "$URLA" "$URLB" "$(commit_of "$RA" alpha/one 1)" "$(msha_of "$RA" alpha/one 1)" \
    "$(commit_of "$RB" beta/two 1)" "$(msha_of "$RB" beta/two 1)" "$IDA" "$IDB" <<'PY' || fail "lock contents"
import json, sys
path, ua, ub, ca, ma, cb, mb, ida, idb = sys.argv[1:]
d = json.load(open(path))
assert d["format_version"] == 2 and d["project"] == "tk.json", d
p = {e["name"]: e for e in d["packages"]}
assert sorted(p) == ["alpha/one", "beta/two"], "the lock pins %s, not exactly the project's packages" % sorted(p)
a, b = p["alpha/one"], p["beta/two"]
assert (a["version"], a["commit"], a["manifest_sha256"], a["registry"], a["signer"], a["requested"]) == ("1.2.0", ca, ma, ua, ida, ">=1.1,<2"), a
assert (b["version"], b["commit"], b["manifest_sha256"], b["registry"], b["signer"], b["requested"]) == ("1.0.0", cb, mb, ub, idb, "1"), b
assert a["requested_registry"] is None and a["major"] == 1
PY
  # --all (and no project) keeps pinning the whole store
  at "$WORK/p2" expect_rc 0 "$TK" lock --all -o "$WORK/all.lock"
  python3 -c 'import json,sys; assert len(json.load(open(sys.argv[1]))["packages"]) == 3' "$WORK/all.lock" || fail "--all"
  mkdir -p "$WORK/noproj"
  at "$WORK/noproj" expect_rc 0 "$TK" lock
  expect_out "no tk.json here or above"
  python3 -c 'import json,sys; assert len(json.load(open(sys.argv[1]))["packages"]) == 3' "$WORK/noproj/tk.lock" || fail "no project"
}

# make_lock DIR: a project and its lock, made in a scratch home.
make_lock() {
  local home=$TK_HOME
  TK_HOME=$(mktemp -d "$WORK/lockhome.XXXXXX"); export TK_HOME; config "$URLA" "$URLB"; trust_all
  project "$1"; (cd "$1" && "$TK" lock -q) || fail "lock"
  export TK_HOME=$home
}

t_locked_installs_exactly_the_lock_on_a_fresh_home() {
  # a registry copy that moves on after the lock: the lock still installs what it pinned
  cp -a "$RA" "$WORK/ra2"
  local u=file://$WORK/ra2 home=$TK_HOME
  export TK_HOME=$WORK/lh; mkdir -p "$TK_HOME"; config "$u" "$URLB"; trust_all
  project "$WORK/p3"; (cd "$WORK/p3" && "$TK" lock -q) || fail "lock"
  export TK_HOME=$home
  publish "$WORK/ra2" alpha/one 1.3.0 "$KEYA"
  config "$URLA"   # the fresh home's own config does not matter: the lock names each registry
  trust_all
  at "$WORK/p3" expect_rc 0 "$TK" get --locked --no-build
  expect_out "installed alpha/one 1.2.0"
  expect_out "installed beta/two 1.0.0"
  "$TK" info --json alpha/one | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["registry"]==sys.argv[1], d' "$u" \
    || fail "alpha/one not from the registry the lock names"
  # tk get (not locked) resolves the range again and takes 1.3.0
  at "$WORK/p3" expect_rc 0 "$TK" get --no-build
  expect_out "installed alpha/one 1.3.0"
  # a project file changed after the lock: --locked refuses, naming the difference
  sed -i 's/>=1.1,<2/>=1.0,<2/' "$WORK/p3/tk.json"
  at "$WORK/p3" expect_rc 2 "$TK" get --locked
  expect_out "out of date"
  expect_out "the project asks for \">=1.0,<2\""
  expect_out "HINT: run 'tk lock'"
}

# nothing_installed: the store is as a fresh home leaves it.
nothing_installed() {
  local n; n=$("$TK" list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
  [ "$n" = 0 ] || fail "line ${BASH_LINENO[0]}: $n packages installed after a failed --locked, want 0"
  [ -z "$(find "$TK_HOME/store/objects" -type f)" ] || fail "line ${BASH_LINENO[0]}: files left in the store"
}

t_locked_is_all_or_nothing() {
  # the second package's registry is a copy served by its own tk serve, tampered after the lock
  cp -a "$RB" "$WORK/rb2"
  local ub2; ub2=$(serve "$WORK/rb2")
  local home=$TK_HOME
  export TK_HOME=$WORK/aon; mkdir -p "$TK_HOME"; config "$URLA" "$ub2"; trust_all
  project "$WORK/p4"; (cd "$WORK/p4" && "$TK" lock -q) || fail "lock"
  export TK_HOME=$home; trust_all
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert [e["name"] for e in d["packages"]]==["alpha/one","beta/two"]' \
    "$WORK/p4/tk.lock" || fail "alpha/one is not first in the lock"
  # 1. a tampered archive in the second package
  local arc; arc=$WORK/rb2/kernels/beta/two/resolve/$(commit_of "$WORK/rb2" beta/two 1)/source.tar.gz
  cp "$arc" "$WORK/arc.bak"; printf 'x' >>"$arc"
  at "$WORK/p4" expect_rc 5 "$TK" get --locked --no-build
  expect_out "beta/two"
  expect_no_out "installed alpha/one"
  nothing_installed
  cp "$WORK/arc.bak" "$arc"
  # 2. a lock whose manifest digest was altered
  cp "$WORK/p4/tk.lock" "$WORK/lock.bak"
  python3 - "$WORK/p4/tk.lock" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["packages"][1]["manifest_sha256"] = "0" * 64; json.dump(d, open(sys.argv[1], "w"))
PY
  at "$WORK/p4" expect_rc 5 "$TK" get --locked --no-build
  expect_out "lock file pins"
  nothing_installed
  # 3. a commit the registry does not have
  python3 - "$WORK/lock.bak" "$WORK/p4/tk.lock" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["packages"][1]["commit"] = "1" * 40; json.dump(d, open(sys.argv[2], "w"))
PY
  at "$WORK/p4" expect_rc 3 "$TK" get --locked --no-build
  nothing_installed
  # 4. a dead registry
  python3 - "$WORK/lock.bak" "$WORK/p4/tk.lock" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["packages"][1]["registry"] = "http://127.0.0.1:9"; json.dump(d, open(sys.argv[2], "w"))
PY
  at "$WORK/p4" expect_rc 4 "$TK" get --locked --no-build
  nothing_installed
  # 5. a signer this home does not trust, and a signer other than the one locked
  cp "$WORK/lock.bak" "$WORK/p4/tk.lock"
  "$TK" trust remove beta "$IDB" -q
  at "$WORK/p4" expect_rc 5 "$TK" get --locked --no-build
  expect_out "not trusted for org 'beta'"
  nothing_installed
  "$TK" trust add beta "$PUBB" -q
  python3 - "$WORK/lock.bak" "$WORK/p4/tk.lock" "$IDA" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["packages"][1]["signer"] = sys.argv[3]; json.dump(d, open(sys.argv[2], "w"))
PY
  at "$WORK/p4" expect_rc 5 "$TK" -q get --locked --no-build --json
  echo "$OUT" | python3 -c 'import json,sys; e=json.load(sys.stdin)["error"]; assert e["status"]=="untrusted" and "lock file pins signer" in e["message"], e' \
    || fail "--json error object for a signer other than the locked one"
  nothing_installed
  # and the intact lock installs both
  cp "$WORK/lock.bak" "$WORK/p4/tk.lock"
  at "$WORK/p4" expect_rc 0 "$TK" get --locked --no-build
  expect_out "installed alpha/one 1.2.0"
  expect_out "installed beta/two 1.0.0"
}

t_project_file_errors() {
  config "$URLA" "$URLB"
  local d=$WORK/perr; mkdir -p "$d"
  printf '{\n  "packages": {\n    "alpha/one": "1",\n' >"$d/tk.json"
  at "$d" expect_rc 2 "$TK" get
  expect_out "tk.json:4:"
  printf '{\n  "pakages": {"alpha/one": "1"}\n}\n' >"$d/tk.json"
  at "$d" expect_rc 2 "$TK" get
  expect_out "tk.json:2:3: unknown key \"pakages\""
  expect_out "did you mean \"packages\"?"
  printf '{"packages": {\n  "alpha/one": {"vrsion": "1"}}}\n' >"$d/tk.json"
  at "$d" expect_rc 2 "$TK" get
  expect_out "tk.json:2:17: unknown key \"vrsion\" in alpha/one"
  expect_out "did you mean \"version\"?"
  printf '{"packages": {\n  "alpha/one": ">=1.2,<<2"}}\n' >"$d/tk.json"
  at "$d" expect_rc 2 "$TK" get
  expect_out "tk.json:2:16:"
  expect_out "'>=1.2,<<2' is not a version of alpha/one"
  printf '{"packages": {\n  "alpha/one": {"version": "1",\n                "registry": "ftp://x"}}}\n' >"$d/tk.json"
  at "$d" expect_rc 2 "$TK" get
  expect_out "tk.json:3:29"
  expect_out "not an http, https or file URL"
  printf '{"packages": {"Alpha one": "1"}}\n' >"$d/tk.json"
  at "$d" expect_rc 2 "$TK" -q get --json
  echo "$OUT" | python3 -c 'import json,sys; e=json.load(sys.stdin)["error"]; assert e["status"]=="invalid" and "tk.json:1:15" in e["message"], e' \
    || fail "--json error object for a bad name"
  printf '{"packages": {"alpha/one": "1", "alpha/one": "2"}}\n' >"$d/tk.json"
  at "$d" expect_rc 2 "$TK" lock
  expect_out "duplicate"
  expect_rc 3 "$TK" get --project "$WORK/missing.json"
  expect_out "no project file at"
  mkdir -p "$WORK/empty"
  at "$WORK/empty" expect_rc 2 "$TK" get
  expect_out "which package?"
  # nothing was installed by any of it
  nothing_installed
  # an empty project is not an error: nothing to install, an empty lock
  printf '{"format_version": 1, "packages": {}}\n' >"$d/tk.json"
  at "$d" expect_rc 0 "$TK" get
  at "$d" expect_rc 0 "$TK" -q lock --json
  echo "$OUT" | python3 -c 'import json,sys; assert json.load(sys.stdin)["packages"]==[]' || fail "empty project's lock"
  at "$d" expect_rc 0 "$TK" get --locked
}

t_registry_remembered() {
  config "$URLA" "$URLB"; trust_all
  expect_rc 0 "$TK" get --no-build gamma/both
  expect_out "installed gamma/both 1.0.0"         # the first registry that has it
  config "$URLB" "$URLA"                           # B first now: gamma/both still comes from A
  expect_rc 0 "$TK" get --no-build gamma/both
  expect_out "up to date: gamma/both 1.0.0"
  expect_rc 0 "$TK" update gamma/both
  expect_out "1.0.0 is the newest of v1"
  "$TK" info --json gamma/both | python3 -c 'import json,sys; assert json.load(sys.stdin)["registry"]==sys.argv[1]' "$URLA" \
    || fail "gamma/both does not record $URLA"
  # the verify hint names the registry it comes back from
  local f; f=$(find "$TK_HOME/store/objects" -type f | head -n 1); chmod u+w "$f"; echo x >>"$f"
  expect_rc 5 "$TK" verify
  expect_out "tk get --force gamma/both@1' (from $URLA)"
  expect_rc 0 "$TK" get --force --no-build gamma/both
  expect_out "installed gamma/both 1.0.0"
  # removed, it is looked up afresh: B is first now
  expect_rc 0 "$TK" remove gamma/both
  expect_rc 0 "$TK" get --no-build gamma/both
  expect_out "installed gamma/both 1.1.0"
}

t_scoped_registry_and_search() {
  trust_all
  config "{\"url\": \"$URLB\", \"packages\": [\"gamma/*\"]}" "$URLA"
  expect_rc 0 "$TK" get --no-build gamma/both
  expect_out "installed gamma/both 1.1.0"           # only from the registry scoped to it
  expect_rc 0 "$TK" get --no-build alpha/one
  expect_out "installed alpha/one 1.2.0"
  expect_rc 3 "$TK" get --no-build beta/two          # B serves only gamma/*
  expect_out "package beta/two not found in the registry"
  # a registry that fails stops the search: the next one is not asked
  config "http://127.0.0.1:9" "$URLA"
  expect_rc 4 "$TK" get --no-build beta/two
  expect_out "registry http://127.0.0.1:9"
  # config errors name the entry
  echo '{"registries": [{"url": "'"$URLA"'", "pakages": ["a/*"]}]}' >"$TK_HOME/config.json"
  expect_rc 2 "$TK" list
  expect_out "\"registries\"[0]: unknown key \"pakages\""
  echo '{"endpoint": "'"$URLA"'", "registries": ["'"$URLB"'"]}' >"$TK_HOME/config.json"
  expect_rc 2 "$TK" list
  expect_out "both \"endpoint\" and \"registries\""
}

t_tk_endpoint_overrides_and_doctor() {
  trust_all
  config "{\"url\": \"$URLA\", \"packages\": [\"alpha/*\"]}" "$URLB"
  OUT=$("$TK" doctor --json 2>/dev/null)   # its exit status says whether there is a GPU; the JSON counts
  echo "$OUT" | python3 -c '
import json, sys
r = json.load(sys.stdin)["registries"]
assert [x["url"] for x in r] == sys.argv[1:3] and r[0]["packages"] == ["alpha/*"] and r[1]["packages"] is None, r
assert all(x["source"] == "config" for x in r), r' "$URLA" "$URLB" || fail "doctor --json registries"
  OUT=$("$TK" doctor 2>&1)
  expect_out "registry: $URLA  (only alpha/*; config.json)"
  expect_out "$URLB  (any package; config.json)"
  # TK_ENDPOINT: one registry for everything, scopes and project registries included
  OUT=$(TK_ENDPOINT=$URLB "$TK" doctor 2>&1)
  expect_out "registry: $URLB  (any package; TK_ENDPOINT overrides config.json)"
  TK_ENDPOINT=$URLB expect_rc 3 "$TK" get --no-build alpha/one
  TK_ENDPOINT=$URLB expect_rc 0 "$TK" get --no-build beta/two
}

t_lock_format_1_still_installs() {
  config "$URLA"; trust_all
  cat >"$WORK/old.lock" <<JSON
{"format_version": 1, "registry": "$URLA", "packages": [{"name": "alpha/one", "major": 1, "version": "1.2.0",
 "commit": "$(commit_of "$RA" alpha/one 1)", "manifest_sha256": "$(msha_of "$RA" alpha/one 1)"}]}
JSON
  expect_rc 0 "$TK" get --locked "$WORK/old.lock" --no-build
  expect_out "installed alpha/one 1.2.0"
}

run_tests
