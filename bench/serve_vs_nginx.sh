#!/usr/bin/env bash
# serve_vs_nginx.sh — tk serve against nginx on the same registry tree, same load, same run.
#
# Publishes one package (kernels-src/activation renamed tktest/bench; TK_LOAD_PKG=flash-attn for a
# bigger archive) into a scratch tree, serves that tree with nginx (the rules of docs/registry.md, as
# tests/nginx.conf.in runs them, with the I/O settings of a production nginx: sendfile, tcp_nopush,
# keep-alive, access log on; one worker per tk serve thread) and with tk serve (access log on), and runs
# the same wrk load against both, one after the other, for each URL:
#   archive   /kernels/tktest/bench/resolve/v1/source.tar.gz   (the branch resolved to its commit)
#   api       /api/kernels/tktest/bench                         (the package's info JSON, a small file)
# Each (URL, server) pair is measured REPEAT times, alternating nginx and tk serve; the table gives each
# run's requests/s, mean and p99 latency and errors, then the median requests/s of both and the ratio
# tk serve / nginx. Exits 1 when any request failed (socket errors or non-2xx).
#
#   bash bench/serve_vs_nginx.sh [CONNECTIONS=200] [SECONDS=10] [REPEAT=3] [WRK_THREADS=2]
#   TK_SERVE_ARGS="--threads 2" bash bench/serve_vs_nginx.sh     (extra tk serve options)
#   TK_BIN=/path/to/other/tk bash bench/serve_vs_nginx.sh        (another build of tk, e.g. an older one)
#   NGINX_CONF_IN=FILE bash bench/serve_vs_nginx.sh             (other nginx rules, in tests/nginx.conf.in's form,
#       e.g. plain files without the Hub headers: git show 6129905:tests/nginx.conf.in >FILE)
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}; TK=${TK_BIN:-$PWD/$B/tk}
CONNS=${1:-200}; SECS=${2:-10}; REPEAT=${3:-3}; WRK_THREADS=${4:-2}
for c in wrk nginx curl python3; do
  command -v $c >/dev/null || { echo "serve_vs_nginx: $c is not installed (scripts/setup.sh --test)"; exit 1; }
done
[ -r "${NGINX_CONF_IN:-tests/nginx.conf.in}" ] || { echo "serve_vs_nginx: cannot read NGINX_CONF_IN=$NGINX_CONF_IN"; exit 1; }
W=$(mktemp -d /tmp/tk-vs-nginx.XXXXXX)
chmod 755 "$W" # nginx's workers run as an unprivileged user
SRV_PID=
stop_all() {
  [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null && wait "$SRV_PID" 2>/dev/null
  [ -s "$W/nginx/nginx.pid" ] && kill "$(cat "$W/nginx/nginx.pid")" 2>/dev/null
}
trap 'stop_all; rm -rf "$W"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# The tree: one published version.
export TK_HOME=$W/home
"$TK" keygen "$W/key" >/dev/null || exit 1
cp -r "kernels-src/${TK_LOAD_PKG:-activation}" "$W/pkg"
python3 - "$W/pkg/kernel.json" <<'PY'
import json, sys
p = sys.argv[1]; m = json.load(open(p)); m["name"] = "tktest/bench"; m["version"] = "1.0.0"
json.dump(m, open(p, "w"), indent=1)
PY
"$TK" -q publish "$W/pkg" --to "$W/tree" --key "$W/key" >/dev/null || { echo "publish failed"; exit 1; }
chmod -R a+rX "$W/tree"

# nginx: tests/nginx.conf.in's rules; production settings for I/O; as many worker processes as tk serve
# has threads (4 unless TK_SERVE_ARGS says --threads N), so that on a machine shared with other work
# neither server gets more of the scheduler's time slices than the other.
THREADS=$(echo "${TK_SERVE_ARGS:-}" | sed -n 's/.*--threads[ =]\([0-9]*\).*/\1/p'); THREADS=${THREADS:-4}
mkdir -p "$W/nginx"
NPORT=$(free_port)
sed -e "s#@ROOT@#$W/tree#g" -e "s#@PORT@#$NPORT#g" -e "s#@DIR@#$W/nginx#g" -e "s#@RATE@#0#g" \
    -e "s#^worker_processes 1;#worker_processes $THREADS; worker_rlimit_nofile 4096;#" \
    -e "s#events { worker_connections 256; }#events { worker_connections 1024; }#" \
    -e "s#^http {#http {\n  sendfile on; tcp_nopush on; tcp_nodelay on; keepalive_requests 1000000;#" \
    "${NGINX_CONF_IN:-tests/nginx.conf.in}" >"$W/nginx/nginx.conf"
nginx -c "$W/nginx/nginx.conf" -p "$W/nginx" || { echo "nginx failed to start"; exit 1; }
for _ in $(seq 50); do [ -s "$W/nginx/nginx.pid" ] && break; sleep 0.1; done
NGINX=http://127.0.0.1:$NPORT

# tk serve: its defaults, with room for the connections.
# shellcheck disable=SC2086
"$TK" serve --root "$W/tree" --listen 127.0.0.1:0 --max-connections $((CONNS + 56)) --max-per-ip $((CONNS + 16)) \
  ${TK_SERVE_ARGS:-} >"$W/serve.url" 2>"$W/serve.log" &
SRV_PID=$!
for _ in $(seq 100); do TKS=$(head -n 1 "$W/serve.url"); [ -n "$TKS" ] && break; sleep 0.05; done
[ -n "$TKS" ] || { echo "tk serve did not start: $(cat "$W/serve.log")"; exit 1; }

PATHS="archive:/kernels/tktest/bench/resolve/v1/source.tar.gz api:/api/kernels/tktest/bench"
for p in $PATHS; do # both answer 200 with the same bytes
  a=$(curl -sf "$NGINX${p#*:}" | sha256sum) || { echo "nginx: ${p#*:} failed"; exit 1; }
  b=$(curl -sf "$TKS${p#*:}" | sha256sum) || { echo "tk serve: ${p#*:} failed"; exit 1; }
  [ "$a" = "$b" ] || { echo "nginx and tk serve answer ${p#*:} differently"; exit 1; }
done
SIZE=$(curl -s -o /dev/null -w '%{size_download}' "$TKS/kernels/tktest/bench/resolve/v1/source.tar.gz")
echo "serve_vs_nginx: $CONNS connections, ${SECS} s a run, $REPEAT runs each, wrk -t$WRK_THREADS; archive $SIZE bytes"
echo "  $(nginx -v 2>&1) with $THREADS workers, rules ${NGINX_CONF_IN:-tests/nginx.conf.in}; tk serve ${TK_SERVE_ARGS:-(defaults: 4 threads)}; $(nproc) cores; $(uptime | sed 's/.*load/load/')"

# wrk_run URL OUT: one run; prints "rps mean_ms p99_ms errors".
wrk_run() {
  wrk -t"$WRK_THREADS" -c"$CONNS" -d"${SECS}s" --latency --timeout 10s "$1" >"$2" 2>&1
  python3 - "$2" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
def ms(s):
    v, u = float(re.match(r"([\d.]+)", s).group(1)), re.search(r"(us|ms|s)$", s).group(1)
    return v / 1000 if u == "us" else v * 1000 if u == "s" else v
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
mean = ms(re.search(r"Latency\s+(\S+)", t).group(1))
p99 = ms(re.search(r"^\s*99%\s+(\S+)", t, re.M).group(1))
err = sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", t))
m = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
err += int(m.group(1)) if m else 0
print(f"{rps:.0f} {mean:.2f} {p99:.2f} {err}")
PY
}

errors=0
printf '\n%-8s %-9s %4s %12s %10s %10s %7s\n' url server run requests/s mean_ms p99_ms errors
for p in $PATHS; do
  name=${p%%:*}; path=${p#*:}
  : >"$W/$name.nginx"; : >"$W/$name.tk"
  for i in $(seq "$REPEAT"); do
    for srv in nginx tk; do
      url=$NGINX$path; [ $srv = tk ] && url=$TKS$path
      read -r rps mean p99 err < <(wrk_run "$url" "$W/wrk.txt")
      if [ "$err" != 0 ]; then
        errors=1; sed 's/^/    /' "$W/wrk.txt"
        [ $srv = tk ] && grep 'warning:' "$W/serve.log" | tail -n 5 | sed 's/^/    tk serve: /'
      fi
      echo "$rps" >>"$W/$name.$srv"
      printf '%-8s %-9s %4s %12s %10s %10s %7s\n' "$name" "$([ $srv = tk ] && echo "tk serve" || echo nginx)" "$i" \
        "$rps" "$mean" "$p99" "$err"
    done
  done
done
echo
for p in $PATHS; do
  name=${p%%:*}
  python3 - "$name" "$W/$name.nginx" "$W/$name.tk" <<'PY'
import statistics, sys
name, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
n = statistics.median(float(x) for x in open(a)); t = statistics.median(float(x) for x in open(b))
print(f"{name:8s} median requests/s: nginx {n:.0f}, tk serve {t:.0f}, tk serve / nginx = {t / n:.2f}")
PY
done
echo "load after: $(uptime | sed 's/.*load/load/')"
[ $errors = 0 ] && echo "serve_vs_nginx: zero errors" || echo "serve_vs_nginx: ERRORS (see above)"
exit $errors
