#!/usr/bin/env bash
# The JIT half of the main job through the real tk binary, without a GPU: tk get compiles for
# configured archs with real NVRTC, a second run compiles nothing, the cache survives corruption,
# and every GPU-only path fails with a clear status.
. "$(dirname "$0")/lib.sh"

have_nvrtc() { "$TK" doctor --json 2>/dev/null | grep -q '"nvrtc": {'; }
PKG=kernels-community/activation

t_get_compiles_for_config_archs() {
  have_nvrtc || { skip "NVRTC not installed"; return; }
  echo '{"archs": ["sm_80", "sm_90"]}' >"$TK_HOME/config.json"
  # a GPU machine compiles for the GPU it finds instead of the configured archs (tk_build)
  local n=2 bins=binaries
  "$TK" doctor --require-gpu >/dev/null 2>&1 && n=1 bins=binary
  expect_rc 0 "$TK" get $PKG
  expect_out "compiled $n kernel $bins, 0 from the cache"
  expect_rc 0 "$TK" get $PKG
  expect_out "compiled 0 kernel binaries, $n from the cache"
  expect_rc 0 "$TK" cache stats --json
  echo "$OUT" | python3 -c "import json,sys; d=json.load(sys.stdin); assert d['entries']==$n, d" || fail "want $n cache entries: $OUT"
}

t_get_without_gpu_or_archs_installs_only() {
  expect_rc 0 "$TK" get $PKG
  expect_out "installed $PKG"
  if "$TK" doctor --require-gpu >/dev/null 2>&1; then   # a GPU machine: tk get compiles for the GPU it finds
    have_nvrtc && expect_out "compiled 1 kernel binary"
    expect_no_out "no GPU found"
  else
    expect_out "no GPU found and no archs configured"
    # once per machine state: not again on the next get, again with -v
    expect_rc 0 "$TK" get --force $PKG
    expect_no_out "no GPU found"
    expect_rc 0 "$TK" get -v --force $PKG
    expect_out "no GPU found and no archs configured"
  fi
}

t_build_then_cache_hit_then_corruption() {
  have_nvrtc || { skip "NVRTC not installed"; return; }
  expect_rc 0 "$TK" get --no-build $PKG
  expect_rc 0 "$TK" build $PKG --arch sm_90
  expect_rc 0 "$TK" build $PKG --arch sm_90
  expect_out "1"   # one binary, taken from the cache
  # Corrupt every stored blob: the next build must notice, drop the entries and recompile.
  python3 - "$TK_HOME/cache/cache.db" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
cols = [r[1] for r in db.execute("PRAGMA table_info(entries)")] if db.execute(
    "SELECT name FROM sqlite_master WHERE name='entries'").fetchone() else []
tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
done = 0
for t in tables:
    for (c, ty) in [(r[1], r[2]) for r in db.execute(f"PRAGMA table_info({t})")]:
        if ty.upper() == "BLOB":
            db.execute(f"UPDATE {t} SET {c} = zeroblob(length({c}))")
            done += 1
db.commit()
assert done, tables
EOF
  expect_rc 0 "$TK" build $PKG --arch sm_90
  expect_rc 0 "$TK" cache ls --json
  expect_out "sm_90"
  expect_rc 0 "$TK" cache gc --max 1
  expect_rc 0 "$TK" cache stats --json
  echo "$OUT" | python3 -c 'import json,sys; assert json.load(sys.stdin)["entries"] <= 1' || fail "gc left too much: $OUT"
  expect_rc 0 "$TK" cache clear
  expect_rc 0 "$TK" cache stats --json
  echo "$OUT" | python3 -c 'import json,sys; assert json.load(sys.stdin)["entries"] == 0' || fail "clear: $OUT"
}

t_bad_arch_and_compile_error_reported() {
  have_nvrtc || { skip "NVRTC not installed"; return; }
  expect_rc 0 "$TK" get --no-build $PKG
  expect_rc 2 "$TK" build $PKG --arch sm_xx
  expect_out "HINT"
  # A package whose source does not compile: the NVRTC log names the package's file and line.
  local key=$WORK/k.pem d=$WORK/broken
  "$TK" keygen "$key" >/dev/null
  mkdir -p "$d"
  cat >"$d/kernel.json" <<'EOF'
{"name": "tktest/broken", "version": "1.0.0", "license": "MIT",
 "kernels": [{"name": "k", "op": "k", "source": "k.cu", "symbol": "k",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}],
   "launch": {"grid": ["1"], "block": ["32"], "smem": "0"}}]}
EOF
  printf 'extern "C" __global__ void k(float *out) {\n  out[0] = undeclared_name;\n}\n' >"$d/k.cu"
  expect_rc 7 "$TK" publish "$d" --to "$WORK/reg" --key "$key"   # publish refuses it (issue 23, item 7)
  # a registry may still hold one (published with --no-compile, or where there was no NVRTC)
  "$TK" publish "$d" --to "$WORK/reg" --key "$key" -q --no-compile >/dev/null
  export TK_ENDPOINT=file://$WORK/reg
  expect_rc 7 "$TK" get --trust tktest/broken --arch sm_80
  expect_out "k.cu(2)"
  expect_out "undeclared_name"
}

t_gpu_paths_fail_clearly_without_gpu() {
  "$TK" doctor --require-gpu >/dev/null 2>&1 && { skip "a GPU is present"; return; }
  expect_rc 7 "$TK" run $PKG silu_and_mul_f32 --shape out=4,8
  expect_out "HINT"
  # no GPU alone is not a failure (the CPU path works); --require-gpu makes it one
  if have_nvrtc; then expect_rc 0 "$TK" doctor; else expect_rc 7 "$TK" doctor; fi
  expect_out "GPU"
  expect_rc 7 "$TK" doctor --require-gpu
  expect_out "GPU"
  expect_out "registry"
  expect_rc 0 "$B/examples/silu_and_mul"
  expect_out "skip"
}

# constraints.align (bytes every tensor address must be a multiple of) and sm_count in launch rules
# are checked when a package is installed: a power of two, and a name the evaluator knows.
t_align_and_sm_count_validated() {
  local key=$WORK/k2.pem d=$WORK/al n=0
  "$TK" keygen "$key" >/dev/null
  mkdir -p "$d"
  printf 'extern "C" __global__ void k(float *out) { out[0] = 1; }\n' >"$d/k.cu"
  publish_al() { # ALIGN GRID -> a registry holding tktest/al with them; sets TK_ENDPOINT
    n=$((n + 1))
    cat >"$d/kernel.json" <<EOF
{"name": "tktest/al", "version": "1.0.$n", "license": "MIT",
 "kernels": [{"name": "k", "op": "k", "source": "k.cu", "symbol": "k",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}],
   "constraints": {"align": $1},
   "launch": {"grid": ["$2"], "block": ["32"], "smem": "0"}}]}
EOF
    export TK_ENDPOINT=file://$WORK/alreg$n
    OUT=$("$TK" publish "$d" --to "$WORK/alreg$n" --key "$key" -q 2>&1)
  }
  # tk publish runs the install checks first (issue 14), so a bad rule never reaches a registry
  for al in 12 0 '"16"'; do
    publish_al "$al" 1 && fail "published align $al"
    expect_out "constraints.align must be a power of two"
  done
  publish_al 16 "2 * sm_count" || fail "publish align 16 with sm_count: $OUT"
  expect_rc 0 "$TK" get --trust --no-build tktest/al
  publish_al 16 "2 * sm_counts" && fail "published sm_counts"
  expect_out "unknown name 'sm_counts'"
  unset TK_ENDPOINT
}

t_run_fill_is_checked() {
  expect_rc 2 "$TK" run $PKG silu_and_mul_f32 --fill input=lots
  expect_out "want iota or an integer"
  expect_rc 2 "$TK" run $PKG silu_and_mul_f32 --fill input
  expect_out "--fill needs NAME=iota or NAME=INTEGER"
}

# On a GPU: a kernel with index tensors (block table, sequence lengths) runs through tk run, its
# integer tensors filled in range (0, or --fill), its optional tensors left out.
t_run_index_kernel_on_gpu() {
  "$TK" doctor --require-gpu >/dev/null 2>&1 || { skip "no GPU"; return; }
  expect_rc 0 "$TK" run kernels-community/flash-attn attention_decode_bf16_d128 \
    --shape out=2x1x8x128 --shape q=2x1x8x128 --shape k_cache=4x16x2x128 --shape v_cache=4x16x2x128 \
    --shape block_table=2x2 --shape seq_lens=2 --fill seq_lens=20 \
    --arg scale=0.0883883 --arg window_left=-1 --arg softcap=0.0 --iters 3
  expect_out "out"
}

t_check_kernels_sm80_sm90() {
  TK_BUILD=${TK_BUILD:-build} expect_rc 0 bash "$ROOT/tests/check_kernels.sh"
  expect_out "passed, 0 failed"
}

run_tests
