#!/usr/bin/env bash
# huggingface_hub against a plain-files registry (issue 15, item 7): the tree `tk publish --to` writes,
# served by nginx with the rules of docs/nginx-registry.conf, answers the Hub's own client as tk serve
# answers it: snapshot_download, list_repo_files, list_repo_tree, hf_hub_download at a branch and
# pinned to a commit, the HEAD metadata (X-Repo-Commit, ETag, size), list_repo_refs and the typed
# errors, after a first publish, a new version, a yank and a new major, for a tree written by tk serve
# uploads, and for a tree written by a tk older than the listings. The files the rules rely on
# (api/.../tree/{rev}, resolve/{commit}/.etag) are checked against an independent Python computation.
. "$(dirname "$0")/lib.sh"

PY=${TK_HF_PYTHON:-$TK_PY_VENV/bin/python}
export HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_ETAG_TIMEOUT=10 HF_TOKEN=
KEY=$WORK/pub.key
"$TK" keygen "$KEY" >/dev/null || { echo "keygen failed"; exit 1; }
PUB=$(cat "$KEY.pub")
REPO=tktest/hubdemo

# needs: the Hub client and nginx; skips without them, fails in CI.
needs() {
  local why=
  py_has "$PY" huggingface_hub || why="no huggingface_hub in $PY (scripts/setup.sh --test)"
  command -v nginx >/dev/null || why="no nginx (scripts/setup.sh --test)"
  [ -z "$why" ] && return 0
  if [ -n "${CI:-}" ]; then fail "$why"; else skip "$why"; fi
  return 1
}

# make_pkg DIR VERSION: a small package $REPO.
make_pkg() {
  local dir=$1 ver=$2
  rm -rf "$dir"; mkdir -p "$dir"
  cat >"$dir/kernel.json" <<EOF
{"name": "$REPO", "version": "$ver", "license": "MIT", "description": "hub client test $ver",
 "kernels": [{"name": "scale_f32", "op": "scale", "source": "scale.cu", "symbol": "scale",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}, {"name": "n", "type": "i64", "value": "numel(out)"}],
   "launch": {"grid": ["cdiv(n, 256)"], "block": ["256"], "smem": "0"}}]}
EOF
  printf 'extern "C" __global__ void scale(float *out, long long n) { /* %s */ }\n' "$ver" >"$dir/scale.cu"
  printf '# hub demo %s\n' "$ver" >"$dir/README.md"
}
publish() { make_pkg "$WORK/p-$2" "$2"; "$TK" publish "$WORK/p-$2" --to "$1" --key "$KEY" -q >/dev/null || fail "publish $2"; }
head_of() { readlink "$1/kernels/$REPO/resolve/$2"; }

# start_serve ROOT: tk serve on a free port; sets URL and SERVE_PID.
SERVE_PID=
start_serve() {
  : >"$WORK/serve.url"
  "$TK" serve --root "$1" --listen 127.0.0.1:0 >"$WORK/serve.url" 2>>"$WORK/serve.log" &
  SERVE_PID=$!; URL=
  for _ in $(seq 100); do URL=$(head -n 1 "$WORK/serve.url"); [ -n "$URL" ] && break; sleep 0.05; done
  [ -n "$URL" ] || { fail "tk serve did not start: $(cat "$WORK/serve.log")"; return 1; }
}
stop_serve() { [ -n "$SERVE_PID" ] && kill "$SERVE_PID" 2>/dev/null && wait "$SERVE_PID" 2>/dev/null; SERVE_PID=; }
trap 'stop_serve; cleanup' EXIT

# report NAME ENDPOINT REV...: what huggingface_hub reads there, as JSON in $WORK/NAME.json.
report() {
  local name=$1 ep=$2; shift 2
  rm -rf "$WORK/hf-$name"
  "$PY" tests/hf_client.py --report "$ep" "$WORK/hf-$name" "$REPO" "$@" >"$WORK/$name.json" 2>"$WORK/$name.err" ||
    fail "hf_client.py --report $ep failed: $(tail -n 5 "$WORK/$name.err")"
}

# compare TREE REV...: nginx and tk serve, both on TREE, give huggingface_hub the same answers, and
# those answers are right: each revision's commit (its branch link, or itself), the files' sha256 and
# sizes as in the tree, the ETag the sha256, and the typed errors.
compare() {
  local tree=$1; shift
  start_serve "$tree" || return
  report serve "$URL" "$@"
  stop_serve
  report nginx "$NGINX_URL" "$@"
  if ! cmp -s "$WORK/serve.json" "$WORK/nginx.json"; then
    fail "nginx answers huggingface_hub differently from tk serve:"; diff "$WORK/serve.json" "$WORK/nginx.json" | head -n 40 >&2
  fi
  "$PY" - "$WORK/nginx.json" "$tree/kernels/$REPO/resolve" "$@" <<'EOF' || fail "huggingface_hub read something else than the tree holds (nginx)"
import hashlib, json, os, sys
doc = json.load(open(sys.argv[1])); res = sys.argv[2]; bad = []
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
for rev in sys.argv[3:]:
    r = doc["revisions"][rev]
    commit = os.readlink(f"{res}/{rev}") if os.path.islink(f"{res}/{rev}") else rev
    files = sorted(f for f in os.listdir(f"{res}/{commit}") if not f.startswith("."))
    want = {f: sha(f"{res}/{commit}/{f}") for f in files}
    tree = [{"type": "RepoFile", "path": f, "size": os.path.getsize(f"{res}/{commit}/{f}"), "blob_id": want[f]} for f in files]
    checks = {"repo_info.sha": commit, "list_repo_files": files, "list_repo_tree(recursive=False)": tree,
              "list_repo_tree(recursive=True)": tree, "snapshot_download": {"commit": commit, "files": want}}
    for f in files:
        checks[f"get_hf_file_metadata {f}"] = {"commit_hash": commit, "etag": want[f], "size": os.path.getsize(f"{res}/{commit}/{f}")}
        checks[f"hf_hub_download {f}"] = {"sha256": want[f], "snapshot": commit}
    for k, v in checks.items():
        if r.get(k) != v:
            bad.append(f"{rev}: {k} = {json.dumps(r.get(k))[:200]}, want {json.dumps(v)[:200]}")
heads = sorted((b, os.readlink(f"{res}/{b}")) for b in os.listdir(res) if os.path.islink(f"{res}/{b}"))
if doc["list_repo_refs"] != [list(h) for h in heads]:
    bad.append(f"list_repo_refs = {doc['list_repo_refs']}, want {heads}")
for k, v in {"missing repo": "RepositoryNotFoundError", "missing revision": "RevisionNotFoundError",
             "missing file": "RemoteEntryNotFoundError", "missing tree path": "RemoteEntryNotFoundError"}.items():
    if doc[k] != {"error": v}:
        bad.append(f"{k}: {doc[k]}, want {v}")
for b in bad:
    print("    " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

# The rules the tests run (tests/nginx.conf.in) are the documented ones, with the two EDIT values set.
t_test_rules_are_the_documented_rules() {
  sed -e 's#listen 80;#listen 127.0.0.1:@PORT@;#' -e 's#/srv/tk-registry#@ROOT@#' docs/nginx-registry.conf >"$WORK/want.conf"
  sed -n '/^# BEGIN docs\/nginx-registry.conf/,/^# END docs\/nginx-registry.conf/p' tests/nginx.conf.in | sed '1d;$d' >"$WORK/got.conf"
  [ -s "$WORK/got.conf" ] || fail "tests/nginx.conf.in has no BEGIN/END docs/nginx-registry.conf block"
  cmp -s "$WORK/want.conf" "$WORK/got.conf" || { fail "tests/nginx.conf.in differs from docs/nginx-registry.conf:"; diff "$WORK/want.conf" "$WORK/got.conf" | head -n 20 >&2; }
  grep -q 'tests/nginx.conf.in' docs/registry.md || fail "docs/registry.md does not say the tests run these rules"
}

# What tk publish writes for the rules, recomputed in Python: the listings of every commit and branch,
# and the .etag links whose real paths carry the commit and the sha256; nothing else under resolve/.
t_publish_writes_listings_and_etag_links() {
  local r=$WORK/files
  publish "$r" 1.0.0; publish "$r" 1.1.0
  python3 - "$r" "$REPO" <<'EOF' || fail "the listings or the .etag links are not what the tree holds"
import hashlib, json, os, sys
tree, repo = sys.argv[1:3]; res = f"{tree}/kernels/{repo}/resolve"; api = f"{tree}/api/kernels/{repo}"; bad = []
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
revs = sorted(os.listdir(res))
for rev in revs:
    if rev.startswith("."):
        bad.append(f"a leftover {rev} in resolve/"); continue
    commit = os.readlink(f"{res}/{rev}") if os.path.islink(f"{res}/{rev}") else rev
    files = sorted(f for f in os.listdir(f"{res}/{commit}") if not f.startswith("."))
    want = [{"type": "file", "path": f, "size": os.path.getsize(f"{res}/{commit}/{f}"), "oid": sha(f"{res}/{commit}/{f}")} for f in files]
    got = json.load(open(f"{api}/tree/{rev}"))
    if got != want: bad.append(f"tree/{rev} = {got}, want {want}")
    if os.path.islink(f"{api}/tree/{rev}"): bad.append(f"tree/{rev} is a link")
    for f in files:
        real = os.path.realpath(f"{res}/{rev}/.etag/{f}")
        if real != os.path.realpath(f"{res}/{commit}/.etag/{sha(f'{res}/{commit}/{f}')}"):
            bad.append(f"{rev}/.etag/{f} resolves to {real}")
        if sha(f"{real}/{f}") != sha(f"{res}/{commit}/{f}"):
            bad.append(f"{rev}/.etag/{f}/{f} is not the file")
    if sorted(os.listdir(f"{res}/{commit}")) != sorted(files + [".etag"]):
        bad.append(f"{commit} holds {os.listdir(f'{res}/{commit}')}")
if sorted(os.listdir(f"{api}/tree")) != revs: bad.append(f"tree/ holds {os.listdir(f'{api}/tree')}, resolve/ {revs}")
for b in bad: print("    " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
}

# Something in the way of a listing: the publish fails before its branch moves (nothing a client
# reads changes), says what and where, and publishing again once it is moved away completes it.
t_listing_in_the_way() {
  local r=$WORK/inway c1
  publish "$r" 1.0.0; c1=$(head_of "$r" v1)
  cp -a "$r/api" "$WORK/api-before"
  rm -rf "$r/api/kernels/$REPO/tree"; echo "not a folder" >"$r/api/kernels/$REPO/tree"
  rm -rf "$WORK/api-before/kernels/$REPO/tree"; cp "$r/api/kernels/$REPO/tree" "$WORK/api-before/kernels/$REPO/tree"
  make_pkg "$WORK/p-in" 1.0.1
  expect_rc 6 "$TK" publish "$WORK/p-in" --to "$r" --key "$KEY"
  expect_out "the listing huggingface_hub reads"
  expect_out "is not a directory"
  expect_out "HINT: "
  [ "$(head_of "$r" v1)" = "$c1" ] || fail "the failed publish moved v1"
  # (the new commit's own info document may be there: nothing refers to it)
  diff -r -x revision "$WORK/api-before" "$r/api" >/dev/null || fail "the failed publish changed what clients read"
  rm "$r/api/kernels/$REPO/tree"
  expect_rc 0 "$TK" publish "$WORK/p-in" --to "$r" --key "$KEY"
  [ "$(head_of "$r" v1)" != "$c1" ] || fail "publishing again did not move v1"
  [ "$(ls "$r/api/kernels/$REPO/tree" | wc -l)" = 4 ] || fail "tree/ holds $(ls "$r/api/kernels/$REPO/tree")"
}

# The lifecycle of a package, each step read by huggingface_hub from nginx and from tk serve.
t_hub_client_nginx_matches_serve() {
  needs || return
  local r=$WORK/life c1 c2 c3
  publish "$r" 1.0.0; c1=$(head_of "$r" v1)
  start_nginx "$r" || { fail "nginx did not start"; return; }
  compare "$r" v1 main "$c1"
  # the checks tk serve is tested with, against nginx
  local f
  for f in manifest.json source.tar.gz; do
    expect_rc 0 "$PY" tests/hf_client.py "$NGINX_URL" "$WORK/hf-plain" "$REPO" "$f" \
      "$(sha256sum "$r/kernels/$REPO/resolve/$c1/$f" | cut -d' ' -f1)" "$c1"
  done
  expect_out "RevisionNotFoundError"
  # a new version moves v1 and main; the old commit stays readable when pinned
  publish "$r" 1.1.0; c2=$(head_of "$r" v1)
  [ "$c2" != "$c1" ] || fail "publishing 1.1.0 did not move v1"
  compare "$r" v1 main "$c1" "$c2"
  # a yank moves v1 back; the yanked commit stays readable when pinned
  expect_rc 0 "$TK" yank "$REPO@1.1.0" --to "$r" --key "$KEY" --reason "test" -q
  [ "$(head_of "$r" v1)" = "$c1" ] || fail "the yank did not move v1 back to $c1"
  compare "$r" v1 main "$c1" "$c2"
  # a new major moves main, not v1
  publish "$r" 2.0.0; c3=$(head_of "$r" v2)
  [ "$(head_of "$r" main)" = "$c3" ] && [ "$(head_of "$r" v1)" = "$c1" ] || fail "2.0.0 moved the wrong branches"
  compare "$r" v1 v2 main "$c2" "$c3"
  grep -q '\[crit\]\|\[emerg\]\|\[alert\]' "$WORK/nginx/error.log" && fail "nginx logged: $(grep -m3 'crit\|emerg\|alert' "$WORK/nginx/error.log")"
  stop_nginx
}

# A tree written by tk serve uploads (and a yank sent to it) is read the same through nginx.
t_tree_written_by_serve_uploads() {
  needs || return
  local srv=$WORK/srv token c1
  mkdir -p "$srv"   # (tk serve token add makes a missing root 0700, which nginx's workers cannot read)
  token=$("$TK" serve token add --org tktest --root "$srv" -q) || { fail "token add"; return; }
  expect_rc 0 "$TK" serve trust add tktest "$PUB" --root "$srv"
  start_serve "$srv" || return
  local v
  for v in 1.0.0 1.1.0; do
    make_pkg "$WORK/u-$v" $v
    expect_rc 0 "$TK" publish "$WORK/u-$v" --registry "$URL" --token "$token" --key "$KEY" -q
  done
  expect_rc 0 "$TK" yank "$REPO@1.1.0" --registry "$URL" --token "$token" --key "$KEY" -q
  stop_serve
  c1=$(head_of "$srv" v1)
  [ -n "$c1" ] && [ -f "$srv/api/kernels/$REPO/tree/v1" ] || { fail "tk serve's tree has no tree/v1"; return; }
  start_nginx "$srv" || { fail "nginx did not start"; return; }
  compare "$srv" v1 main $(ls "$srv/kernels/$REPO/resolve" | grep -E '^[0-9a-f]{40}$')
  stop_nginx
}

# A tree from a tk older than the listings (no tree/, no .etag): through nginx, tk still installs from
# it (the rules fall back to the plain file) but huggingface_hub cannot read it; publishing identical
# content, otherwise a no-op, writes what is missing and then the Hub client reads it.
t_tree_from_an_older_tk() {
  needs || return
  local r=$WORK/old c1
  publish "$r" 1.0.0; c1=$(head_of "$r" v1)
  rm -rf "$r/api/kernels/$REPO/tree" "$r/kernels/$REPO/resolve/$c1/.etag"
  start_nginx "$r" || { fail "nginx did not start"; return; }
  "$TK" trust add tktest "$PUB" -q
  TK_ENDPOINT=$NGINX_URL expect_rc 0 "$TK" get "$REPO@1"
  report nginx "$NGINX_URL" v1
  grep -q '"snapshot_download": {' "$WORK/nginx.json" && grep -A1 '"snapshot_download"' "$WORK/nginx.json" | grep -q '"error"' ||
    fail "huggingface_hub read a tree without listings: the test cannot tell the listings matter"
  make_pkg "$WORK/again" 1.0.0
  expect_rc 0 "$TK" publish "$WORK/again" --to "$r" --key "$KEY"
  expect_out "nothing to do"
  [ "$(head_of "$r" v1)" = "$c1" ] || fail "the no-op publish moved v1"
  compare "$r" v1 main "$c1"
  stop_nginx
}

run_tests
