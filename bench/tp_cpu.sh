#!/usr/bin/env bash
# Tensor parallelism on the CPU (docs/parallel.md): tk generate on the Llama-shaped random checkpoint of
# bench/make_bench_llama.py (~57M parameters, 8 heads, 4 kv heads, vocab 32000, f32), one process
# against `mpirun -np 2 ... --tp 2`: prefill and decode tokens/s, and each rank's weight bytes and
# resident set (VmRSS after the run; --tp 1 runs one process and reports it too), and the bytes rank 0
# sent for the LM head (head_bytes_sent: logits rows gathered, or the vocabulary-parallel pick). Greedy,
# then sampling with top-p 0.9 (seed 1) picked over the ranks' columns and with the rows gathered
# (TK_TP_PICK); the ids of each decoding must agree with one process's. Needs the test venv (to write the
# checkpoint once) and mpirun.
#
#     bash bench/tp_cpu.sh [prompt_tokens=128] [new_tokens=32]
set -u
cd "$(dirname "$0")/.."
B=${TK_BUILD:-build}
. scripts/py-venv.sh
PY=$TK_PY_VENV/bin/python
P=${1:-128}; N=${2:-32}
LL=$B/bench-models/llama-57m
[ -f "$LL/config.json" ] || "$PY" bench/make_bench_llama.py "$LL" >/dev/null 2>&1 || { echo "tp_cpu: cannot write $LL"; exit 1; }
MPIRUN=(mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u '+%F %H:%M UTC'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
ids=$(python3 -c "print(','.join(str(1 + i % 31999) for i in range($P)))")
TOPP="--do-sample --seed 1 --top-k 0 --top-p 0.9"
run() { # LABEL THREADS EXTRA PREFIX...: one run of PREFIX tk generate ... EXTRA, its JSON on stdout
  local label=$1 threads=$2 extra=$3; shift 3
  local out
  # shellcheck disable=SC2086
  out=$("$@" "$B/tk" generate "$LL" --ids "$ids" --max-new-tokens "$N" --threads "$threads" --stats --json $extra \
    2>"${TMPDIR:-/tmp}/tp_cpu.$$.err") || { echo "tp_cpu: $label failed:" >&2; cat "${TMPDIR:-/tmp}/tp_cpu.$$.err" >&2; return 1; }
  printf '%s\t%s\n' "$label" "$out"
}
{
  run "1 process (--tp 1), 1 thread" 1 "--tp 1"
  run "1 process (--tp 1), 2 threads" 2 "--tp 1"
  run "2 ranks (--tp 2), 1 thread each" 1 "--tp 2" "${MPIRUN[@]}" -np 2
  run "top-p 0.9: 1 process, 1 thread" 1 "--tp 1 $TOPP"
  run "top-p 0.9: 2 ranks, picked" 1 "--tp 2 $TOPP" "${MPIRUN[@]}" -x TK_TP_PICK=local -np 2
  run "top-p 0.9: 2 ranks, rows gathered" 1 "--tp 2 $TOPP" "${MPIRUN[@]}" -x TK_TP_PICK=gather -np 2
} >"${TMPDIR:-/tmp}/tp_cpu.$$" || exit 1
python3 - "${TMPDIR:-/tmp}/tp_cpu.$$" <<'PYEOF'
import json, sys
rows = [l.rstrip("\n").split("\t", 1) for l in open(sys.argv[1])]
ref = {}
print("| run | prefill tok/s | decode tok/s | weights per rank | RSS per rank | head bytes, rank 0 | same ids |")
print("|---|---:|---:|---|---|---:|---|")
for label, js in rows:
    r = json.loads(js)
    st = r["stats"]
    kind = label.split(":")[0] if ":" in label else "greedy"
    ref.setdefault(kind, r["ids"])
    tp = r.get("tensor_parallel")
    mib = lambda b: f"{b / 2**20:.1f} MiB"
    w = ", ".join(mib(x["weight_bytes"]) for x in tp["ranks"]) if tp else "(all)"
    rss = ", ".join(mib(x["rss_bytes"]) for x in tp["ranks"]) if tp else "-"
    hb = tp["ranks"][0]["head_bytes_sent"] if tp and tp["world_size"] > 1 else "-"
    print(f"| {label} | {1000 * st['prefill_tokens'] / st['prefill_ms']:.1f} | {st['decode_tokens_per_s']:.1f} | "
          f"{w} | {rss} | {hb} | {r['ids'] == ref[kind]} |")
PYEOF
rm -f "${TMPDIR:-/tmp}/tp_cpu.$$" "${TMPDIR:-/tmp}/tp_cpu.$$.err"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
