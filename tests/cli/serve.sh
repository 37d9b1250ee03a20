#!/usr/bin/env bash
# tk serve end to end through the real tk binary: the Hub-style read API and its headers, error codes,
# tk get against the server versus file:// of the same tree, hostile paths, oversized headers, slow
# clients, tokens, signed uploads (good, tampered, untrusted, too large) and a kill -9 mid-upload.
. "$(dirname "$0")/lib.sh"

if ! "$TK" serve --help >/dev/null 2>&1; then
  echo "skip: this tk has no 'serve' command"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi

KEY=$WORK/pub.key
"$TK" keygen "$KEY" >/dev/null || { echo "keygen failed"; exit 1; }
PUB=$(cat "$KEY.pub")

# make_pkg DIR VERSION [NAME]: a small package (default "tktest/demo").
make_pkg() {
  local dir=$1 ver=$2 name=${3:-tktest/demo}
  rm -rf "$dir"; mkdir -p "$dir"
  cat >"$dir/kernel.json" <<EOF
{"name": "$name", "version": "$ver", "license": "MIT", "description": "test <i>package</i>",
 "kernels": [{"name": "scale_f32", "op": "scale", "source": "scale.cu", "symbol": "scale",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}, {"name": "n", "type": "i64", "value": "numel(out)"}],
   "launch": {"grid": ["cdiv(n, 256)"], "block": ["256"], "smem": "0"}}]}
EOF
  printf 'extern "C" __global__ void scale(float *out, long long n) { /* %s */ }\n' "$ver" >"$dir/scale.cu"
  printf '# demo %s <script>alert(1)</script>\n' "$ver" >"$dir/README.md"
}

# version_tar VERSION OUT [NAME] [KEY]: publishes a version into a scratch tree and tars its three
# files, the upload body.
version_tar() {
  local ver=$1 out=$2 name=${3:-tktest/demo} key=${4:-$KEY} t
  # a fresh tree each time (not scratch-$RANDOM: two calls drew the same number once, and the second
  # publish of 1.0.0 found 1.0.1 there)
  t=$(mktemp -d "$WORK/scratch.XXXXXX") || { fail "mktemp"; return 1; }
  rmdir "$t"
  make_pkg "$WORK/p-$ver" "$ver" "$name"
  "$TK" publish "$WORK/p-$ver" --to "$t" --key "$key" -q >/dev/null || { fail "publish $ver"; return 1; }
  (cd "$t/kernels/$name/resolve/v${ver%%.*}" && tar cf "$out" manifest.json manifest.json.sig source.tar.gz)
}

REG=$WORK/reg
make_pkg "$WORK/pkg" 1.0.0
"$TK" publish "$WORK/pkg" --to "$REG" --key "$KEY" -q >/dev/null || { echo "publish failed"; exit 1; }
COMMIT=$(readlink "$REG/kernels/tktest/demo/resolve/v1")
VDIR=$REG/kernels/tktest/demo/resolve/$COMMIT

# start_serve ROOT [OPTIONS...]: runs tk serve on a free port; sets URL and SERVE_PID.
SERVE_PID=
start_serve() {
  local root=$1; shift
  : >"$WORK/serve.log"
  : >"$WORK/serve.url"
  "$TK" serve --root "$root" --listen 127.0.0.1:0 "$@" >"$WORK/serve.url" 2>>"$WORK/serve.log" &
  SERVE_PID=$!
  URL=
  # the URL, with the port the system chose, is the one line tk serve prints on stdout
  for _ in $(seq 100); do
    URL=$(head -n 1 "$WORK/serve.url"); [ -n "$URL" ] && break; sleep 0.05
  done
  [ -n "$URL" ] || { fail "tk serve did not start: $(cat "$WORK/serve.log")"; return 1; }
  case "$URL" in http://127.0.0.1:[1-9]*) ;; *) fail "tk serve printed '$URL', not its URL"; return 1 ;; esac
}
# stop_serve: SIGTERM, then the server must exit 0 with no sanitizer report in its log.
stop_serve() {
  [ -n "$SERVE_PID" ] || return 0
  kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; local rc=$?; SERVE_PID=
  [ $rc = 0 ] || fail "tk serve exited $rc after SIGTERM"
  if grep -q -e AddressSanitizer -e LeakSanitizer -e 'runtime error' "$WORK/serve.log"; then
    fail "sanitizer report:"; sed 's/^/      /' "$WORK/serve.log" | head -40 >&2
  fi
}
trap 'stop_serve; cleanup' EXIT

# req ARGS...: curl; sets CODE, BODY (file $WORK/body) and headers in $WORK/hdr.
req() { CODE=$(curl -s -o "$WORK/body" -D "$WORK/hdr" -w '%{http_code}' "$@"); }
hdr() { tr -d '\r' <"$WORK/hdr" | sed -n "s/^$1: //Ip" | tail -n 1; }
expect_code() { [ "$CODE" = "$1" ] || fail "line ${BASH_LINENO[0]}: HTTP $CODE, want $1; body: $(head -c 300 "$WORK/body")"; }
expect_hdr() { local v; v=$(hdr "$1"); [ "$v" = "$2" ] || fail "line ${BASH_LINENO[0]}: header $1 is '$v', want '$2'"; }
sha() { sha256sum "$1" | cut -d' ' -f1; }

t_read_endpoints() {
  start_serve "$REG" || return
  local rev
  for rev in "" /revision/v1 /revision/main /revision/$COMMIT /refs; do
    req "$URL/api/kernels/tktest/demo$rev"; expect_code 200
    expect_hdr Content-Type application/json
    local f=$REG/api/kernels/tktest/demo${rev:-/index.json}
    cmp -s "$WORK/body" "$f" || fail "GET /api/kernels/tktest/demo$rev differs from $f"
    expect_hdr ETag "\"$(sha "$f")\""
  done
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["branches"][0]["targetCommit"]==sys.argv[2]' \
    "$WORK/body" "$COMMIT" || fail "refs"
  req "$URL/api/kernels/tktest/demo/revision/v1"; expect_hdr X-Repo-Commit "$COMMIT"
  req "$URL/api/kernels/tktest/demo/tree/v1"; expect_code 200; expect_hdr X-Repo-Commit "$COMMIT"
  python3 - "$WORK/body" "$VDIR" <<'EOF' || fail "tree listing"
import hashlib, json, os, sys
d = json.load(open(sys.argv[1]))
assert [e["path"] for e in d] == ["manifest.json", "manifest.json.sig", "source.tar.gz"], d
for e in d:
    data = open(os.path.join(sys.argv[2], e["path"]), "rb").read()
    assert e["type"] == "file" and e["size"] == len(data) and e["oid"] == hashlib.sha256(data).hexdigest(), e
EOF
  local f rev2
  for rev2 in v1 main "$COMMIT"; do
    for f in manifest.json manifest.json.sig source.tar.gz; do
      req "$URL/kernels/tktest/demo/resolve/$rev2/$f"; expect_code 200
      cmp -s "$WORK/body" "$VDIR/$f" || fail "resolve/$rev2/$f differs"
      expect_hdr ETag "\"$(sha "$VDIR/$f")\""
      expect_hdr X-Repo-Commit "$COMMIT"
      expect_hdr Content-Length "$(stat -c %s "$VDIR/$f")"
    done
  done
  req "$URL/index.json"; expect_code 200
  stop_serve
}

t_head_range_etag() {
  start_serve "$REG" || return
  local u=$URL/kernels/tktest/demo/resolve/v1/source.tar.gz f=$VDIR/source.tar.gz size
  size=$(stat -c %s "$f")
  req -I "$u"; expect_code 200
  [ "$(curl -s -I -o /dev/null -w '%{size_download}' "$u")" = 0 ] || fail "HEAD returned a body"
  expect_hdr Content-Length "$size"; expect_hdr ETag "\"$(sha "$f")\""; expect_hdr X-Repo-Commit "$COMMIT"
  expect_hdr Accept-Ranges bytes
  req -H "Range: bytes=10-19" "$u"; expect_code 206
  expect_hdr Content-Range "bytes 10-19/$size"; expect_hdr Content-Length 10
  cmp -s "$WORK/body" <(tail -c +11 "$f" | head -c 10) || fail "range 10-19 has the wrong bytes"
  req -H "Range: bytes=100-" "$u"; expect_code 206
  expect_hdr Content-Range "bytes 100-$((size - 1))/$size"
  cmp -s "$WORK/body" <(tail -c +101 "$f") || fail "range 100- has the wrong bytes"
  req -H "Range: bytes=-5" "$u"; expect_code 206
  cmp -s "$WORK/body" <(tail -c 5 "$f") || fail "suffix range"
  req -H "Range: bytes=$size-" "$u"; expect_code 416; expect_hdr Content-Range "bytes */$size"
  req -H "Range: bytes=99999999-" "$u"; expect_code 416
  req -H "If-None-Match: \"$(sha "$f")\"" "$u"; expect_code 304
  [ -s "$WORK/body" ] && fail "304 has a body"
  expect_hdr ETag "\"$(sha "$f")\""
  req -H "If-None-Match: \"0000\", W/\"$(sha "$f")\"" "$u"; expect_code 304
  req -H "If-None-Match: \"0000\"" "$u"; expect_code 200
  stop_serve
}

t_error_codes() {
  start_serve "$REG" || return
  req "$URL/api/kernels/tktest/nope"; expect_code 404; expect_hdr X-Error-Code RepoNotFound
  python3 -c 'import json,sys; assert "error" in json.load(open(sys.argv[1]))' "$WORK/body" || fail "error body is not JSON"
  req "$URL/kernels/nobody/nope/resolve/v1/manifest.json"; expect_code 404; expect_hdr X-Error-Code RepoNotFound
  req -I "$URL/kernels/nobody/nope/resolve/v1/manifest.json"; expect_code 404; expect_hdr X-Error-Code RepoNotFound
  req "$URL/api/kernels/tktest/demo/revision/v7"; expect_code 404; expect_hdr X-Error-Code RevisionNotFound
  req "$URL/api/kernels/tktest/demo/tree/0123456789012345678901234567890123456789"; expect_code 404
  expect_hdr X-Error-Code RevisionNotFound
  req "$URL/kernels/tktest/demo/resolve/v7/manifest.json"; expect_code 404; expect_hdr X-Error-Code RevisionNotFound
  req "$URL/kernels/tktest/demo/resolve/0123456789012345678901234567890123456789/manifest.json"; expect_code 404
  expect_hdr X-Error-Code RevisionNotFound
  req "$URL/kernels/tktest/demo/resolve/v1/nope.txt"; expect_code 404; expect_hdr X-Error-Code EntryNotFound
  req -X DELETE "$URL/api/kernels/tktest/demo"; expect_code 405
  stop_serve
}

t_get_same_as_file_endpoint() {
  start_serve "$REG" || return
  local a=$WORK/home-a b=$WORK/home-b
  mkdir -p "$a" "$b"
  TK_HOME=$a "$TK" trust add tktest "$PUB" -q; TK_HOME=$b "$TK" trust add tktest "$PUB" -q
  TK_HOME=$a TK_ENDPOINT=file://$REG expect_rc 0 "$TK" get tktest/demo
  TK_HOME=$b TK_ENDPOINT=$URL expect_rc 0 "$TK" get tktest/demo
  expect_out "installed tktest/demo 1.0.0"
  TK_HOME=$a "$TK" --json info tktest/demo >"$WORK/info-a" || fail "info a"
  TK_HOME=$b "$TK" --json info tktest/demo >"$WORK/info-b" || fail "info b"
  python3 - "$WORK/info-a" "$WORK/info-b" <<'EOF' || fail "tk get via tk serve installed something else than via file://"
import json, sys
def norm(d):
    if isinstance(d, dict):
        return {k: norm(v) for k, v in d.items() if k not in ("installed_at", "store_path", "path_in_store", "fresh", "registry")}
    if isinstance(d, list):
        return [norm(x) for x in d]
    return d
a, b = (norm(json.load(open(p))) for p in sys.argv[1:3])
assert a == b, (a, b)
EOF
  TK_HOME=$b TK_ENDPOINT=$URL expect_rc 0 "$TK" verify tktest/demo
  TK_HOME=$b TK_ENDPOINT=$URL expect_rc 3 "$TK" get tktest/nope
  stop_serve
}

t_traversal_refused() {
  local root=$WORK/trav; rm -rf "$root"; cp -a "$REG" "$root"
  local d=$root/kernels/tktest/demo/resolve/$COMMIT
  echo secret >"$WORK/secret.txt"
  ln -s "$WORK/secret.txt" "$d/evil"                       # a symlink in the tree pointing out
  ln -s "$WORK" "$root/kernels/tktest/demo/resolve/v9"       # a branch link pointing out
  start_serve "$root" || return
  "$TK" serve token add --org tktest --root "$root" -q >/dev/null
  local p
  for p in "/kernels/../../etc/passwd" "/kernels/tktest/demo/resolve/v1/../../../../../../etc/passwd" \
           "/kernels/tktest/demo/resolve/v1/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd" \
           "/kernels/tktest/demo/resolve/v1/%2E%2E%2F%2E%2E%2F%2E%2E%2F%2E%2E%2Fetc%2Fpasswd" \
           "/kernels/tktest/demo/resolve/v1/..%5c..%5c..%5cetc%5cpasswd" \
           "/kernels/tktest/demo/resolve/v1/manifest.json%00.txt" \
           "/.tk-serve/tokens.json" "/kernels/tktest/demo/resolve/v1/%2e%2e/%2e%2e/%2e%2e/%2e%2e/.tk-serve/tokens.json" \
           "/kernels/tktest/demo/resolve/v1/evil" "/kernels/tktest/demo/resolve/v9/secret.txt" \
           "/kernels/tktest/demo/resolve/.tmp-x/manifest.json" "/api/kernels/tktest/demo/revision/..%2f..%2f..%2findex.json"; do
    req --path-as-is "$URL$p"
    case $CODE in 200|206) fail "GET $p answered $CODE";; esac
    grep -q -e root: -e secret -e sha256 "$WORK/body" && fail "GET $p leaked: $(head -c 200 "$WORK/body")"
  done
  # the server still works
  req "$URL/kernels/tktest/demo/resolve/v1/manifest.json"; expect_code 200
  stop_serve
}

# Symlinks that stay inside the tree are followed, as before the fast path (which refuses every
# symlink and leaves such a file to the slow path): a relative one and an absolute one.
t_symlinks_inside_tree_served() {
  local root=$WORK/links; rm -rf "$root"; cp -a "$REG" "$root"
  local d=$root/kernels/tktest/demo/resolve/$COMMIT
  ln -s manifest.json "$d/rel-alias"
  ln -s "$d/manifest.json" "$d/abs-alias"
  start_serve "$root" || return
  local p
  for p in "resolve/v1/rel-alias" "resolve/v1/abs-alias" "resolve/$COMMIT/abs-alias"; do
    req "$URL/kernels/tktest/demo/$p"; expect_code 200
    cmp -s "$WORK/body" "$d/manifest.json" || fail "$p: not the manifest's bytes"
    expect_hdr ETag "\"$(sha "$d/manifest.json")\""
  done
  expect_hdr X-Repo-Commit "$COMMIT"
  # HEAD and a Range of a small file (sent from memory) and of a big one (sendfile)
  head -c 200000 /dev/urandom >"$d/big.bin"
  for p in manifest.json big.bin; do
    local size; size=$(stat -c %s "$d/$p")
    req -I "$URL/kernels/tktest/demo/resolve/v1/$p"; expect_code 200; expect_hdr Content-Length "$size"
    req -r 5-104 "$URL/kernels/tktest/demo/resolve/v1/$p"; expect_code 206
    cmp -s "$WORK/body" <(tail -c +6 "$d/$p" | head -c 100) || fail "$p: the range is not bytes 5-104"
    req "$URL/kernels/tktest/demo/resolve/v1/$p"; expect_code 200; cmp -s "$WORK/body" "$d/$p" || fail "$p differs"
  done
  grep -q '^[0-9TZ:-]* 127.0.0.1 "GET /kernels/tktest/demo/resolve/v1/big.bin" 200 200000 [0-9]*\.[0-9]ms$' "$WORK/serve.log" \
    || fail "no access log line for big.bin: $(grep big.bin "$WORK/serve.log" | tail -n 1)"
  stop_serve
}

t_oversized_header_and_slow_clients() {
  start_serve "$REG" --timeout 2 || return
  local port=${URL##*:}
  python3 - "$port" <<'EOF' || fail "oversized header or slow clients disturbed the server"
import socket, sys, time, threading, urllib.request
port = int(sys.argv[1])
url = "http://127.0.0.1:%d/kernels/tktest/demo/resolve/v1/manifest.json" % port
def ok_fast():
    t = time.time()
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200 and len(r.read()) > 0
    return time.time() - t
# 1. An oversized header: 431, or the connection closed; never served.
big = socket.create_connection(("127.0.0.1", port))
big.sendall(b"GET /kernels/tktest/demo/resolve/v1/manifest.json HTTP/1.1\r\nHost: x\r\nX-Big: ")
stop = threading.Event()
def pump():
    try:
        while not stop.is_set():
            big.sendall(b"a" * 4096)
    except OSError:
        pass
th = threading.Thread(target=pump); th.start()
assert ok_fast() < 2, "a normal request was slow while a huge header was being sent"
time.sleep(0.3); stop.set()
big.settimeout(3)
try:
    resp = big.recv(200)
except (ConnectionResetError, socket.timeout):
    resp = b""
th.join()
assert resp == b"" or b" 431 " in resp.split(b"\r\n")[0], resp
# 2. Slow clients: half a request each, held open.
slow = []
for _ in range(16):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /kernels/tktest/demo/resolve/v1/manifest.json HTTP/1.1\r\nHost: x\r\n")
    slow.append(s)
for _ in range(5):
    d = ok_fast()
    assert d < 1.0, "a normal request took %.2fs while slow clients were connected" % d
# 3. The connection timeout (2 s) closes them.
t = time.time()
slow[0].settimeout(8)
try:
    got = slow[0].recv(100)
except ConnectionResetError:
    got = b""
assert got == b"" and time.time() - t < 7, (got, time.time() - t)
EOF
  stop_serve
}

# --max-connections holds over all threads: past it a new connection is closed (and logged once a
# second), below it none is, however the threads share them out.
t_connection_limit() {
  start_serve "$REG" --max-connections 6 --threads 4 || return
  local port=${URL##*:}
  python3 - "$port" <<'EOF' || fail "the connection limit"
import socket, sys, time
port = int(sys.argv[1])
req = b"GET /kernels/tktest/demo/resolve/v1/manifest.json HTTP/1.1\r\nHost: x\r\n\r\n"
def get(s):
    s.settimeout(3); s.sendall(req)
    try:
        return s.recv(100)
    except (ConnectionResetError, socket.timeout):
        return b""
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
for s in held:   # all six are served, whichever thread took them
    assert get(s).startswith(b"HTTP/1.1 200"), "a connection under the limit was not served"
extra = socket.create_connection(("127.0.0.1", port))
assert get(extra) == b"", "the 7th connection was served"
held.pop().close(); time.sleep(0.3)
again = socket.create_connection(("127.0.0.1", port))
assert get(again).startswith(b"HTTP/1.1 200"), "no room after a connection closed"
EOF
  grep -q "6 connections open, the most allowed" "$WORK/serve.log" || fail "the refusal is not logged"
  stop_serve
}

# 128 requests readable at once on the one HTTP thread are all answered at once (libmicrohttpd's
# epoll loop held them for the connection timeout: the server uses poll)
t_burst_of_128_requests() {
  start_serve "$REG" --threads 1 --timeout 60 --max-per-ip 200 || return
  python3 "$ROOT/tests/http_burst.py" "$URL" "$SERVE_PID" 128 /kernels/tktest/demo/resolve/v1/manifest.json ||
    fail "a burst of 128 requests: see above"
  stop_serve
}

# A server tree with a token for tktest and the test key trusted.
SRV=
server_tree() {
  SRV=$WORK/srv-$1; rm -rf "$SRV"
  TOKEN=$("$TK" serve token add --org tktest --root "$SRV" -q) || fail "token add"
  [ ${#TOKEN} = 64 ] || fail "the token is not 64 hex: $TOKEN"
  expect_rc 0 "$TK" serve trust add tktest "$PUB" --root "$SRV"   # the syntax of tk trust add
  grep -q "$TOKEN" "$SRV/.tk-serve/tokens.json" && fail "the token itself was stored"
}
upload() { req -T "$1" -H "Authorization: Bearer $2" "$URL/api/upload/${3:-tktest/demo}"; }

t_upload_auth() {
  server_tree auth; start_serve "$SRV" || return
  version_tar 1.0.0 "$WORK/up.tar" || return
  req -T "$WORK/up.tar" "$URL/api/upload/tktest/demo"; expect_code 401; expect_hdr X-Error-Code Unauthorized
  upload "$WORK/up.tar" 0000000000000000000000000000000000000000000000000000000000000000; expect_code 401
  local other; other=$("$TK" serve token add --org other --root "$SRV" -q)
  upload "$WORK/up.tar" "$other"; expect_code 403; expect_hdr X-Error-Code Forbidden
  [ -e "$SRV/kernels/tktest/demo" ] && fail "a refused upload created the package"
  req -X GET -H "Authorization: Bearer $TOKEN" "$URL/api/upload/tktest/demo"; expect_code 405
  expect_rc 2 "$TK" serve token add --root "$SRV"
  expect_rc 2 "$TK" serve trust add --org tktest --root "$SRV"
  expect_rc 2 "$TK" serve --listen 127.0.0.1:0
  stop_serve
}

t_admin_token_and_trust_lifecycle() {
  server_tree admin
  # lists: text and JSON; the token's id is the start of its sha256, never the token
  local id; id=$(printf %s "$TOKEN" | sha256sum | cut -c1-16)
  expect_rc 0 "$TK" serve token list --root "$SRV"; expect_out "$id"; expect_out "tktest"; expect_no_out "$TOKEN"
  expect_rc 0 "$TK" --json serve token list --root "$SRV"
  echo "$OUT" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert [t["id"] for t in d] == [sys.argv[1]] and d[0]["org"] == "tktest", d' "$id" \
    || fail "token list --json: $OUT"
  expect_rc 0 "$TK" serve trust list --root "$SRV"; expect_out "tktest"; expect_out "$PUB"
  local keyid; keyid=$("$TK" --json serve trust list --root "$SRV" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["keyid"])')
  # an upload works, then the token is revoked: refused (401); a new token, but the key removed: 403
  start_serve "$SRV" || return
  version_tar 1.0.0 "$WORK/adm1.tar" || return
  upload "$WORK/adm1.tar" "$TOKEN"; expect_code 201
  expect_rc 0 "$TK" serve token revoke "$id" --root "$SRV"
  expect_rc 3 "$TK" serve token revoke "$id" --root "$SRV"; expect_out "no token $id"
  expect_rc 2 "$TK" serve token revoke not-an-id --root "$SRV"
  version_tar 1.0.1 "$WORK/adm2.tar" || return
  upload "$WORK/adm2.tar" "$TOKEN"; expect_code 401
  local t2; t2=$("$TK" serve token add tktest --root "$SRV" -q)
  expect_rc 0 "$TK" serve trust remove tktest "$keyid" --root "$SRV"
  expect_rc 3 "$TK" serve trust remove tktest "$keyid" --root "$SRV"
  upload "$WORK/adm2.tar" "$t2"; expect_code 403; expect_hdr X-Error-Code UntrustedSigner
  # trusted again: accepted
  expect_rc 0 "$TK" serve trust add tktest "$PUB" --root "$SRV"
  upload "$WORK/adm2.tar" "$t2"; expect_code 201
  # revoking by the token itself works too
  expect_rc 0 "$TK" serve token revoke "$t2" --root "$SRV"
  expect_rc 0 "$TK" --json serve token list --root "$SRV"; expect_out "[]"
  stop_serve
}

t_listen_port_zero_prints_url() {
  local root=$WORK/lz; mkdir -p "$root"
  "$TK" serve --root "$root" --listen :0 >"$WORK/lz.url" 2>"$WORK/lz.log" &
  local pid=$! u=
  for _ in $(seq 100); do u=$(head -n 1 "$WORK/lz.url"); [ -n "$u" ] && break; sleep 0.05; done
  case "$u" in http://127.0.0.1:[1-9]*) ;; *) fail "--listen :0 printed '$u'" ;; esac
  [ "$(wc -l <"$WORK/lz.url")" = 1 ] || fail "more than the URL on stdout: $(cat "$WORK/lz.url")"
  curl -fsS -o /dev/null "$u/" || fail "the printed URL does not answer"
  kill "$pid"; wait "$pid" 2>/dev/null
}

t_upload_publish_and_get() {
  server_tree pub; start_serve "$SRV" || return
  version_tar 1.0.0 "$WORK/up1.tar" || return
  upload "$WORK/up1.tar" "$TOKEN"; expect_code 201
  expect_hdr X-Repo-Commit "$COMMIT"   # same files, same parent: the same commit as tk publish made
  upload "$WORK/up1.tar" "$TOKEN"; expect_code 200   # identical: a no-op
  diff -r "$REG/kernels" "$SRV/kernels" >/dev/null || fail "the uploaded tree differs from tk publish's"
  # the versions documents differ only in the publish dates (each records when it saw the commit)
  diff -r -x versions "$REG/api" "$SRV/api" >/dev/null || fail "the uploaded api docs differ from tk publish's"
  python3 -c 'import json, sys
strip = lambda p: [dict(v, published=None) for v in json.load(open(p))["versions"]]
sys.exit(strip(sys.argv[1]) != strip(sys.argv[2]))' "$REG/api/kernels/tktest/demo/versions" "$SRV/api/kernels/tktest/demo/versions" \
    || fail "the uploaded versions document differs from tk publish's"
  version_tar 1.0.1 "$WORK/up2.tar" || return
  upload "$WORK/up2.tar" "$TOKEN"; expect_code 201
  local c2; c2=$(hdr X-Repo-Commit)
  [ "$(readlink "$SRV/kernels/tktest/demo/resolve/v1")" = "$c2" ] || fail "branch v1 did not move"
  upload "$WORK/up1.tar" "$TOKEN"; expect_code 409; expect_hdr X-Error-Code VersionConflict
  version_tar 2.0.0 "$WORK/up3.tar" || return
  upload "$WORK/up3.tar" "$TOKEN"; expect_code 201
  "$TK" trust add tktest "$PUB" -q
  TK_ENDPOINT=$URL expect_rc 0 "$TK" get tktest/demo@1
  expect_out "1.0.1"
  TK_ENDPOINT=$URL expect_rc 0 "$TK" get tktest/demo
  expect_out "2.0.0"
  req "$URL/"; expect_code 200
  grep -q 'name=viewport' "$WORK/body" || fail "page: no viewport meta"
  grep -q 'tktest/demo' "$WORK/body" || fail "page: no package"
  grep -q '2.0.0' "$WORK/body" && grep -q '1.0.1' "$WORK/body" || fail "page: versions missing"
  grep -q '<code>scale</code>' "$WORK/body" || fail "page: op missing"
  grep -q "$("$TK" --json trust list | python3 -c 'import json,sys; print([k["keyid"] for k in json.load(sys.stdin) if k["org"] == "tktest"][0])')" "$WORK/body" \
    || fail "page: signer fingerprint missing"
  # the README is Markdown: its heading rendered, its raw <script> dropped (t_page_readme_markdown)
  grep -q '<h1>demo 2.0.0 .*alert(1)' "$WORK/body" || fail "page: README missing or not rendered"
  grep -q '<script>' "$WORK/body" && fail "page: unescaped HTML"
  # the search box, and searches by name, op and description; a query matching nothing says so
  grep -q '<input type=search name=q' "$WORK/body" || fail "page: no search box"
  req "$URL/?q=DEMO"; grep -q 'id="tktest/demo"' "$WORK/body" || fail "search by name (any case)"
  req "$URL/?q=scale"; grep -q 'id="tktest/demo"' "$WORK/body" || fail "search by op"
  req "$URL/?q=no+such%20thing"; grep -q 'id="tktest/demo"' "$WORK/body" && fail "search matched nothing, but listed demo"
  grep -q 'No package matches <code>no such thing</code>' "$WORK/body" || fail "search: no 'no match' line"
  req "$URL/?q=%3Cscript%3E"; grep -q '<script>' "$WORK/body" && fail "search: query echoed unescaped"
  # the package's own page: its kernels table and the README open
  req "$URL/?p=tktest/demo"; expect_code 200
  grep -q '<h3>kernels (' "$WORK/body" || fail "package page: no kernels table"
  grep -q '<td data-l=op>scale</td>' "$WORK/body" || fail "package page: kernel row lacks its op"
  grep -q '<h3>README</h3>' "$WORK/body" || fail "package page: README not shown"
  grep -q '<a href="/?p=tktest/demo">' "$WORK/body" || fail "package page: no link"
  req "$URL/"
  # the publisher's public key as a line to copy
  grep -q "tk trust add tktest $PUB</pre>" "$WORK/body" || fail "page: no 'tk trust add' line with the key"
  # the TK_ENDPOINT line names the address the page was fetched from, https behind a TLS proxy
  grep -q "export TK_ENDPOINT=$URL<" "$WORK/body" || fail "page: TK_ENDPOINT line is not $URL"
  req -H 'Host: kernels.example.com' -H 'X-Forwarded-Proto: https' "$URL/"
  grep -q 'export TK_ENDPOINT=https://kernels.example.com<' "$WORK/body" || fail "page: proxied TK_ENDPOINT line"
  req -H 'Host: "><script>x' "$URL/"
  grep -q '<script>x' "$WORK/body" && fail "page: Host header injected"
  grep -q "TK_ENDPOINT=&lt;this page's address&gt;" "$WORK/body" || fail "page: bad Host not replaced"
  grep -q '"GET / HTTP\|"GET /"' "$WORK/serve.log" || fail "no request log line"
  stop_serve
}

# The package page renders the README's Markdown with cmark's safe mode: headings, code, links; never
# raw HTML, never a javascript: link.
t_page_readme_markdown() {
  server_tree md; start_serve "$SRV" || return
  make_pkg "$WORK/md" 1.0.0
  cat >"$WORK/md/README.md" <<'EOF'
# Fast scale

Scales a tensor. See [the docs](https://example.com/docs) and [this](javascript:alert(1)).

```c
scale(out, n);
```

<script>alert("raw")</script>
<a href="javascript:alert(2)">raw link</a>
<img src=x onerror="alert(3)">
EOF
  "$TK" -q publish "$WORK/md" --registry "$URL" --token "$TOKEN" --key "$KEY" >/dev/null || { fail "publish"; return; }
  local view
  for view in "/?p=tktest/demo" "/"; do
    req "$URL$view"; expect_code 200
    grep -q '<h1>Fast scale</h1>' "$WORK/body" || fail "$view: README heading not rendered"
    grep -q '<pre><code class="language-c">scale(out, n);' "$WORK/body" || fail "$view: code block not rendered"
    grep -q '<a href="https://example.com/docs">the docs</a>' "$WORK/body" || fail "$view: link not rendered"
    grep -qi '<script' "$WORK/body" && fail "$view: raw <script> reached the page"
    grep -qi 'javascript:' "$WORK/body" && fail "$view: a javascript: link reached the page"
    grep -qi 'onerror' "$WORK/body" && fail "$view: raw HTML attributes reached the page"
  done
  req "$URL/?p=tktest/demo"; grep -q '<h3>README</h3><div class=readme><h1>Fast scale' "$WORK/body" \
    || fail "package page: the README is not open under its heading"
  # a README that is not Markdown stays preformatted text
  make_pkg "$WORK/txt" 1.0.1; rm "$WORK/txt/README.md"; printf '# not a heading\n<b>x</b>\n' >"$WORK/txt/README.txt"
  "$TK" -q publish "$WORK/txt" --registry "$URL" --token "$TOKEN" --key "$KEY" >/dev/null || { fail "publish txt"; return; }
  req "$URL/?p=tktest/demo"
  grep -q '<pre># not a heading' "$WORK/body" && grep -q '&lt;b&gt;x&lt;/b&gt;' "$WORK/body" || fail "README.txt not shown as text"
  stop_serve
}

t_publish_registry_client() {
  server_tree client; start_serve "$SRV" || return
  make_pkg "$WORK/c1" 1.0.0
  expect_rc 0 "$TK" --json publish "$WORK/c1" --registry "$URL" --token "$TOKEN" --key "$KEY"
  expect_out '"created": true'
  local c; c=$(readlink "$SRV/kernels/tktest/demo/resolve/v1")
  expect_out "$c"
  [ "$c" = "$COMMIT" ] || fail "the server wrote $c, tk publish --to wrote $COMMIT for the same files"
  TK_TOKEN=$TOKEN expect_rc 0 "$TK" publish "$WORK/c1" --registry "$URL/" --key "$KEY"
  expect_out "already published"
  # refusals come back with the server's reason and the matching exit status
  expect_rc 2 "$TK" publish "$WORK/c1" --registry "$URL" --key "$KEY"
  expect_out "needs a token"
  expect_out "tk serve token add"
  expect_rc 9 "$TK" publish "$WORK/c1" --registry "$URL" --token "$(printf '0%.0s' $(seq 64))" --key "$KEY"
  expect_out "401"
  expect_out "not valid on this server"
  "$TK" keygen "$WORK/stranger.key" >/dev/null
  make_pkg "$WORK/c2" 1.1.0
  expect_rc 5 "$TK" publish "$WORK/c2" --registry "$URL" --token "$TOKEN" --key "$WORK/stranger.key"
  expect_out "UntrustedSigner"
  make_pkg "$WORK/c3" 1.0.0; echo "// changed" >>"$WORK/c3/scale.cu"
  expect_rc 5 "$TK" publish "$WORK/c3" --registry "$URL" --token "$TOKEN" --key "$KEY"
  expect_out "VersionConflict"
  expect_rc 2 "$TK" publish "$WORK/c1" --registry "$URL" --to "$WORK/x" --key "$KEY"
  expect_rc 2 "$TK" publish "$WORK/c1" --registry "file://$REG" --token "$TOKEN" --key "$KEY"
  expect_out "--to DIR"
  # concurrent publishes to one package: serialised by the server, none lost
  local pids=() v
  for v in 2.0.0 3.0.0 4.0.0 1.2.0; do
    make_pkg "$WORK/cc-$v" "$v"
    "$TK" -q publish "$WORK/cc-$v" --registry "$URL" --token "$TOKEN" --key "$KEY" >"$WORK/cc-$v.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail "a concurrent publish failed: $(cat "$WORK"/cc-*.out)"; done
  req "$URL/api/kernels/tktest/demo/refs"; expect_code 200
  for v in v1 v2 v3 v4; do grep -q "\"$v\"" "$WORK/body" || fail "branch $v missing after concurrent publishes"; done
  "$TK" trust add tktest "$PUB" -q
  TK_ENDPOINT=$URL expect_rc 0 "$TK" get tktest/demo@1
  expect_out "1.2.0"
  stop_serve
}

# The Hub's own Python client (huggingface_hub from PyPI; `scripts/setup.sh --test` installs it in
# the test venv, $TK_PY_VENV) downloads a file and lists refs from tk serve: the protocol is the Hub's.
t_huggingface_hub_client() {
  local py=${TK_HF_PYTHON:-$TK_PY_VENV/bin/python}
  if ! py_has "$py" huggingface_hub; then
    [ -n "${CI:-}" ] && { fail "huggingface_hub is not installed in $py (scripts/setup.sh --test)"; return; }
    skip "no huggingface_hub venv ($py); run scripts/setup.sh --test"; return
  fi
  start_serve "$REG" || return
  local f
  for f in manifest.json source.tar.gz; do
    HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_ETAG_TIMEOUT=10 HF_TOKEN= \
      expect_rc 0 "$py" tests/hf_client.py "$URL" "$WORK/hf-cache" tktest/demo "$f" "$(sha "$VDIR/$f")" "$COMMIT"
  done
  expect_out "RevisionNotFoundError"
  stop_serve
}

# The page at / in headless Chromium (Debian's package), at a phone's width and a desktop's: the
# screenshots must have the requested size, show content (not blank, not one blot) across the width.
# They are kept in the test logs (page-phone.png, page-desktop.png) for a human to look at.
t_page_in_headless_chromium() {
  local chrome; chrome=$(command -v chromium || command -v chromium-browser || true)
  if [ -z "$chrome" ]; then
    [ -n "${CI:-}" ] && { fail "chromium is not installed (scripts/setup.sh --test)"; return; }
    skip "no chromium; run scripts/setup.sh --test"; return
  fi
  server_tree page; start_serve "$SRV" || return
  version_tar 1.0.0 "$WORK/pg1.tar" && upload "$WORK/pg1.tar" "$TOKEN"
  version_tar 2.0.0 "$WORK/pg2.tar" && upload "$WORK/pg2.tar" "$TOKEN"
  local logs=$B/test-logs size shot
  mkdir -p "$logs"
  # the list and (phone) the package's own page with its kernels table
  for size in phone:390,844 desktop:1280,900 pkg-phone:390,844; do
    local path=/; [ "${size%%:*}" = pkg-phone ] && path="/?p=tktest/demo"
    shot=$logs/page-${size%%:*}.png; rm -f "$shot"
    timeout 60 "$chrome" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
      --user-data-dir="$WORK/chrome-profile" --window-size="${size#*:}" --screenshot="$shot" "$URL$path" \
      >"$WORK/chrome.log" 2>&1
    [ -s "$shot" ] || { fail "no screenshot from $chrome: $(tail -n 5 "$WORK/chrome.log")"; continue; }
    python3 tests/png_check.py "$shot" "$(echo "${size#*:}" | cut -d, -f1)" "$(echo "${size#*:}" | cut -d, -f2)" \
      || fail "screenshot $shot failed its check"
  done
  timeout 60 "$chrome" --headless=new --no-sandbox --disable-gpu --user-data-dir="$WORK/chrome-profile" \
    --dump-dom "$URL/" >"$WORK/dom.html" 2>/dev/null
  grep -q "tktest/demo" "$WORK/dom.html" || fail "the DOM Chromium rendered lacks the package"
  stop_serve
}

t_yank_over_http() {
  server_tree yank; start_serve "$SRV" || return
  local v
  for v in 1.0.0 1.0.1; do make_pkg "$WORK/yv-$v" "$v"
    "$TK" -q publish "$WORK/yv-$v" --registry "$URL" --token "$TOKEN" --key "$KEY" >/dev/null || fail "publish $v"; done
  local c100; c100=$(ls "$SRV/kernels/tktest/demo/resolve" | while read -r d; do
    [ -f "$SRV/kernels/tktest/demo/resolve/$d/manifest.json" ] && grep -q '"1.0.0"' "$SRV/kernels/tktest/demo/resolve/$d/manifest.json" && echo "$d"; done | head -n 1)
  "$TK" trust add tktest "$PUB" -q
  TK_ENDPOINT=$URL expect_rc 0 "$TK" get tktest/demo
  expect_out "1.0.1"
  "$TK" keygen "$WORK/stranger.key" >/dev/null
  expect_rc 5 "$TK" yank tktest/demo@1.0.1 --registry "$URL" --token "$TOKEN" --key "$WORK/stranger.key"
  expect_out "UntrustedSigner"
  expect_rc 9 "$TK" yank tktest/demo@1.0.1 --registry "$URL" --token "$(printf '0%.0s' $(seq 64))" --key "$KEY"
  expect_rc 0 "$TK" --json yank tktest/demo@1.0.1 --registry "$URL" --token "$TOKEN" --key "$KEY" --reason "bad build"
  expect_out "\"branch_commit\": \"$c100\""
  req "$URL/api/kernels/tktest/demo/revision/v1"; expect_code 200; expect_hdr X-Repo-Commit "$c100"
  req "$URL/kernels/tktest/demo/yanked/1.0.1.json"; expect_code 200
  grep -q '"bad build"' "$WORK/body" || fail "the yank statement is not served"
  req "$URL/kernels/tktest/demo/yanked/9.9.9.json"; expect_code 404
  # the page lists every version, the yanked one marked
  req "$URL/"; expect_code 200
  grep -q 'versions: <s>1.0.1</s> (yanked), 1.0.0' "$WORK/body" || fail "page: versions line: $(grep -o 'versions: [^<]*<[^p]*' "$WORK/body")"
  TK_ENDPOINT=$URL expect_rc 0 "$TK" get tktest/demo
  expect_out "yanked by its publisher (bad build)"
  expect_out "1.0.0"
  version_tar 1.0.1 "$WORK/again.tar" || return
  upload "$WORK/again.tar" "$TOKEN"; expect_code 409
  stop_serve
}

t_upload_bad_content_refused() {

  server_tree bad; start_serve "$SRV" || return
  version_tar 1.0.0 "$WORK/good.tar" || return
  local x=$WORK/x; rm -rf "$x"; mkdir -p "$x"; tar xf "$WORK/good.tar" -C "$x"
  # tampered manifest
  sed -i 's/test <i>package/evil <i>package/' "$x/manifest.json"
  (cd "$x" && tar cf "$WORK/t.tar" manifest.json manifest.json.sig source.tar.gz)
  upload "$WORK/t.tar" "$TOKEN"; expect_code 422; expect_hdr X-Error-Code SignatureInvalid
  # re-signed by an untrusted key
  "$TK" keygen "$WORK/evil.key" >/dev/null
  sign_file "$WORK/evil.key" "$x/manifest.json"
  (cd "$x" && tar cf "$WORK/t.tar" manifest.json manifest.json.sig source.tar.gz)
  upload "$WORK/t.tar" "$TOKEN"; expect_code 403; expect_hdr X-Error-Code UntrustedSigner
  grep -q "tk serve trust add" "$WORK/body" || fail "no hint on how to trust the signer"
  # validly signed, wrong archive
  tar xf "$WORK/good.tar" -C "$x"; echo junk >>"$x/source.tar.gz"
  (cd "$x" && tar cf "$WORK/t.tar" manifest.json manifest.json.sig source.tar.gz)
  upload "$WORK/t.tar" "$TOKEN"; expect_code 422; expect_hdr X-Error-Code DigestMismatch
  # another package's version uploaded to this name
  version_tar 1.0.0 "$WORK/o.tar" tktest/other || return
  upload "$WORK/o.tar" "$TOKEN"; expect_code 422; expect_hdr X-Error-Code ManifestInvalid
  # a manifest signed by a trusted key whose files do not match the archive
  tar xf "$WORK/good.tar" -C "$x"
  python3 - "$x/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["files"][0]["sha256"] = "0" * 64
open(sys.argv[1], "w").write(json.dumps(m, indent=2) + "\n")
EOF
  sign_file "$KEY" "$x/manifest.json"
  (cd "$x" && tar cf "$WORK/t.tar" manifest.json manifest.json.sig source.tar.gz)
  upload "$WORK/t.tar" "$TOKEN"; expect_code 422
  # not the three files
  tar xf "$WORK/good.tar" -C "$x"; echo hi >"$x/extra"
  (cd "$x" && tar cf "$WORK/t.tar" manifest.json manifest.json.sig source.tar.gz extra)
  upload "$WORK/t.tar" "$TOKEN"; expect_code 400
  (cd "$x" && tar cf "$WORK/t.tar" manifest.json source.tar.gz)
  upload "$WORK/t.tar" "$TOKEN"; expect_code 400
  echo "not a tar" >"$WORK/t.tar"; upload "$WORK/t.tar" "$TOKEN"; expect_code 400
  [ -z "$(ls -A "$SRV/kernels/tktest/demo/resolve" 2>/dev/null)" ] || fail "a refused upload left files in the tree"
  [ -e "$SRV/api/kernels/tktest/demo" ] && fail "a refused upload wrote api docs"
  [ -z "$(ls -A "$SRV/.tk-serve/tmp" 2>/dev/null)" ] || fail "temp files left behind"
  stop_serve
}

# A validly signed upload that tk publish would have refused (a hand-made one, or from an older client):
# the server runs the publish-time checks, answers 422 naming the kernel and the field, writes nothing.
t_upload_publish_checks() {
  server_tree checks; start_serve "$SRV" || return
  version_tar 1.0.0 "$WORK/good.tar" || return
  local x=$WORK/xc case
  for case in launch-tensor misspelt-key missing-source; do
    rm -rf "$x"; mkdir -p "$x"; tar xf "$WORK/good.tar" -C "$x"
    python3 - "$x/manifest.json" "$case" <<'EOF'
import json, sys
path, case = sys.argv[1], sys.argv[2]
m = json.load(open(path)); k = m["kernels"][0]
if case == "launch-tensor":
    k["launch"]["grid"] = ["cdiv(numel(outt), 256)"]
elif case == "misspelt-key":
    k["lanuch"] = k.pop("launch")
else:
    k["source"] = "gone.cu"
open(path, "w").write(json.dumps(m, indent=2) + "\n")
EOF
    sign_file "$KEY" "$x/manifest.json"
    (cd "$x" && tar cf "$WORK/t.tar" manifest.json manifest.json.sig source.tar.gz)
    upload "$WORK/t.tar" "$TOKEN"; expect_code 422; expect_hdr X-Error-Code ManifestInvalid
    local msg; msg=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"])' "$WORK/body")
    case $case in
      launch-tensor) OUT=$msg; expect_out "kernel 'scale_f32'"; expect_out "launch.grid[0]"; expect_out "outt" ;;
      misspelt-key) OUT=$msg; expect_out "lanuch"; expect_out "did you mean 'launch'" ;;
      missing-source) OUT=$msg; expect_out "kernel 'scale_f32'"; expect_out "gone.cu" ;;
    esac
    OUT=$msg; expect_out "tktest/demo 1.0.0: not published"
  done
  [ -e "$SRV/kernels/tktest" ] && fail "a refused upload wrote into the tree: $(find "$SRV/kernels" | head)"
  [ -e "$SRV/api/kernels/tktest" ] && fail "a refused upload wrote api docs"
  [ -z "$(ls -A "$SRV/.tk-serve/tmp" 2>/dev/null)" ] || fail "temp files left behind"
  grep -q "upload to tktest/demo refused: .*outt" "$WORK/serve.log" || fail "the refusal is not logged"
  # the good upload still goes in
  upload "$WORK/good.tar" "$TOKEN"; expect_code 201
  stop_serve
}

t_upload_too_large() {
  server_tree big; start_serve "$SRV" --max-upload 2000 || return
  version_tar 1.0.0 "$WORK/up.tar" || return
  upload "$WORK/up.tar" "$TOKEN"; expect_code 413; expect_hdr X-Error-Code PayloadTooLarge
  # chunked (no Content-Length): the connection is dropped past the cap
  CODE=$(curl -s -o /dev/null -w '%{http_code}' -H "Transfer-Encoding: chunked" -H "Authorization: Bearer $TOKEN" \
    --data-binary @"$WORK/up.tar" -X PUT "$URL/api/upload/tktest/demo")
  case $CODE in 2*) fail "a chunked upload over the cap was accepted ($CODE)";; esac
  [ -e "$SRV/kernels/tktest/demo/resolve/v1" ] && fail "an oversized upload was published"
  req "$URL/"; expect_code 200
  stop_serve
}

t_kill_during_upload_leaves_no_version() {
  server_tree kill; start_serve "$SRV" || return
  version_tar 1.0.0 "$WORK/up1.tar" || return
  upload "$WORK/up1.tar" "$TOKEN"; expect_code 201
  local before; before=$(find "$SRV" -path "$SRV/.tk-serve" -prune -o -print | sort | md5sum)
  version_tar 1.0.1 "$WORK/up2.tar" || return
  # Send the headers and half the body, then kill -9 the server.
  python3 - "${URL##*:}" "$WORK/up2.tar" "$TOKEN" <<'EOF' &
import socket, sys, time
port, path, token = int(sys.argv[1]), sys.argv[2], sys.argv[3]
body = open(path, "rb").read()
s = socket.create_connection(("127.0.0.1", port))
s.sendall(("PUT /api/upload/tktest/demo HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
           "Content-Length: %d\r\n\r\n" % (token, len(body))).encode() + body[: len(body) // 2])
time.sleep(3)
EOF
  local py=$!
  for _ in $(seq 50); do [ -n "$(ls -A "$SRV/.tk-serve/tmp" 2>/dev/null)" ] && break; sleep 0.05; done
  [ -n "$(ls -A "$SRV/.tk-serve/tmp" 2>/dev/null)" ] || fail "the upload never started"
  kill -9 "$SERVE_PID"; wait "$SERVE_PID" 2>/dev/null; SERVE_PID=
  kill "$py" 2>/dev/null; wait "$py" 2>/dev/null
  local after; after=$(find "$SRV" -path "$SRV/.tk-serve" -prune -o -print | sort | md5sum)
  [ "$before" = "$after" ] || fail "a killed upload changed the tree"
  start_serve "$SRV" || return
  [ -z "$(ls -A "$SRV/.tk-serve/tmp" 2>/dev/null)" ] || fail "a restart did not clear the dead upload"
  req "$URL/api/kernels/tktest/demo/refs"; expect_code 200
  grep -q "$COMMIT" "$WORK/body" || fail "refs lost the published version"
  upload "$WORK/up2.tar" "$TOKEN"; expect_code 201   # and the same upload works afterwards
  stop_serve
}

run_tests
