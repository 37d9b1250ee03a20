#!/usr/bin/env bash
# tk serve-model --tp 2 under `mpirun -np 2` (docs/parallel.md, docs/serving.md) on the tiny Llama of
# tests/models/tiny.sh (a real tokenizer), on 127.0.0.1 and a free port: rank 0 serves, rank 1 replays
# its scheduler. Completions (greedy, seeded sampling with n = 2, top-k, a stop string, a stream; four
# greedy ones at once) must equal the single-process server's answers to each alone; a bad request gets its 400 and the server goes on;
# SIGTERM to rank 0 drains and ends every rank with status 0; a rank killed ends the job, no rank left
# behind. Skips without MPI, mpirun or the test venv (fails under CI).
. "$(dirname "$0")/lib.sh"

MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
MPIRUN+=(--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
export TK_COMM_TIMEOUT=30
SRV_PID=
CK=

ready() {
  if ! "$TK" doctor --json 2>/dev/null | grep -q '"built": true'; then skip "this tk was built without MPI"; return 1; fi
  if ! command -v mpirun >/dev/null; then
    [ -n "${CI:-}" ] && { fail "mpirun is missing (apt install openmpi-bin: scripts/setup.sh)"; return 1; }
    skip "mpirun not found (scripts/setup.sh installs openmpi-bin)"; return 1
  fi
  CK=$(bash "$ROOT/tests/models/tiny.sh" llama 2>"$WORK/tiny.log") || {
    if [ -n "${CI:-}" ]; then fail "tiny.sh: $(tail -n 3 "$WORK/tiny.log")"; else skip "no tiny checkpoint (tests/models/tiny.sh)"; fi
    return 1
  }
}

# start CMD...: the server command (tk serve-model CK ..., or under mpirun) on a free port; sets URL and
# SRV_PID (the launcher's) and waits for /health 200.
start() {
  local port i; port=$(free_port)
  URL=http://127.0.0.1:$port
  "$@" --listen "127.0.0.1:$port" >"$WORK/url" 2>"$WORK/server.log" &
  SRV_PID=$!
  for i in $(seq 300); do
    curl -sf "$URL/health" >/dev/null 2>&1 && return 0
    kill -0 "$SRV_PID" 2>/dev/null || { fail "the server exited: $(tail -n 5 "$WORK/server.log")"; SRV_PID=; return 1; }
    sleep 0.1
  done
  fail "the server never became ready: $(tail -n 5 "$WORK/server.log")"
  kill -9 "$SRV_PID"; wait "$SRV_PID" 2>/dev/null; SRV_PID=
  return 1
}

# wait_gone LIMIT_S: the launcher exits within LIMIT_S; sets RC (124 when it did not).
wait_gone() {
  local i
  for i in $(seq $(($1 * 10))); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$SRV_PID" 2>/dev/null; then RC=124; kill -9 "$SRV_PID"; wait "$SRV_PID" 2>/dev/null
  else wait "$SRV_PID"; RC=$?; fi
  SRV_PID=
}

# gone PID...: the processes end within 10 s (mpirun may exit before its ranks finished exiting).
gone() {
  local i p left
  for i in $(seq 100); do
    left=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ $left = 0 ] && return 0
    sleep 0.1
  done
  return 1
}

# rank_pid R: the pid of rank R among mpirun's children.
rank_pid() {
  local p
  for p in $(pgrep -P "$SRV_PID"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}

# ask NAME BODY: POST BODY to /v1/completions; the answer (choices' text and finish reason, or the
# status and error) goes to $WORK/NAME.
ask() {
  curl -s -m 60 -w '\n%{http_code}\n' "$URL/v1/completions" -H 'Content-Type: application/json' -d "$2" |
    python3 -c '
import json, sys
lines = sys.stdin.read().rstrip("\n").split("\n")
code, body = lines[-1], "\n".join(lines[:-1])
if body.startswith("data:"):  # a stream: the text of each choice, concatenated
    text, fin = {}, {}
    for l in body.split("\n"):
        if l.startswith("data: {"):
            for c in json.loads(l[6:])["choices"]:
                text[c["index"]] = text.get(c["index"], "") + c["text"]
                fin[c["index"]] = c.get("finish_reason") or fin.get(c["index"])
    print(code, json.dumps([[text[i], fin[i]] for i in sorted(text)]))
else:
    j = json.loads(body)
    print(code, json.dumps([[c["text"], c["finish_reason"]] for c in j["choices"]] if "choices" in j else j["error"]["code"]))
' >"$WORK/$1"
}

BODIES=(
  '{"model": "llama", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}'
  '{"model": "llama", "prompt": "the fox", "max_tokens": 10, "seed": 7, "temperature": 1.0, "top_k": 0, "n": 2}'
  '{"model": "llama", "prompt": [1, 5, 9, 200, 31], "max_tokens": 10, "seed": 3, "temperature": 0.7, "top_k": 5}'
  '{"model": "llama", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stop": ["t,"]}'
  '{"model": "llama", "prompt": "a b c", "max_tokens": 8, "seed": 11, "stream": true}'
)

# run_all PREFIX: each body alone, then four greedy ones at once (c0, c3: bodies 0 and 3, twice).
run_all() {
  local i pids=()
  for i in "${!BODIES[@]}"; do ask "$1.$i" "${BODIES[$i]}"; done
  for i in 0 3; do
    ask "$1.c$i" "${BODIES[$i]}" & pids+=($!)
    ask "$1.d$i" "${BODIES[$i]}" & pids+=($!)
  done
  wait "${pids[@]}"
}

t_tp_server_equals_one_process() {
  ready || return
  start "$TK" serve-model "$CK" || return
  run_all one
  kill -TERM "$SRV_PID"; wait_gone 20
  start "${MPIRUN[@]}" -np 2 "$TK" serve-model "$CK" --tp 2 || return
  run_all tp
  local i f
  for i in "${!BODIES[@]}" c0 d0 c3 d3; do
    f=$(cat "$WORK/one.${i#[cd]}") # the reference: one process, each request alone
    echo "    $i: $f"
    case "$f" in 200\ *) ;; *) fail "one process, request $i: $f" ;; esac
    [ "$f" = "$(cat "$WORK/tp.$i")" ] || fail "request $i: --tp 2 answered $(cat "$WORK/tp.$i"), one process $f"
  done
  # a bad request: its error, and the ranks go on
  ask bad '{"model": "llama", "prompt": "x", "max_tokens": -3}'
  grep -q "^400 " "$WORK/bad" || fail "a bad request: $(cat "$WORK/bad")"
  ask after "${BODIES[0]}"
  [ "$(cat "$WORK/after")" = "$(cat "$WORK/one.0")" ] || fail "after a bad request: $(cat "$WORK/after")"
  # a client that goes away mid-stream: its sequence leaves rank 0's batch, and rank 1's with it
  curl -sN "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model": "llama", "prompt": "Once", "max_tokens": 120, "temperature": 0, "stream": true}' | head -c 300 >/dev/null
  ask after2 "${BODIES[1]}"
  [ "$(cat "$WORK/after2")" = "$(cat "$WORK/one.1")" ] || fail "after a client went away: $(cat "$WORK/after2")"
  grep -q "client went away" "$WORK/server.log" || echo "    (the stream had ended before its client left)"
  # SIGTERM to rank 0: it drains, tells rank 1, and the job ends 0
  local r0 r1; r0=$(rank_pid 0); r1=$(rank_pid 1)
  [ -n "$r0" ] && [ -n "$r1" ] || { fail "no ranks found under mpirun $SRV_PID"; kill -9 "$SRV_PID"; return; }
  kill -TERM "$r0"; wait_gone 20
  [ "$RC" = 0 ] || fail "mpirun exited $RC after SIGTERM to rank 0: $(tail -n 5 "$WORK/server.log")"
  gone "$r0" "$r1" || fail "a rank outlived the job"
  grep -q "stopped after draining" "$WORK/server.log" || fail "rank 0 did not drain: $(tail -n 5 "$WORK/server.log")"
}

# Ctrl-C reaches mpirun; a rank killed mid-request ends the job quickly, nothing left running.
t_tp_server_interrupt_and_kill() {
  ready || return
  # one prompt token a step, so a long prompt takes ~100 steps: its client leaves during the prefill
  start "${MPIRUN[@]}" -np 2 "$TK" --json serve-model "$CK" --tp 2 --max-step-tokens 1 || return
  grep -q '"tensor_parallel": 2' "$WORK/url" || fail "--json does not say 2 ranks: $(cat "$WORK/url")"
  local r0 r1 ids; r0=$(rank_pid 0); r1=$(rank_pid 1)
  ask before "${BODIES[0]}"
  local m
  for m in 0.08 0.04 0.02 0.01; do # a fresh prompt each time (no prefix-cache hit), shorter waits
    ids=$(python3 -c "import sys; print(','.join(str(7 + (i * 7 + int(float(sys.argv[1]) * 1000)) % 300) for i in range(110)))" "$m")
    curl -s -m "$m" "$URL/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"model\": \"llama\", \"prompt\": [$ids], \"max_tokens\": 10, \"stream\": true}" >/dev/null
    sleep 0.3
    grep -q "client went away" "$WORK/server.log" && break
  done
  ask after "${BODIES[0]}"
  [ "$(cat "$WORK/after")" = "$(cat "$WORK/before")" ] || fail "after a client left: $(cat "$WORK/after") vs $(cat "$WORK/before")"
  if grep -q "client went away" "$WORK/server.log"; then echo "    a client left mid-prefill: both ranks cancelled it"
  else echo "    (the request ended before its client left: the cancellation was not exercised)"; fi
  kill -INT "$SRV_PID"; wait_gone 20
  [ "$RC" != 124 ] || fail "mpirun still ran 20 s after SIGINT"
  gone "$r0" "$r1" || fail "a rank outlived SIGINT by 10 s"
  start "${MPIRUN[@]}" -np 2 "$TK" serve-model "$CK" --tp 2 || return
  r0=$(rank_pid 0); r1=$(rank_pid 1)
  ask long '{"model": "llama", "prompt": "Once", "max_tokens": 120, "temperature": 0, "stream": true}' &
  local asker=$!
  sleep 0.3
  kill -9 "$r1"; wait_gone 20
  [ "$RC" != 0 ] && [ "$RC" != 124 ] || fail "mpirun exited $RC after rank 1 was killed (want non-zero, no hang)"
  gone "$r0" || fail "rank 0 outlived rank 1 by 10 s"
  wait "$asker"
}

t_tp_server_usage() {
  ready || return
  expect_rc 2 "$TK" serve-model "$CK" --tp-plan "$WORK/p.json"
  expect_out "--tp-plan goes with --tp N"
  expect_rc 2 "$TK" serve-model "$CK" --tp 2
  expect_out "--tp 2, but 1 process was started"
  expect_rc 2 "$TK" serve-model "$CK" --tp 0
  expect_out "--tp wants the number of ranks"
}

# the server, then lib.sh's cleanup (the scratch directory)
stop_server_and_clean() { [ -n "$SRV_PID" ] && kill -9 "$SRV_PID" 2>/dev/null; cleanup; }
trap stop_server_and_clean EXIT
run_tests
