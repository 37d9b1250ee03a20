#!/usr/bin/env bash
# tk serve-model on a diffusion checkpoint: K concurrent clients, one request at a time through the
# sampler (sequential: --parallel 1, which is how the server ran every diffusion request before
# tk_diff_batch, and every DiffusionGemma request before issue 29's block batching; with
# TK_BEFORE=path/to/an/older/tk, that binary too) against the batched server (--parallel 8: every
# running request's canvas in one forward a step). KIND=llada (default): the ~57M Llama of
# bench/make_bench_llama.py in LLaDA's layout (bench/make_bench_llada_words.py), f32, CPU; each request
# temperature 0, max_tokens G, block_length BL, steps S. KIND=dgemma: bench/make_bench_dgemma.py's ~10M
# random DiffusionGemma (canvas_length 16) with a word tokenizer; each request max_tokens G (whole
# canvases), steps S a block, its own seed (near uniform logits: every block runs all S steps). Each
# client sends REQS non-streamed /v1/completions (its own prompt) one after another; tokens/s = all the
# requests' gen_length over the wall time. Every mode must answer each request with the same text
# (checked; batching changes only the rounding of the batched products, docs/serving.md).
#
# The servers run side by side and the modes alternate within each of ROUNDS rounds (default 3);
# the table gives the medians.
#
#     bash bench/serve_diffusion.sh [K...]          (default 1 4 8)
#     G=32 BL=16 S=32 REQS=2 ROUNDS=3 TK_BEFORE=/tmp/tk.main bash bench/serve_diffusion.sh 1 4 8
#     KIND=dgemma G=32 S=8 REQS=2 bash bench/serve_diffusion.sh 1 4
#     DEVICE=cuda KIND=dgemma bash bench/serve_diffusion.sh 1 4     the servers on the GPU (--device cuda)
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
. scripts/py-venv.sh
PY=$TK_PY_VENV/bin/python
KIND=${KIND:-llada} DEVICE=${DEVICE:-cpu}
REQS=${REQS:-2}
clients=${*:-1 4 8}
if [ "$KIND" = dgemma ]; then
  G=${G:-32}; BL=0; S=${S:-8}
  CK=$B/bench-models/dgemma-10m-words
  [ -f "$CK/tokenizer.json" ] || "$PY" bench/make_bench_dgemma.py "$CK" words >/dev/null 2>&1 || { echo "serve_diffusion: cannot write $CK"; exit 1; }
else
  G=${G:-32}; BL=${BL:-16}; S=${S:-32}
  LL=$B/bench-models/llama-57m CK=$B/bench-models/llada-57m
  [ -f "$LL/config.json" ] || "$PY" bench/make_bench_llama.py "$LL" >/dev/null 2>&1 || { echo "serve_diffusion: cannot write $LL"; exit 1; }
  [ -f "$CK/config.json" ] || "$PY" bench/make_bench_llada_words.py "$LL" "$CK" >/dev/null || { echo "serve_diffusion: cannot write $CK"; exit 1; }
fi
echo "# $(date -u +%FT%TZ) device $DEVICE, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$KIND" = dgemma ]; then
  echo "# $CK: gen_length $G, steps $S a block, a seed a request; $REQS requests a client"
else
  echo "# $CK: gen_length $G, block_length $BL, steps $S, temperature 0; $REQS requests a client"
fi
OUT=$(mktemp -d)
PIDS=
trap 'kill $PIDS 2>/dev/null; rm -rf "$OUT"' EXIT

# start NAME TK PARALLEL: a server, its URL in $OUT/NAME.url
start() {
  "$2" serve-model "$CK" --device "$DEVICE" --parallel "$3" --quiet --metrics >"$OUT/$1.url" 2>"$OUT/$1.log" &
  PIDS="$PIDS $!"
  echo $! >"$OUT/$1.pid"
  for _ in $(seq 600); do [ -s "$OUT/$1.url" ] && curl -sf "$(head -n 1 "$OUT/$1.url")/health" >/dev/null && return; sleep 0.2; done
  echo "serve_diffusion: $1 never became ready: $(tail -n 3 "$OUT/$1.log")"; exit 1
}
# load NAME K ROUND: K clients at once against server NAME (the others idle meanwhile)
load() {
  "$PY" - "$(head -n 1 "$OUT/$1.url")" "$2" "$REQS" "$G" "$BL" "$S" "$OUT/$1.$2.$3.json" "$(cat "$OUT/$1.pid")" <<'PYEOF'
import concurrent.futures as cf, json, os, re, sys, time, urllib.request
url, K, R, G, BL, S, out, pid = sys.argv[1], *map(int, sys.argv[2:7]), sys.argv[7], sys.argv[8]
def cpu():  # the server's user + system CPU seconds
    f = open("/proc/%s/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def steps():  # its denoising steps (forwards); None from a server without the counter
    m = re.search(r"^tk_diffusion_steps_total (\S+)$", urllib.request.urlopen(url + "/metrics").read().decode(), re.M)
    return float(m.group(1)) if m else None
def one(i, r):
    prompt = " ".join("w%d" % (100 + 37 * i + 11 * r + j) for j in range(8 + (i + r) % 8))
    req = {"prompt": prompt, "max_tokens": G, "steps": S}
    req.update({"block_length": BL, "temperature": 0} if BL else {"seed": 1 + 37 * i + 11 * r})  # BL 0: dgemma
    body = json.dumps(req).encode()
    t = time.time()
    with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body), timeout=3600) as f:
        text = json.loads(f.read())["choices"][0]["text"]
    return text, time.time() - t
def client(i):
    return [one(i, r) for r in range(R)]
s0, c0, t = steps(), cpu(), time.time()
with cf.ThreadPoolExecutor(K) as ex:
    res = list(ex.map(client, range(K)))
wall, c1, s1 = time.time() - t, cpu(), steps()
lat = sorted(x[1] for c in res for x in c)
json.dump({"texts": [x[0] for c in res for x in c], "wall": wall, "tps": K * R * G / wall,
           "p50": lat[len(lat) // 2], "cpu_ms_tok": (c1 - c0) * 1000 / (K * R * G),
           "forwards": s1 - s0 if s0 is not None else None}, open(out, "w"))
PYEOF
}
modes="sequential batched"
start sequential "$B/tk" 1
start batched "$B/tk" 8
if [ -n "${TK_BEFORE:-}" ]; then start before "$TK_BEFORE" 8; modes="before $modes"; fi
ROUNDS=${ROUNDS:-3}
for round in $(seq "$ROUNDS"); do   # the modes alternate, so a change of the machine's load hits them alike
  for k in $clients; do
    for m in $modes; do load "$m" "$k" "$round" || exit 1; done
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg); medians of $ROUNDS rounds, the modes alternating"
python3 - "$OUT" "$modes" "$ROUNDS" $clients <<'PYEOF'
import json, statistics, sys
out, modes, rounds, ks = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4:]
print("tokens/s over the wall time (wall s, p50 latency s; server CPU ms a token; forwards)")
print("| K clients | " + " | ".join(modes) + " | batched / sequential tokens/s | same text |")
print("|---|" + "---|" * (len(modes) + 2))
for k in ks:
    runs = {m: [json.load(open("%s/%s.%s.%d.json" % (out, m, k, r))) for r in range(1, rounds + 1)] for m in modes}
    med = {m: {f: statistics.median(x[f] for x in runs[m]) for f in ("tps", "wall", "p50", "cpu_ms_tok")}
           for m in modes}
    same = all(x["texts"] == runs["sequential"][0]["texts"] for m in modes for x in runs[m])
    fw = {m: runs[m][0]["forwards"] for m in modes}
    cells = ["%.1f (%.1f, %.2f; %.0f%s)" % (med[m]["tps"], med[m]["wall"], med[m]["p50"], med[m]["cpu_ms_tok"],
                                           "; %d" % fw[m] if fw[m] is not None else "") for m in modes]
    print("| %s | %s | %.2fx | %s |" % (k, " | ".join(cells), med["batched"]["tps"] / med["sequential"]["tps"],
                                          "yes" if same else "NO"))
PYEOF
