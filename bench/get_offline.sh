#!/usr/bin/env bash
# Median wall time of an offline `tk get` of an installed package (issue: under 50 ms).
# Usage: bench/get_offline.sh [RUNS]   — prints one line: median, p90 and min in ms.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
runs=${1:-101}
export TK_HOME=$(mktemp -d /tmp/tk-bench.XXXXXX)
trap 'rm -rf "$TK_HOME"' EXIT
"$B/tk" get -q kernels-community/activation >/dev/null
times=()
for _ in $(seq "$runs"); do
  s=$(date +%s%N)
  "$B/tk" get --offline -q kernels-community/activation >/dev/null
  e=$(date +%s%N)
  times+=($(( (e - s) / 1000 )))
done
printf '%s\n' "${times[@]}" | sort -n | awk -v n="$runs" '{a[NR]=$1} END {
  printf "tk get --offline (installed): median %.2f ms, p90 %.2f ms, min %.2f ms over %d runs\n",
         a[int((n+1)/2)]/1000, a[int(n*0.9)]/1000, a[1]/1000, n }'
