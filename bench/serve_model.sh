#!/usr/bin/env bash
# tk serve-model under load: aggregate generated tokens/s and p50/p99 time to first token at 1, 4, 16
# and 64 concurrent streaming clients (bench/serve_load.py), on the checkpoint of
# bench/make_serve_llama.py (~57M parameters of layers, f32, CPU). With LLAMA_SERVER=path/to/llama-server
# and GGUF=the same weights in GGUF at f32 (llama.cpp's convert_hf_to_gguf.py --outtype f32), llama.cpp's
# server runs the same load with the same parallelism. Figures go to bench/RESULTS.md by hand, with
# the machine, the date and the load (uptime).
#   bash bench/serve_model.sh [CLIENTS...]     (default 1 4 16 64); DEVICE=cuda for a GPU
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
PY=${TK_PY_VENV:-build/py-venv}/bin/python
CK=${CK:-$B/bench-serve-llama}
REQS=${REQS:-2}
MAXTOK=${MAXTOK:-64}
PAR=${PAR:-64}
DEVICE=${DEVICE:-cpu}
clients=${*:-1 4 16 64}
[ -f "$CK/tokenizer.json" ] || "$PY" bench/make_serve_llama.py "$CK" >/dev/null 2>&1 || { echo "serve_model: cannot write $CK"; exit 1; }
echo "# $(date -u +%FT%TZ) $(uname -m), $(nproc) cores, load: $(uptime | sed 's/.*load average: //')"
echo "# checkpoint $CK, $REQS requests per client, $MAXTOK tokens each (ignore_eos), --parallel $PAR, device $DEVICE"
run_load() { # NAME URL MODEL
  local c
  for c in $clients; do
    printf '%s %s\n' "$1" "$("$PY" bench/serve_load.py "$2" "$3" "$c" "$REQS" "$MAXTOK")"
  done
}
"$B/tk" serve-model "$CK" --parallel "$PAR" --device "$DEVICE" --quiet >"$B/bench-serve.url" 2>"$B/bench-serve.log" &
pid=$!
for _ in $(seq 300); do [ -s "$B/bench-serve.url" ] && curl -sf "$(cat "$B/bench-serve.url")/health" >/dev/null && break; sleep 0.2; done
run_load tk "$(cat "$B/bench-serve.url")" "$(basename "$CK")"
kill -TERM "$pid"; wait "$pid"
if [ -n "${LLAMA_SERVER:-}" ] && [ -n "${GGUF:-}" ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$LLAMA_SERVER" -m "$GGUF" --host 127.0.0.1 --port "$port" -np "$PAR" -c $((PAR * 256)) -cb >"$B/bench-llama.log" 2>&1 &
  lpid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
  run_load llama-server "http://127.0.0.1:$port" "$(basename "$CK")"
  kill "$lpid"; wait "$lpid"
else
  echo "# llama-server: not run (set LLAMA_SERVER and GGUF)"
fi
