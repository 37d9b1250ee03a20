# lib.sh — helpers for tk's shell tests (sourced, not run). Each test is a function named t_*;
# `run_tests` runs them in order, each in a fresh TK_HOME, and prints the summary line last.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=$ROOT/${TK_BUILD:-build}
TK=$B/tk
. "$ROOT/scripts/py-venv.sh"   # TK_PY_VENV: the test venv, default ~/.cache/tk/py-venv
_failed_now=0; _skipped_now=0
_pass=0; _fail=0; _skip=0

fail() { echo "    $*" >&2; _failed_now=1; }
skip() { echo "skip $_cur: $*"; _skipped_now=1; }
# expect_rc WANT CMD...: runs CMD, checks its exit status, keeps its output in $OUT.
expect_rc() {
  local want=$1; shift
  OUT=$("$@" 2>&1); local rc=$?
  if [ "$rc" != "$want" ]; then fail "line ${BASH_LINENO[0]}: '$*' exited $rc, want $want; output:"; echo "$OUT" | sed 's/^/      /' >&2; fi
}
# expect_out TEXT: the last expect_rc's output contains TEXT.
expect_out() {
  case "$OUT" in *"$1"*) ;; *) fail "line ${BASH_LINENO[0]}: output lacks '$1'; output:"; echo "$OUT" | sed 's/^/      /' >&2 ;; esac
}
expect_no_out() {
  case "$OUT" in *"$1"*) fail "line ${BASH_LINENO[0]}: output has '$1'" ;; esac
}

# py_has PY MODULE...: the modules are installed in PY's environment. Found, not imported: importing
# torch or transformers costs seconds of CPU, and the oracle that needs them imports them anyway.
py_has() { local py=$1; shift; "$py" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))' "$@" 2>/dev/null; }

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# Starts nginx serving DIR as a static registry on 127.0.0.1; sets NGINX_URL. Stopped at exit.
NGINX_PID=
start_nginx() {
  local root=$1 rate=${2:-0} port; port=$(free_port)
  local conf=$WORK/nginx; mkdir -p "$conf"
  sed -e "s#@ROOT@#$root#g" -e "s#@PORT@#$port#g" -e "s#@DIR@#$conf#g" -e "s#@RATE@#$rate#g" "$ROOT/tests/nginx.conf.in" >"$conf/nginx.conf"
  # Started by root, nginx's workers run as nobody and cannot read a tree under a 0700 directory
  # (a clone made in `mktemp -d`): every file answers 403/404. Keep the workers as the test's user.
  [ "$(id -u)" = 0 ] && sed -i '1i user root;' "$conf/nginx.conf"
  nginx -c "$conf/nginx.conf" -p "$conf" || { echo "nginx failed to start" >&2; return 1; }
  for _ in $(seq 50); do [ -s "$conf/nginx.pid" ] && break; sleep 0.1; done
  NGINX_PID=$(cat "$conf/nginx.pid")
  NGINX_URL=http://127.0.0.1:$port
}
stop_nginx() {
  [ -n "$NGINX_PID" ] || return 0
  kill "$NGINX_PID" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$NGINX_PID" 2>/dev/null || break; sleep 0.1; done
  NGINX_PID=
}
# Requests nginx has logged so far.
nginx_requests() { wc -l <"$WORK/nginx/access.log"; }

# sign_file KEY FILE: writes FILE.sig, a tk signature file made with the openssl CLI (independent of tk).
sign_file() {
  local key=$1 file=$2 pub sig keyid
  pub=$(openssl pkey -in "$key" -pubout -outform DER | tail -c 32 | od -An -tx1 | tr -d ' \n')
  sig=$(openssl pkeyutl -sign -rawin -inkey "$key" -in "$file" | od -An -tx1 | tr -d ' \n')
  keyid=$(python3 -c "import hashlib; print(hashlib.sha256(bytes.fromhex('$pub')).hexdigest()[:32])")
  printf '{"format_version": 1, "alg": "ed25519", "keyid": "SHA256:%s", "pubkey": "ed25519:%s", "sig": "%s"}\n' \
    "$keyid" "$pub" "$sig" >"$file.sig"
}

# recommit TREE ORG/NAME BRANCH: after a test edited the files of BRANCH's head commit, moves them to
# the commit id their content makes (docs/registry.md), as a hostile registry holding a key would, and
# points the branch, main, refs and the info documents at it. Prints the new commit. Written in
# Python from the documented formula, independent of tk's code.
recommit() {
  python3 - "$1" "$2" "$3" <<'PYEOF'
import hashlib, json, os, sys
tree, name, branch = sys.argv[1:4]
res = f"{tree}/kernels/{name}/resolve"; api = f"{tree}/api/kernels/{name}"
old = os.readlink(f"{res}/{branch}")
doc = json.load(open(f"{api}/revision/{old}"))
parent = doc.get("tk", {}).get("parent", "0" * 40)
names = [s["rfilename"] for s in doc["siblings"]]
sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()
m = json.load(open(f"{res}/{old}/manifest.json"))
shas = [sha(f"{res}/{old}/manifest.json"), sha(f"{res}/{old}/manifest.json.sig"), m["archive"]["sha256"]]
text = f"tk-commit-1\n{parent}\n" + "".join(f"{n} {s}\n" for n, s in zip(names, shas))
new = hashlib.sha256(text.encode()).hexdigest()[:40]
if new != old:
    os.rename(f"{res}/{old}", f"{res}/{new}")
    for link in (branch, "main"):
        if os.path.islink(f"{res}/{link}") and os.readlink(f"{res}/{link}") == old:
            os.remove(f"{res}/{link}"); os.symlink(new, f"{res}/{link}")
    for root, _, files in os.walk(api):
        for f in files:
            p = os.path.join(root, f); t = open(p).read()
            if old in t: open(p, "w").write(t.replace(old, new))
    os.rename(f"{api}/revision/{old}", f"{api}/revision/{new}")
print(new)
PYEOF
}

WORK=$(mktemp -d /tmp/tk-test.XXXXXX)
chmod 755 "$WORK"   # nginx workers run as an unprivileged user
cleanup() {
  stop_nginx; [ -n "${FAULT_PID:-}" ] && kill "$FAULT_PID" 2>/dev/null
  grep -q " $WORK/" /proc/mounts 2>/dev/null && awk -v w="$WORK/" 'index($2, w) == 1 {print $2}' /proc/mounts | xargs -r -n1 umount -l
  rm -rf "$WORK"
}
trap cleanup EXIT

# A function defined twice in a test file silently replaces the first (a helper renamed by one test
# breaks another): each such name counts as a failure of the file.
dup_functions() {
  grep -hoE '^[A-Za-z_][A-Za-z0-9_]*\(\)' "$0" "${BASH_SOURCE[0]}" | sort | uniq -d
}

run_tests() {
  local fn dup
  for dup in $(dup_functions); do
    echo "FAIL ${dup%()} is defined twice (in $(basename "$0") or lib.sh): the later one replaces the first"
    _fail=$((_fail + 1))
  done
  for fn in $(declare -F | awk '{print $3}' | grep '^t_' | grep -- "${TK_TEST_ONLY:-}"); do
    _cur=$fn; _failed_now=0; _skipped_now=0
    export TK_HOME=$WORK/home-$fn; rm -rf "$TK_HOME"; mkdir -p "$TK_HOME"
    unset TK_ENDPOINT TK_OFFLINE TK_TOKEN
    local t0; t0=$(date +%s%N)
    $fn
    local secs; secs=$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN{printf "%.1f", (b-a)/1e9}')
    if [ $_failed_now = 1 ]; then echo "FAIL $fn (${secs}s)"; _fail=$((_fail + 1));
    elif [ $_skipped_now = 1 ]; then _skip=$((_skip + 1));
    else echo "ok   $fn (${secs}s)"; _pass=$((_pass + 1)); fi
  done
  echo "$_pass passed, $_fail failed, $_skip skipped"
  [ $_fail = 0 ]
}
