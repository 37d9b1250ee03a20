#!/usr/bin/env bash
# selftest_plan.sh — the CPU side of `tk selftest` without a GPU: for each package tk ships, the cases
# its kernels would run for an arch (tk selftest --plan) and the time of their CPU references, with
# the process's user time. The GPU side (launches, copies) needs a GPU: scripts/gpu-check.sh phase 1b
# prints each package's full self-test time there. Usage: bench/selftest_plan.sh [ARCH] (sm_90)
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
arch=${1:-sm_90}
export TK_HOME; TK_HOME=$(mktemp -d /tmp/tk-bench-selftest.XXXXXX)
trap 'rm -rf "$TK_HOME"' EXIT
unset TK_ENDPOINT TK_OFFLINE
echo "machine: $(nproc) cores, $(uptime | sed 's/.*load/load/'), $(date -u +%Y-%m-%dT%H:%MZ), arch $arch"
printf '%-14s %8s %6s %12s %12s %10s\n' package kernels cases cpu_ref_s user_s wall_s
for p in activation casted cross-entropy flash-attn layers rmsnorm rotary sampling softmax; do
  "$B/tk" -q get "kernels-community/$p" --no-build >/dev/null 2>&1 || { echo "$p: tk get failed"; continue; }
  /usr/bin/time -f "%U %e" -o "$TK_HOME/t" "$B/tk" --json selftest --plan --arch "$arch" "kernels-community/$p" >"$TK_HOME/r.json"
  python3 - "$TK_HOME/r.json" "$TK_HOME/t" "$p" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))[0]
user, wall = open(sys.argv[2]).read().split()
print("%-14s %8d %6d %12.3f %12s %10s" % (sys.argv[3], r["counts"]["planned"], sum(k["cases"] for k in r["kernels"]),
                                          r["cpu_seconds"], user, wall))
PY
done
echo "end: $(uptime | sed 's/.*load/load/')"
