#!/usr/bin/env bash
# scripts/gpu-check.sh without a GPU, end to end from the bundle of `make gpu-bundle` (.gpu/): every
# phase runs and GPU work is reported as skipped, the results land in --out, and its failure paths
# (no bundle, bad arguments, a failing test binary) are reported, not hidden. In CI a missing bundle
# or torch venv is a failure.
. "$(dirname "$0")/lib.sh"

CHECK=$ROOT/scripts/gpu-check.sh
PY=$TK_PY_VENV/bin/python
case $PY in /*) ;; *) PY=$ROOT/$PY ;; esac

have_bundle() {
  [ -f "$ROOT/.gpu/build.tgz" ] && [ -f "$ROOT/.gpu/lib.tgz" ] && return 0
  [ -n "${CI:-}" ] && { fail "no bundle in $ROOT/.gpu (make gpu-bundle; make test builds it)"; return 1; }
  skip "no bundle in .gpu; run make gpu-bundle"; return 1
}

t_dry_run_every_phase() {
  have_bundle || return
  py_has "$PY" torch || { [ -n "${CI:-}" ] && { fail "no torch in $PY"; return; }; }
  local out=$WORK/out
  expect_rc 0 env -u OUT bash "$CHECK" --dry-run --work "$WORK/w" --out "$out" --python "$PY"
  expect_out "== gpu-check summary"
  expect_out "test_gpu_attention"
  expect_out "compute-sanitizer"
  for f in summary.txt summary.csv summary.json env.txt logs.tgz; do
    [ -s "$out/$f" ] || fail "$f is missing from --out"
  done
  [ "$(ls "$out" | wc -l)" -le 8 ] || fail "more than 8 files in --out (the device tool returns 8)"
  # every GPU test binary of the bundle has a row, and none failed; nothing needs make
  local n; n=$(grep -c '^test,test_gpu_' "$out/summary.csv")
  [ "$n" -ge 8 ] || fail "$n GPU test rows in summary.csv, want 8 or more"
  grep -qE ',(FAIL|TIMEOUT|ERROR),' "$out/summary.csv" && fail "a row failed: $(grep -E ',(FAIL|TIMEOUT|ERROR),' "$out/summary.csv")"
  tar tzf "$out/logs.tgz" | grep -q 'log/test-test_gpu_attention.log' || fail "logs.tgz lacks the attention log"
  grep -q 'glibc: have' "$out/env.txt" || fail "env.txt lacks the glibc line"
  grep -q "registry" "$out/env.txt" || fail "env.txt lacks tk doctor's registry"
  grep -q "file://$WORK/w/build-gpu/registry" "$out/env.txt" || fail "tk doctor does not use the unpacked registry: $(grep -i registry "$out/env.txt")"
  if py_has "$PY" torch; then
    grep -q '^bench,gpu_vs_torch_cpu_check,ok' "$out/summary.csv" || fail "bench --cpu-check did not pass: $(grep bench "$out/summary.csv")"
    [ -s "$out/bench.csv" ] || fail "no bench.csv"
  fi
  # phase 1f, the split over 2 ranks, ran on the CPU with the bundle's mpiexec and tk-mpi
  if grep -q '^mpich: [0-9]' "$ROOT/.gpu/MANIFEST" && py_has "$PY" torch transformers; then
    grep -q '^tp,split_2ranks_cpu,ok,12,0,' "$out/summary.csv" || fail "phase 1f did not pass: $(grep '^tp' "$out/summary.csv")"
    grep -q '^tp,comm_staging_2ranks,ok,1,0,' "$out/summary.csv" || fail "phase 1f's test_comm-mpi did not pass: $(grep '^tp' "$out/summary.csv")"
    tar tzf "$out/logs.tgz" | grep -q 'log/tp.log' || fail "logs.tgz lacks tp.log"
  else
    [ -n "${CI:-}" ] && fail "no phase 1f here: $(grep '^mpich:' "$ROOT/.gpu/MANIFEST")"
    grep -q '^tp,split_2ranks,skip' "$out/summary.csv" || fail "phase 1f neither ran nor skipped: $(grep '^tp' "$out/summary.csv")"
  fi
}

# --no-tp skips phase 1f with a row saying so; --tp-timeout wants seconds
t_no_tp() {
  have_bundle || return
  expect_rc 0 env -u OUT bash "$CHECK" --dry-run --no-bench --no-memcheck --no-selftest --no-models --no-tp \
    --only 'test_nvrtc' --work "$WORK/w4" --out "$WORK/out4" --python "$PY"
  grep -q '^tp,split_2ranks,skip,0,0,1,0,"--no-tp"' "$WORK/out4/summary.csv" || fail "no --no-tp row: $(cat "$WORK/out4/summary.csv")"
  expect_rc 2 bash "$CHECK" --tp-timeout soon
  expect_out "not a number"
}

# Phase 1f's script on the CPU from an unpacked bundle: the bundle's mpiexec runs tk-mpi's split, and a
# tk-mpi whose rank 0 prints scaled logits or other tokens is caught.
t_gpu_tp_script_catches_a_wrong_split() {
  have_bundle || return
  grep -q '^mpich: [0-9]' "$ROOT/.gpu/MANIFEST" || { [ -n "${CI:-}" ] && fail "the bundle has no tk-mpi"; skip "the bundle has no tk-mpi"; return; }
  py_has "$PY" torch transformers || { [ -n "${CI:-}" ] && fail "no transformers in $PY"; skip "no transformers"; return; }
  local u=$WORK/tpb; mkdir -p "$u"
  tar xzf "$ROOT/.gpu/lib.tgz" -C "$u" && tar xzf "$ROOT/.gpu/build.tgz" -C "$u" || { fail "cannot unpack the bundle"; return; }
  cat >"$WORK/badmpi" <<EOF2
#!/usr/bin/env bash
"$u/build-gpu/tk-mpi" "\$@" | python3 -c 'import json,sys; t=sys.stdin.read(); d=json.loads(t) if t.strip() else None
if d and "logits" in d: d["logits"]=[[x*1.001 for x in r] for r in d["logits"]]
if d and "ids" in d: d["ids"][-1]^=1
print(json.dumps(d) if d else "", end="")'
EOF2
  chmod +x "$WORK/badmpi"
  expect_rc 1 env TK_COMM_TIMEOUT=60 "$PY" "$ROOT/tests/gpu_tp.py" --tk "$u/build-gpu/tk" --tk-mpi "$WORK/badmpi" \
    --mpiexec "$u/build-gpu/mpich/bin/mpiexec.hydra" --work "$WORK/tpw" --device cpu --models llama,qwen2 --json "$WORK/tp.json"
  expect_out "0 passed, 4 failed"
  echo "$OUT" | grep -qE '^llama +logits_f32 +auto +FAIL +1\.0' || fail "the scaled logits were not caught: $OUT"
  echo "$OUT" | grep -qE '^qwen2 +greedy_f32 +auto +FAIL' || fail "the changed tokens were not caught: $OUT"
  expect_rc 0 env TK_COMM_TIMEOUT=60 "$PY" "$ROOT/tests/gpu_tp.py" --tk "$u/build-gpu/tk" --tk-mpi "$u/build-gpu/tk-mpi" \
    --mpiexec "$u/build-gpu/mpich/bin/mpiexec.hydra" --work "$WORK/tpw" --device cpu --models llama,qwen2
  expect_out "4 passed, 0 failed"
}

t_missing_bundle_is_an_error() {
  mkdir -p "$WORK/empty"
  expect_rc 3 bash "$CHECK" --bundle "$WORK/empty" --work "$WORK/w2" --out "$WORK/out2"
  expect_out "HINT: run 'make gpu-bundle'"
  grep -q ',ERROR,' "$WORK/out2/summary.csv" || fail "no ERROR row in summary.csv"
}

t_bad_arguments() {
  expect_rc 2 bash "$CHECK" --frobnicate
  expect_out "HINT"
  expect_rc 2 bash "$CHECK" --test-timeout soon
  expect_out "not a number"
  expect_rc 0 bash "$CHECK" --help
  expect_out "carry=[\".gpu\"]"
}

# A test binary that fails (here: the GPU tests with TK_TEST_GPU=1 and no GPU, as on a GPU machine
# whose driver cannot be loaded) makes the whole run fail, with the test named in the summary.
t_failing_test_fails_the_run() {
  have_bundle || return
  "$ROOT/build/tk" doctor --require-gpu >/dev/null 2>&1 && { skip "a GPU is present"; return; }
  expect_rc 1 env -u OUT bash "$CHECK" --expect-gpu --no-bench --no-memcheck --no-models --only 'test_gpu_softmax' \
    --work "$WORK/w3" --out "$WORK/out3" --python "$PY"
  expect_out "test_gpu_softmax"
  grep -q '^test,test_gpu_softmax,FAIL' "$WORK/out3/summary.csv" || fail "softmax row: $(cat "$WORK/out3/summary.csv")"
  grep -q '^env,doctor,FAIL' "$WORK/out3/summary.csv" || fail "doctor row: $(cat "$WORK/out3/summary.csv")"
}

# Phase 1d's script, run here on the CPU (--device cpu) on two families, so that it works when it
# reaches a GPU: the checkpoints written by transformers, tk's logits and greedy tokens against
# transformers', one row per check, and a wrong tk fails it.
t_gpu_models_script_on_cpu() {
  py_has "$PY" transformers || { [ -n "${CI:-}" ] && fail "no transformers in $PY"; skip "no transformers"; return; }
  expect_rc 0 "$PY" "$ROOT/tests/gpu_models.py" --tk "$TK" --work "$WORK/gm" --device cpu --only '^(llama|olmo2)$' \
    --json "$WORK/gm.json" --tokens 8
  expect_out "6 passed, 0 failed"
  "$PY" - "$WORK/gm.json" <<'PY' || fail "gm.json: $(cat "$WORK/gm.json")"
import json, sys
rows = json.load(open(sys.argv[1]))
checks = sorted((r["model"], r["check"], r["status"]) for r in rows)
assert checks == [(m, c, s) for m in ("llama", "olmo2") for c, s in
                  (("greedy_f32", "ok"), ("logits_bf16", "info"), ("logits_f32", "ok"))], checks
PY
  # a tk that answers wrong logits is caught (a wrapper that scales them)
  cat >"$WORK/badtk" <<EOF2
#!/usr/bin/env bash
if [ "\$1" = model ]; then "$TK" "\$@" | python3 -c 'import json,sys; d=json.load(sys.stdin); d["logits"]=[[x*1.01 for x in r] for r in d["logits"]]; print(json.dumps(d))'
else exec "$TK" "\$@"; fi
EOF2
  chmod +x "$WORK/badtk"
  expect_rc 1 "$PY" "$ROOT/tests/gpu_models.py" --tk "$WORK/badtk" --work "$WORK/gm" --device cpu --only '^llama$' --tokens 4
  echo "$OUT" | grep -qE '^llama +logits_f32 +FAIL' || fail "the scaled logits were not caught: $OUT"
}

# The same for the diffusion checks (phase 1d's block_diffusion and masked_diffusion): DiffusionGemma's
# logits, and its generation against transformers' generate() fed the same draws on bd_oracle.py's
# damped checkpoint; LLaDA's and Dream's logits and samplers against dllm_oracle.py; a tk whose
# generated ids differ is caught.
t_gpu_models_diffusion_on_cpu() {
  py_has "$PY" transformers || { [ -n "${CI:-}" ] && fail "no transformers in $PY"; skip "no transformers"; return; }
  expect_rc 0 "$PY" "$ROOT/tests/gpu_models.py" --tk "$TK" --work "$WORK/gm" --device cpu \
    --only '^diffusion_gemma-damped$|masked_diffusion' --checks greedy_f32 --json "$WORK/gmd.json"
  expect_out "11 passed, 0 failed"
  "$PY" - "$WORK/gmd.json" <<'PY' || fail "gmd.json: $(cat "$WORK/gmd.json")"
import json, sys
rows = json.load(open(sys.argv[1]))
checks = sorted((r["model"], r["check"], r["status"]) for r in rows)
d = "diffusion_gemma-damped"
want = [(d, "bd_generate0", "ok"), (d, "bd_generate1", "ok"), (d, "logits_bf16", "info"), (d, "logits_f32", "ok"),
        ("dream", "md_logits_f32", "ok"), ("dream-md3", "md_generate", "ok"), ("dream-md4", "md_generate", "ok"),
        ("llada", "md_logits_f32", "ok"), ("llada-md2", "md_generate", "ok"), ("llama-md0", "md_generate", "ok"),
        ("llama-md1", "md_generate", "ok")]
assert checks == want, checks
PY
  cat >"$WORK/badgen" <<EOF2
#!/usr/bin/env bash
if [ "\$1" = generate ]; then "$TK" "\$@" | python3 -c 'import json,sys; d=json.load(sys.stdin); d["ids"][-1]^=1; print(json.dumps(d))'
else exec "$TK" "\$@"; fi
EOF2
  chmod +x "$WORK/badgen"
  expect_rc 1 "$PY" "$ROOT/tests/gpu_models.py" --tk "$WORK/badgen" --work "$WORK/gm" --device cpu \
    --only '^diffusion_gemma-damped$|masked_diffusion' --checks greedy_f32
  echo "$OUT" | grep -qE '^diffusion_gemma-damped +bd_generate0 +FAIL' || fail "the changed ids were not caught: $OUT"
  echo "$OUT" | grep -qE '^dream-md3 +md_generate +FAIL' || fail "the changed masked diffusion ids were not caught: $OUT"
}

run_tests
