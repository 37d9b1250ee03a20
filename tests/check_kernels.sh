#!/usr/bin/env bash
# check_kernels.sh — `make check-kernels`: compiles every package in kernels-src/ with NVRTC for sm_80
# and sm_90 through the real CLI (`tk get` from the build's own registry, then `tk build`), in a
# throwaway TK_HOME. No GPU needed. Prints one line per package and the summary line last; exits
# nonzero when any package fails to compile. The test-data packages in tests/data/selftest/ are compiled too (tk check). TK_CHECK_ONLY=DIR checks only kernels-src/DIR. SKIPs everything when NVRTC is not installed.
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
TK=$B/tk
ARCHS=${TK_CHECK_ARCHS:-sm_80,sm_90}
ORG=${TK_DEFAULT_ORG:-kernels-community}
passed=0; failed=0; skipped=0

[ -x "$TK" ] || { echo "check_kernels: $TK is missing (run make first)"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
export TK_HOME; TK_HOME=$(mktemp -d /tmp/tk-check-kernels.XXXXXX)
trap 'rm -rf "$TK_HOME"' EXIT
unset TK_ENDPOINT TK_OFFLINE TK_TOKEN

if ! "$TK" doctor --json 2>/dev/null | grep -q '"nvrtc": {'; then
  for d in kernels-src/*/; do [ -f "$d/kernel.json" ] && { echo "skip $(basename "$d"): NVRTC not found"; skipped=$((skipped + 1)); }; done
  echo "$passed passed, $failed failed, $skipped skipped"
  exit 0
fi

for d in kernels-src/*/; do
  [ -f "$d/kernel.json" ] || continue
  [ -n "${TK_CHECK_ONLY:-}" ] && [ "$(basename "$d")" != "$TK_CHECK_ONLY" ] && continue
  # the package's name as kernel.json declares it (org/name), else the build's default org
  name=$(sed -nE 's/^[[:space:]]*"name"[[:space:]]*:[[:space:]]*"([^"]+\/[^"]+)".*/\1/p' "$d/kernel.json" | head -n 1)
  [ -n "$name" ] || name=$ORG/$(basename "$d")
  log=$TK_HOME/$(basename "$d").log
  start=$(date +%s%N)
  if "$TK" --quiet get "$name" >"$log" 2>&1 && "$TK" --quiet build "$name" --arch "$ARCHS" >>"$log" 2>&1; then
    secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b-a)/1e9}')
    echo "ok    $name ($ARCHS, ${secs}s): $(tail -n 1 "$log")"
    passed=$((passed + 1))
  else
    echo "FAIL  $name ($ARCHS):"; sed 's/^/    /' "$log" | head -n 60
    failed=$((failed + 1))
  fi
done
# the test-data packages of the GPU checks (tests/data/selftest: broken on purpose at run time, but they
# must compile): tk check compiles a directory as it is
if [ -z "${TK_CHECK_ONLY:-}" ]; then
  for d in tests/data/selftest/*/; do
    [ -f "$d/kernel.json" ] || continue
    log=$TK_HOME/test-$(basename "$d").log
    if "$TK" check "$d" --arch "$ARCHS" >"$log" 2>&1; then
      echo "ok    $d ($ARCHS): $(grep ': ok' "$log" | tail -n 1)"
      passed=$((passed + 1))
    else
      echo "FAIL  $d ($ARCHS):"; sed 's/^/    /' "$log" | head -n 60
      failed=$((failed + 1))
    fi
  done
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
