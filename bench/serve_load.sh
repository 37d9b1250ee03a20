#!/usr/bin/env bash
# serve_load.sh — tk serve under load: wrk with N connections (default 200) downloads a package's
# source archive for D seconds (default 30) from a tk serve on loopback while a publisher uploads new
# versions of that same package in a loop (so the branch being downloaded moves under the readers).
# Prints wrk's report (latency percentiles, requests/s, transfer/s, errors) and the publish count;
# exits 1 when any request failed (socket errors or non-2xx) or any publish failed.
#
#   bash bench/serve_load.sh [CONNECTIONS] [SECONDS] [THREADS]   (TK_LOAD_PKG=flash-attn: a bigger archive)
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}; TK=$B/tk
CONNS=${1:-200}; SECS=${2:-30}; WRK_THREADS=${3:-2}
command -v wrk >/dev/null || { echo "serve_load: wrk is not installed (scripts/setup.sh --test)"; exit 1; }
W=$(mktemp -d /tmp/tk-load.XXXXXX)
SRV_PID=
trap '[ -n "$SRV_PID" ] && kill $SRV_PID 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT

export TK_HOME=$W/home
"$TK" keygen "$W/key" >/dev/null
mkpkg() { # mkpkg DIR VERSION: the activation package's sources renamed tktest/load
  rm -rf "$1"; cp -r "kernels-src/${TK_LOAD_PKG:-activation}" "$1"
  python3 - "$1/kernel.json" "$2" <<'PY'
import json, sys
p, v = sys.argv[1], sys.argv[2]
m = json.load(open(p)); m["name"] = "tktest/load"; m["version"] = v
json.dump(m, open(p, "w"), indent=1)
PY
}
mkpkg "$W/pkg" 1.0.0
TOKEN=$("$TK" serve token add --org tktest --root "$W/srv" -q)
"$TK" serve trust add --org tktest "$(cat "$W/key.pub")" --root "$W/srv" -q
"$TK" serve --root "$W/srv" --listen 127.0.0.1:0 --max-connections $((CONNS + 56)) --max-per-ip $((CONNS + 16)) \
  2>"$W/serve.log" &
SRV_PID=$!
for _ in $(seq 100); do
  PORT=$(sed -n 's#.*on http://127.0.0.1:\([0-9]*\).*#\1#p' "$W/serve.log"); [ -n "$PORT" ] && break; sleep 0.05
done
URL=http://127.0.0.1:$PORT
"$TK" -q publish "$W/pkg" --registry "$URL" --token "$TOKEN" --key "$W/key" >/dev/null || { echo "first publish failed"; exit 1; }
SIZE=$(curl -s -o /dev/null -w '%{size_download}' "$URL/kernels/tktest/load/resolve/v1/source.tar.gz")
echo "serve_load: $CONNS connections, $SECS s, $WRK_THREADS wrk threads, tk serve default threads; archive $SIZE bytes"

# the publisher: a new patch version every 0.2 s until wrk ends
(
  n=1; ok=0; bad=0
  while [ ! -e "$W/stop" ]; do
    n=$((n + 1)); mkpkg "$W/p" "1.0.$n"
    if "$TK" -q publish "$W/p" --registry "$URL" --token "$TOKEN" --key "$W/key" >/dev/null 2>"$W/pub.err"; then
      ok=$((ok + 1)); else bad=$((bad + 1)); cat "$W/pub.err"; fi
    sleep 0.2
  done
  echo "$ok $bad" >"$W/pubcount"
) &
PUB_PID=$!

wrk -t"$WRK_THREADS" -c"$CONNS" -d"${SECS}s" --latency --timeout 10s \
  "$URL/kernels/tktest/load/resolve/v1/source.tar.gz" | tee "$W/wrk.txt"
touch "$W/stop"; wait $PUB_PID
read -r pub_ok pub_bad <"$W/pubcount"
echo "publishes during the run: $pub_ok ok, $pub_bad failed; branch v1 now at $(curl -s "$URL/api/kernels/tktest/load/revision/v1" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("sha"))')"
errors=0
grep -q "Socket errors" "$W/wrk.txt" && errors=1
grep -q "Non-2xx or 3xx" "$W/wrk.txt" && errors=1
[ "$pub_bad" = 0 ] || errors=1
[ $errors = 0 ] && echo "serve_load: zero errors" || echo "serve_load: ERRORS (see above)"
exit $errors
