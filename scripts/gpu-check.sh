#!/usr/bin/env bash
# gpu-check.sh — tk's GPU truth in one command, from the bundle of `make gpu-bundle` (.gpu/), never
# calling make: unpack, print the environment, run every GPU test (per-binary timeout), compute-
# sanitizer memcheck on the attention, softmax and norm tests, then bench/gpu_vs_torch.py. After
# every phase the logs and results go to $OUT, so a hang in one phase still returns the others.
#
# On the device machine (the session's device tool), verbatim:
#   run(command="bash scripts/gpu-check.sh", carry=[".gpu"], timeout_s=600)
#
# Prepare here first: `make gpu-bundle` (writes .gpu/, git-ignored; ~30 MB travels). Without a GPU
# the same command is a dry run: every phase runs, GPU work is reported as skipped, exit 0 (CI runs
# it: tests/cli/gpu_check.sh). On a machine with a GPU (nvidia-smi lists one, or /dev/nvidia0, or
# --expect-gpu) every test runs with TK_TEST_GPU=1, so "no device" is a failure, not a skip.
#
# Files under $OUT (at most 8, for the device tool): summary.txt (the table printed last),
# summary.csv, summary.json, env.txt, bench.csv, bench.json, selftest.json, logs.tgz (every log, the
# NCCL bandwidth's comm-bench.log among them).
# Exit: 0 all passed (or dry run), 1 a test/memcheck/bench failed, 2 bad usage, 3 unusable bundle
# (glibc too old, missing library): then env.txt says why and nothing else runs.
#
# Options: --bundle DIR (.gpu), --work DIR (/tmp/tkg: unpacked here), --out DIR ($OUT, else
# WORK/out), --expect-gpu / --dry-run, --test-timeout S (240 per binary), --san-timeout S (270),
# --bench-timeout S (180), --only REGEX (test binaries to run), --no-bench, --no-memcheck,
# --no-selftest, --no-models, --models-timeout S (240), --python PY (python3: the one with torch; a
# dry run uses it for the bench's --cpu-check).
# Phase 1c (tk selftest): the shipped packages pass, the broken test package is caught and routed
# around, a hanging kernel is stopped; without a GPU, the no-device error and the plan.
# Phase 1d (tests/gpu_models.py): the model pipelines (tk model logits, tk generate) with --device cuda
# on the tiny checkpoints of every family, against transformers on the same GPU.
# Phase 1e: block diffusion's speed on the GPU (bench/diffusion_block.sh and bench/serve_diffusion.sh with
# DEVICE=cuda, tk against transformers' generate() on the same GPU; --no-diffusion-bench,
# --diffusion-timeout S (150)).
# Phase 1f (tests/test_comm-mpi's MPI workers, then tests/gpu_tp.py): GPU tensors staged through MPI, then
# a model split over 2 ranks on the GPU with the bundle's MPICH (mpiexec.hydra
# -n 2 tk-mpi ... --tp 2: MPI staging through host memory, both ranks on the one GPU; with 2 GPUs or
# more NCCL too): logits (1e-5 of the largest) and greedy tokens against one process on the same GPU,
# on Llama (GQA), Qwen2, GPT-2, OLMo2, Mixtral and Qwen3-MoE; --no-tp, --tp-timeout S (90). Without a
# GPU the same runs on the CPU (the launcher and tk-mpi work).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$root/.gpu work=/tmp/tkg out=${OUT:-} expect= t_test=240 t_san=270 t_bench=180 only= bench=1 san=1 selftest=1 models=1 t_models=240 py=python3
dbench=1 t_dbench=150 tp=1 t_tp=90
while [ $# -gt 0 ]; do
  case $1 in
    --bundle) bundle=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --expect-gpu) expect=1; shift ;;
    --dry-run) expect=0; shift ;;
    --test-timeout) t_test=$2; shift 2 ;;
    --san-timeout) t_san=$2; shift 2 ;;
    --bench-timeout) t_bench=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --no-bench) bench=0; shift ;;
    --no-memcheck) san=0; shift ;;
    --no-selftest) selftest=0; shift ;;
    --no-models) models=0; shift ;;
    --models-timeout) t_models=$2; shift 2 ;;
    --no-diffusion-bench) dbench=0; shift ;;
    --diffusion-timeout) t_dbench=$2; shift 2 ;;
    --no-tp) tp=0; shift ;;
    --tp-timeout) t_tp=$2; shift 2 ;;
    --python) py=$2; shift 2 ;;
    -h|--help) sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; echo "HINT: bash scripts/gpu-check.sh --help" >&2; exit 2 ;;
  esac
done
for v in "$t_test" "$t_san" "$t_bench" "$t_models" "$t_dbench" "$t_tp"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "gpu-check: timeout '$v' is not a number of seconds" >&2; exit 2; }
done
out=${out:-$work/out}
start=$(date +%s)
mkdir -p "$work" "$out" || exit 2
L=$work/log; rm -rf "$L"; mkdir -p "$L"
B=$work/build-gpu
summary=$out/summary.txt csv=$out/summary.csv
echo "phase,name,status,passed,failed,skipped,seconds,note" >"$csv"
: >"$summary"

# row PHASE NAME STATUS PASSED FAILED SKIPPED SECONDS NOTE
row() {
  echo "$1,$2,$3,$4,$5,$6,$7,\"${8//\"/\'}\"" >>"$csv"
  printf '%-9s %-22s %-8s %5s %5s %5s %6ss  %s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" >>"$summary"
}
# save: the logs and the summary into $OUT (after every phase)
save() {
  tar czf "$out/logs.tgz" -C "$work" log 2>/dev/null
  python3 - "$csv" "$out/summary.json" <<'EOF' 2>/dev/null || true
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
json.dump({"rows": rows, "failed": [r for r in rows if r["status"] in ("FAIL", "TIMEOUT", "ERROR")]},
          open(sys.argv[2], "w"), indent=1)
EOF
}
finish() {
  save
  echo
  echo "== gpu-check summary ($(( $(date +%s) - start ))s; logs: \$OUT/logs.tgz)"
  printf '%-9s %-22s %-8s %5s %5s %5s %7s  %s\n' phase name status pass fail skip time note
  cat "$summary"
  exit "$1"
}

# ---- phase 0: unpack and environment --------------------------------------------------------------
echo "== unpack $bundle into $work"
for f in lib.tgz build.tgz; do
  [ -f "$bundle/$f" ] || { echo "gpu-check: $bundle/$f is missing" >&2
    echo "HINT: run 'make gpu-bundle' on the build machine and carry .gpu" >&2
    row env bundle ERROR 0 0 0 0 "$bundle/$f missing"; finish 3; }
done
rm -rf "$B"
tar xzf "$bundle/lib.tgz" -C "$work" && tar xzf "$bundle/build.tgz" -C "$work" ||
  { row env unpack ERROR 0 0 0 0 "tar failed"; finish 3; }
export PATH=$PATH:/usr/local/cuda/bin TK_HOME=$work/home PYTHONUNBUFFERED=1 TK_TEST_LOG=1
unset TK_ENDPOINT   # the bundle's own registry (api/ctx.c: beside the binaries)
rm -rf "$TK_HOME"

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ -z "$expect" ]; then
  expect=0; { [ "${gpus:-0}" -gt 0 ] || [ -e /dev/nvidia0 ]; } && expect=1
fi
need=$(cat "$bundle/GLIBC" 2>/dev/null || echo "?")
lddv=$(ldd --version 2>&1); have=$(echo "$lddv" | head -n1 | grep -oE '[0-9]+\.[0-9]+$'); have=${have:-?}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   host: $(uname -srm)"
  echo "bundle: $(head -n1 "$bundle/MANIFEST" 2>/dev/null)"
  echo "glibc: have $have, bundle needs $need"
  echo "expect GPU: $expect (nvidia-smi lists ${gpus:-0})"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -n 4
  else echo "nvidia-smi: not found"; fi
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version 2>&1 | tail -n1 || echo "compute-sanitizer: not found"
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -n1
  "$py" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -n1
  echo "-- libraries not found:"; ldd "$B/tk" "$B"/tests/test_gpu_* 2>&1 | grep 'not found' | sort -u || echo "none"
  echo "-- tk doctor"; "$B/tk" doctor 2>&1
} >"$L/env.txt" 2>&1
cp "$L/env.txt" "$out/env.txt"
sed -n '1,12p' "$L/env.txt"
if [ "$need" != "?" ] && [ "$have" != "?" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  echo "gpu-check: this machine's glibc $have is older than the bundle's $need" >&2
  echo "HINT: build the bundle on a machine with glibc <= $have, or build tk here" >&2
  row env glibc ERROR 0 0 0 0 "have $have, need $need"; finish 3
fi
if grep -q 'not found' <(ldd "$B/tk" "$B/libtk.so.0" 2>&1); then
  row env libraries ERROR 0 0 0 0 "a library is not found: env.txt"; finish 3
fi
"$B/tk" doctor --require-gpu >/dev/null 2>&1; doctor=$?
if [ "$expect" = 1 ] && [ $doctor != 0 ]; then
  row env doctor FAIL 0 1 0 0 "a GPU was expected but tk doctor failed (env.txt)"
else
  row env doctor "$([ $doctor = 0 ] && echo ok || echo no-gpu)" 0 0 0 0 "glibc $have (needs $need), $gpus GPU(s)"
fi
export TK_TEST_GPU=$([ "$expect" = 1 ] && echo 1 || echo 0)
# NCCL for the communicator (comm/nccl.c, test_gpu_comm, phase 1b): the system's, else the one a
# pip wheel of torch brought (nvidia-nccl-cu*), named with TK_NCCL
if [ -z "${TK_NCCL:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2' && [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
  nccl=$("$py" -c 'import nvidia.nccl, os; d=os.path.join(list(nvidia.nccl.__path__)[0], "lib"); print(os.path.join(d, "libnccl.so.2"))' 2>/dev/null)
  [ -n "$nccl" ] && [ -e "$nccl" ] && export TK_NCCL=$nccl
fi
echo "nccl: ${TK_NCCL:-libnccl.so.2 from the library path}" >>"$out/env.txt"
save

# ---- phase 1: GPU tests, with memcheck beside them (both are correctness, not timing) --------------
# one binary: timeout, log, one summary row from its last line
run_test() { # PHASE NAME TIMEOUT CMD...
  local phase=$1 name=$2 to=$3; shift 3
  local log=$L/$phase-$name.log t0 rc last p=0 f=0 s=0 st note=""
  t0=$(date +%s)
  timeout -k 5 "$to" "$@" >"$log" 2>&1; rc=$?
  last=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n1)
  if [ -n "$last" ]; then
    p=$(echo "$last" | sed -E 's/^([0-9]+) passed.*/\1/'); f=$(echo "$last" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    s=$(echo "$last" | sed -nE 's/.* ([0-9]+) skipped.*/\1/p'); s=${s:-0}
  fi
  if [ $rc = 124 ] || [ $rc = 137 ]; then st=TIMEOUT note="killed after ${to}s; last: $(tail -n1 "$log" | cut -c1-80)"
  elif [ "$phase" = prepare ]; then # a command, not a test binary: its exit status is the verdict
    if [ $rc = 0 ]; then st=ok p=1; else st=FAIL f=1 note="exit $rc; $(tail -n1 "$log" | cut -c1-100)"; fi
  elif [ $rc != 0 ] || [ "$f" != 0 ] || [ -z "$last" ]; then st=FAIL note="exit $rc; $(grep -m1 -E 'CHECK|FAIL|rror' "$log" | cut -c1-100)"
  elif [ "$p" = 0 ] && [ "$s" != 0 ]; then st=skip note="$(grep -m1 '^skip' "$log" | cut -c1-80)"
  else st=ok; fi
  [ "$phase" = memcheck ] && note="$note $(grep -m1 'ERROR SUMMARY' "$log")"
  row "$phase" "$name" "$st" "$p" "$f" "$s" "$(( $(date +%s) - t0 ))" "$note"
}
export -f run_test row
export L csv summary

echo "== phase 1: GPU tests (TK_TEST_GPU=$TK_TEST_GPU, ${t_test}s each) and memcheck"
jobs_=()
for t in "$B"/tests/test_gpu_* "$B"/tests/test_nvrtc; do
  [ -x "$t" ] && [ -f "$t" ] || continue
  n=$(basename "$t")
  [ -n "$only" ] && ! [[ $n =~ $only ]] && continue
  jobs_+=("run_test test $n $t_test $t")
done
if [ $san = 1 ]; then
  for n in attention softmax norm; do
    [ -n "$only" ] && ! [[ test_gpu_$n =~ $only ]] && continue
    if ! command -v compute-sanitizer >/dev/null; then
      row memcheck "test_gpu_$n" skip 0 0 1 0 "compute-sanitizer not found"; continue
    fi
    if [ "$TK_TEST_GPU" != 1 ]; then row memcheck "test_gpu_$n" skip 0 0 1 0 "no GPU"; continue; fi
    # -lineinfo in NVRTC (jit/compile.c) so reports name source lines
    jobs_+=("TK_NVRTC_LINEINFO=1 run_test memcheck test_gpu_$n $t_san compute-sanitizer --tool memcheck --error-exitcode 7 --print-limit 30 $B/tests/test_gpu_$n")
  done
fi
# the bench's packages, installed and compiled for the GPU beside the tests, so the bench runs warm
if [ $bench = 1 ] && [ "$TK_TEST_GPU" = 1 ]; then
  pk=""; for p in activation rmsnorm rotary softmax sampling cross-entropy flash-attn casted; do pk="$pk kernels-community/$p"; done
  jobs_+=("TK_HOME=$work/bench-home run_test prepare bench-tk-get $t_test $B/tk get$pk")
fi
printf '%s\n' "${jobs_[@]}" | xargs -P 12 -I{} bash -c '{}'
save

# ---- phase 1b: the communicator's NCCL backend (test_gpu_comm ran in phase 1): its bandwidth -------
# bench/comm_bench --nccl: one rank on cuda:0 through an id file; with several GPUs one process each.
if [ "$TK_TEST_GPU" = 1 ] && [ -x "$B/bench/comm_bench" ]; then
  echo "== phase 1b: NCCL all-reduce bandwidth (bench/comm_bench)"
  t0=$(date +%s)
  ng=$(( gpus > 0 ? (gpus < 8 ? gpus : 8) : 1 ))
  idf=$work/nccl-id-$$; rm -f "$idf"
  for r in $(seq 1 $((ng - 1))); do
    timeout -k 5 120 "$B/bench/comm_bench" --nccl --id-file "$idf" --rank "$r" --size "$ng" >"$L/comm-bench-$r.log" 2>&1 &
  done
  if [ "$ng" -gt 1 ]; then
    timeout -k 5 120 "$B/bench/comm_bench" --nccl --id-file "$idf" --rank 0 --size "$ng" >"$L/comm-bench.log" 2>&1; rc=$?
  else
    timeout -k 5 120 "$B/bench/comm_bench" --nccl >"$L/comm-bench.log" 2>&1; rc=$?
  fi
  wait
  row comm "nccl_bench_${ng}gpu" "$([ $rc = 0 ] && echo ok || { [ $rc = 124 ] && echo TIMEOUT || echo FAIL; })" \
    "$([ $rc = 0 ] && echo 1 || echo 0)" "$([ $rc = 0 ] && echo 0 || echo 1)" 0 "$(( $(date +%s) - t0 ))" \
    "$(grep -E '^\| 67108864 ' "$L/comm-bench.log" | cut -c1-80)$(grep -m1 'comm_bench:' "$L/comm-bench.log" | cut -c1-80)"
  save
else
  row comm nccl_bench skip 0 0 1 0 "no GPU"
fi

# ---- phase 1c: tk selftest from the command line (alone on the GPU: its times are the budget) --------
# Every shipped package passes; the broken test package (tests/data/selftest/broken: a wrong element,
# a skipped last row, a trap) is caught and recorded, the report saying CUDA was lost in that process
# after the trap (a sticky error ends it for the process); tk run-op is then routed around it to a good
# kernel, with the warning; a kernel that never returns (tests/data/selftest/hang) is recorded and
# reported timed_out at --timeout, and the command exits at once. $OUT/selftest.json keeps the reports.
if [ $selftest = 1 ]; then
  echo "== phase 1c: tk selftest"
  # the bench's home when phase 1 prepared it: its packages are compiled already (device time)
  SH=$work/selftest-home; rm -rf "$SH"; SJ=$L/selftest
  [ -d "$work/bench-home" ] && SH=$work/bench-home
  mkdir -p "$SJ"
  st_row() { # NAME OK(0/1) SECONDS NOTE
    row selftest "$1" "$([ "$2" = 1 ] && echo ok || echo FAIL)" "$2" "$((1 - $2))" 0 "$3" "$4"
  }
  if [ "$TK_TEST_GPU" != 1 ]; then
    # no GPU: the command must say so (exit 7 with a hint), and the plan must cover every kernel
    TK_HOME=$SH "$B/tk" selftest kernels-community/activation >"$SJ/nogpu.log" 2>&1; rc=$?
    ok=0; [ $rc = 7 ] && grep -q 'HINT' "$SJ/nogpu.log" && ok=1
    st_row no-device "$ok" 0 "exit $rc (want 7 with a hint)"
    t0=$(date +%s)
    pk=""; for p in activation rmsnorm rotary softmax sampling cross-entropy flash-attn casted layers; do pk="$pk kernels-community/$p"; done
    TK_HOME=$SH timeout -k 5 "$t_test" "$B/tk" selftest --plan --arch sm_90 --json $pk >"$SJ/plan.json" 2>"$SJ/plan.log"; rc=$?
    ok=0; [ $rc = 0 ] && python3 - "$SJ/plan.json" <<'PY' && ok=1
import json, sys
r = json.load(open(sys.argv[1]))
bad = [(p["package"], k["kernel"], k["status"]) for p in r for k in p["kernels"] if k["status"] not in ("planned", "skipped")]
sys.exit(1 if bad or len(r) != 9 else 0)
PY
    st_row plan-sm_90 "$ok" "$(( $(date +%s) - t0 ))" "every shipped kernel has cases (no GPU: nothing ran)"
  else
    # 1. every shipped package passes; the time of each is the budget's figure
    pk=""; for p in activation rmsnorm rotary softmax sampling cross-entropy flash-attn casted layers; do pk="$pk kernels-community/$p"; done
    t0=$(date +%s)
    TK_HOME=$SH timeout -k 5 "$t_test" "$B/tk" --quiet get $pk >"$SJ/get.log" 2>&1
    TK_HOME=$SH timeout -k 5 "$t_test" "$B/tk" selftest --json $pk >"$SJ/shipped.json" 2>"$SJ/shipped.log"; rc=$?
    note=$(python3 - "$SJ/shipped.json" <<'PY' 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
print("; ".join("%s %d/%d %.2fs" % (p["package"].split("/")[1], p["counts"]["passed"], len(p["kernels"]) - p["counts"]["skipped"],
                p["seconds"] - p["load_seconds"]) for p in r if "counts" in p))
PY
)
    st_row shipped-pass "$([ $rc = 0 ] && echo 1 || echo 0)" "$(( $(date +%s) - t0 ))" "exit $rc: $note"
    # 2. the broken package: exit 10, each defect named, the trap recovered
    TK_HOME=$SH timeout -k 5 120 "$B/tk" selftest --json --timeout 2 "$root/tests/data/selftest/broken" >"$SJ/broken.json" 2>"$SJ/broken.log"; rc=$?
    ok=0; [ $rc = 10 ] && python3 - "$SJ/broken.json" <<'PY' && ok=1
import json, sys
r = json.load(open(sys.argv[1]))[0]
st = {k["kernel"]: k["status"] for k in r["kernels"]}
want = {"silu_wrong_element_f32": "failed", "silu_skip_last_row_f32": "failed", "silu_trap_f32": "crashed"}
sys.exit(0 if st == want and r.get("cuda_lost") else 1)
PY
    st_row broken-caught "$ok" 0 "exit $rc (want 10): $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; print(", ".join(k["kernel"]+"="+k["status"] for k in r["kernels"]))' "$SJ/broken.json" 2>&1 | cut -c1-120)"
    # 3. tk run-op is routed around the recorded failures, with the warning, to a right result
    TK_HOME=$SH timeout -k 5 120 "$B/tk" run-op silu --package "$root/tests/data/selftest/broken" --device cuda \
      --shape 3,1000 --dtype f32 --check --json >"$SJ/runop.json" 2>"$SJ/runop.log"; rc=$?
    ok=0; [ $rc = 0 ] && grep -q 'kernels-community/activation:silu_f32' "$SJ/runop.json" &&
      grep -q 'not using tk-test/broken-silu@local:silu_wrong_element_f32' "$SJ/runop.log" && ok=1
    st_row routed-around "$ok" 0 "exit $rc; $(grep -o '"impl": "[^"]*"' "$SJ/runop.json" | head -n1)"
    # 4. a launch that never returns is stopped at --timeout (context destroyed; the watchdog is the backstop)
    t0=$(date +%s)
    TK_HOME=$SH timeout -k 5 150 "$B/tk" selftest --json --timeout 1 "$root/tests/data/selftest/hang" >"$SJ/hang.json" 2>"$SJ/hang.log"; rc=$?
    ok=0; [ $rc = 10 ] && python3 - "$SJ/hang.json" <<'PY' && ok=1
import json, sys
r = json.load(open(sys.argv[1]))[0]
st = {k["kernel"]: k["status"] for k in r["kernels"]}
sys.exit(0 if st == {"silu_hang_f32": "timed_out"} and r.get("cuda_lost") else 1)
PY
    st_row hang-timed-out "$ok" "$(( $(date +%s) - t0 ))" "exit $rc (want 10, silu_hang_f32 timed_out in the report, within seconds; 124: killed)"
  fi
  cat "$SJ"/*.json >"$out/selftest.json" 2>/dev/null
  save
fi

# ---- phase 1g: the host's cost of a GPU op through the registry (bench/op_overhead --device cuda) ---
# Block diffusion spent ~13 ms a denoising step on an H200 for ~150 ops (fourth GPU run): this says what
# one op costs the host, issued and waited for, by default and with autotune's lookup or the
# self-test routing left out. Uses phase 1c's home (its packages installed and compiled).
if [ "$TK_TEST_GPU" = 1 ] && [ -x "$B/bench/op_overhead" ] && [ -d "${SH:-/nonexistent}" ]; then
  echo "== phase 1g: a GPU op's host cost (bench/op_overhead --device cuda)"
  for v in default TK_AUTOTUNE=0 TK_SELFTEST=off; do
    t0=$(date +%s)
    env TK_HOME="$SH" $([ $v = default ] || echo "$v") timeout -k 5 120 "$B/bench/op_overhead" 20000 --device cuda \
      >"$L/op-overhead-$v.log" 2>&1; rc=$?
    row bench "op_host_cost_${v%%=*}" "$([ $rc = 0 ] && echo ok || echo FAIL)" "$([ $rc = 0 ] && echo 1 || echo 0)" \
      "$([ $rc = 0 ] && echo 0 || echo 1)" 0 "$(( $(date +%s) - t0 ))" \
      "$(grep '^cuda' "$L/op-overhead-$v.log" | sed 's/  */ /g' | tr '\n' ';' | cut -c1-200)"
  done
  save
else
  row bench op_host_cost skip 0 0 1 0 "no GPU, or phase 1c did not run (its home has the packages)"
fi

# ---- phase 1d: the model pipelines on the GPU against transformers on the same GPU -----------------
# tests/gpu_models.py: the tiny checkpoints of tests/models/make_tiny.py; per causal LM, tk model logits
# (f32, bf16) and tk generate (greedy f32) with --device cuda against transformers on cuda. Rows in
# logs.tgz (log/models.json, models.log); here one summary row, and one per failed check.
if [ $models = 1 ] && [ "$TK_TEST_GPU" = 1 ]; then
  echo "== phase 1d: models on the GPU against transformers (tests/gpu_models.py, ${t_models}s)"
  t0=$(date +%s); MH=$work/bench-home; [ -d "$MH" ] || MH=$work/models-home
  TK_HOME=$MH timeout -k 5 "$t_models" "$py" "$root/tests/gpu_models.py" --tk "$B/tk" --work "$work" \
    --deadline $(( t_models - 30 )) --json "$L/models.json" >"$L/models.log" 2>&1; rc=$?
  last=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$L/models.log" | tail -n1)
  p=$(echo "$last" | sed -nE 's/^([0-9]+) passed.*/\1/p'); f=$(echo "$last" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
  st=$([ $rc = 0 ] && echo ok || { [ $rc = 124 ] && echo TIMEOUT || echo FAIL; })
  row models gpu_models "$st" "${p:-0}" "${f:-1}" 0 "$(( $(date +%s) - t0 ))" "exit $rc; $last"
  grep -E '^[^ ]+ +[a-z0-9_-]+ +FAIL ' "$L/models.log" | head -n 20 | while read -r m c _ v rest; do
    row models "$m:$c" FAIL 0 1 0 0 "$v $rest"
  done
  save
else
  row models gpu_models skip 0 0 1 0 "$([ $models = 1 ] && echo "no GPU" || echo "--no-models")"
fi

# ---- phase 1f: a model split over 2 ranks on the GPU (the bundle's MPICH) ------------------------
# tests/gpu_tp.py: mpiexec.hydra -n 2 tk-mpi (tk against MPICH) with --device cuda --tp 2, both ranks on
# one GPU through MPI staging (NCCL refuses two ranks on one GPU), against one process; with 2 GPUs or
# more also NCCL. Without a GPU the same on the CPU. One summary row, one per failed check.
TKM=$B/tk-mpi MPX=$B/mpich/bin/mpiexec.hydra
left=$(( 540 - ($(date +%s) - start) ))
[ $(( left / 3 )) -lt "$t_tp" ] && t_tp=$(( left / 3 ))
tpdev=$([ "$TK_TEST_GPU" = 1 ] && echo cuda || echo cpu)
if [ $tp = 0 ]; then
  row tp split_2ranks skip 0 0 1 0 "--no-tp"
elif [ ! -x "$TKM" ] || [ ! -x "$MPX" ]; then
  row tp split_2ranks skip 0 0 1 0 "the bundle has no tk-mpi: $(grep '^mpich:' "$bundle/MANIFEST" | cut -c1-100)"
elif ! "$py" -c 'import torch, transformers' >/dev/null 2>&1; then
  row tp split_2ranks "$([ "$TK_TEST_GPU" = 1 ] && echo FAIL || echo skip)" 0 "$([ "$TK_TEST_GPU" = 1 ] && echo 1 || echo 0)" \
    "$([ "$TK_TEST_GPU" = 1 ] && echo 0 || echo 1)" 0 "$py cannot import torch and transformers (tests/tp_models_make.py)"
elif [ "$t_tp" -lt 30 ]; then
  row tp split_2ranks skip 0 0 1 0 "out of time: ${left}s left of the call's 540"
else
  echo "== phase 1f: a model split over 2 ranks, --device $tpdev (tests/gpu_tp.py, ${t_tp}s)"
  # first the communicator alone: test_comm's MPI workers, GPU tensors staged through host memory (both
  # ranks on cuda:0; without a GPU, the driver's error and the communicator still usable)
  t0=$(date +%s)
  if [ -x "$B/tests/test_comm-mpi" ]; then
    TK_COMM_TIMEOUT=60 MPIR_CVAR_ENABLE_GPU=0 timeout -k 5 120 "$MPX" -launcher fork -n 2 "$B/tests/test_comm-mpi" \
      --worker collectives 2 >"$L/tp-comm.log" 2>&1; rc=$?
    n=$(grep -c '^6 passed, 0 failed' "$L/tp-comm.log")
    row tp comm_staging_2ranks "$([ $rc = 0 ] && [ "$n" = 2 ] && echo ok || { [ $rc = 124 ] && echo TIMEOUT || echo FAIL; })" \
      "$([ "$n" = 2 ] && echo 1 || echo 0)" "$([ "$n" = 2 ] && echo 0 || echo 1)" 0 "$(( $(date +%s) - t0 ))" \
      "exit $rc; $n of 2 ranks passed test_comm's 6 worker tests$(grep -m1 -E 'CHECK|FAIL' "$L/tp-comm.log" | cut -c1-80)"
  fi
  t0=$(date +%s); MH=$work/bench-home; [ -d "$MH" ] || MH=$work/models-home
  TK_HOME=$MH TK_COMM_TIMEOUT=60 timeout -k 5 "$t_tp" "$py" "$root/tests/gpu_tp.py" --tk "$B/tk" --tk-mpi "$TKM" \
    --mpiexec "$MPX" --work "$work/tp" --device "$tpdev" --gpus "${gpus:-0}" --deadline $(( t_tp - 20 )) \
    --json "$L/tp.json" >"$L/tp.log" 2>&1; rc=$?
  last=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$L/tp.log" | tail -n1)
  p=$(echo "$last" | sed -nE 's/^([0-9]+) passed.*/\1/p'); f=$(echo "$last" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
  st=$([ $rc = 0 ] && echo ok || { [ $rc = 124 ] && echo TIMEOUT || echo FAIL; })
  row tp "split_2ranks_$tpdev" "$st" "${p:-0}" "${f:-1}" 0 "$(( $(date +%s) - t0 ))" "exit $rc; $last$([ -z "$last" ] && tail -n1 "$L/tp.log" | cut -c1-100)"
  grep -E '^[^ ]+ +[a-z0-9_]+ +[a-z]+ +FAIL ' "$L/tp.log" | head -n 20 | while read -r m c be _ v rest; do
    row tp "$m:$c:$be" FAIL 0 1 0 0 "$v $rest"
  done
  echo "-- tp"; tail -n 14 "$L/tp.log"
  save
fi

# ---- phase 1e: block diffusion's speed on the GPU ------------------------------------------------
# tk generate --device cuda on bench/make_bench_dgemma.py's random DiffusionGemma against transformers'
# generate() on cuda (bench/diffusion_block.sh, 3 rounds), then tk serve-model --device cuda batching
# DiffusionGemma requests against one at a time (bench/serve_diffusion.sh KIND=dgemma). The bench
# scripts run $TK_PY_VENV/bin/python: here a wrapper that execs $py (a symlink to it loses a venv's
# site-packages: the H200 run of 2026-11-28 could not import torch through one).
left=$(( 540 - ($(date +%s) - start) )) # the device tool's 600 s a call, less the bench's minimum
[ $(( left / 3 )) -lt "$t_dbench" ] && t_dbench=$(( left / 3 ))
if [ $dbench = 1 ] && [ "$TK_TEST_GPU" = 1 ] && [ "$t_dbench" -lt 30 ]; then
  row dbench diffusion_block skip 0 0 1 0 "out of time: ${left}s left of the call's 540"
elif [ $dbench = 1 ] && [ "$TK_TEST_GPU" = 1 ]; then
  echo "== phase 1e: block diffusion's speed on the GPU (${t_dbench}s a script)"
  PW=$work/pywrap; mkdir -p "$PW/bin"
  printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v "$py")" >"$PW/bin/python"; chmod +x "$PW/bin/python"
  DH=$work/bench-home; [ -d "$DH" ] || DH=$work/models-home
  for b in diffusion_block serve_diffusion; do
    t0=$(date +%s)
    if [ $b = diffusion_block ]; then
      DEVICE=cuda HF=1 TK_BUILD=$B TK_PY_VENV=$PW TK_HOME=$DH timeout -k 5 "$t_dbench" bash "$root/bench/diffusion_block.sh" 128 128 8 3 >"$L/$b.log" 2>&1
    else
      DEVICE=cuda KIND=dgemma G=32 S=8 REQS=2 ROUNDS=2 TK_BUILD=$B TK_PY_VENV=$PW TK_HOME=$DH timeout -k 5 "$t_dbench" \
        bash "$root/bench/serve_diffusion.sh" 1 4 8 >"$L/$b.log" 2>&1
    fi
    rc=$?
    st=$([ $rc = 0 ] && echo ok || { [ $rc = 124 ] && echo TIMEOUT || echo FAIL; })
    row dbench "$b" "$st" "$([ $rc = 0 ] && echo 1 || echo 0)" "$([ $rc = 0 ] && echo 0 || echo 1)" 0 "$(( $(date +%s) - t0 ))" \
      "$(grep -E 'tk cached / transformers|^\| 8 ' "$L/$b.log" | tail -n1 | cut -c1-120)"
    echo "-- $b"; tail -n 8 "$L/$b.log"
  done
  save
else
  row dbench diffusion_block skip 0 0 1 0 "$([ $dbench = 1 ] && echo "no GPU" || echo "--no-diffusion-bench")"
fi

# ---- phase 2: benchmarks against PyTorch (alone on the GPU) ----------------------------------------
if [ $bench = 1 ]; then
  left=$(( 540 - ($(date +%s) - start) ))
  [ $left -lt "$t_bench" ] && t_bench=$(( left > 30 ? left : 30 ))
  echo "== phase 2: bench/gpu_vs_torch.py (${t_bench}s)"
  t0=$(date +%s)
  if ! "$py" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' >/dev/null 2>&1; then
    row bench gpu_vs_torch "$([ "$TK_TEST_GPU" = 1 ] && echo FAIL || echo skip)" 0 0 1 0 "$py cannot import torch"
  else
    mode=(--home "$work/bench-home"); [ "$TK_TEST_GPU" = 1 ] || mode=(--cpu-check)
    timeout -k 5 "$t_bench" "$py" "$root/bench/gpu_vs_torch.py" --lib "$B/libtk.so.0" "${mode[@]}" \
      --csv "$out/bench.csv" --json "$out/bench.json" >"$L/bench.log" 2>&1
    rc=$?
    st=$([ $rc = 0 ] && echo ok || { [ $rc = 124 ] && echo TIMEOUT || echo FAIL; })
    row bench "gpu_vs_torch$([ "$TK_TEST_GPU" = 1 ] || echo _cpu_check)" "$st" "$([ $rc = 0 ] && echo 1 || echo 0)" "$([ $rc = 0 ] && echo 0 || echo 1)" 0 \
      "$(( $(date +%s) - t0 ))" "$(tail -n1 "$L/bench.log" | cut -c1-100)"
    echo "-- bench"; grep -E '^\| ' "$L/bench.log" | head -n 45
  fi
fi

bad=$(tail -n +2 "$csv" | cut -d, -f3 | grep -cE '^(FAIL|TIMEOUT|ERROR)$')
finish $([ "$bad" = 0 ] && echo 0 || echo 1)
