#!/usr/bin/env bash
# Kernel authors' loop (issue 14): every mistake in kernel.json is refused by `tk publish` before it
# signs or writes anything; `tk check` / `tk publish --check` also find compile errors; the JSON Schema
# (docs/kernel.schema.json) accepts every kernels-src package and agrees with tk on bad manifests.
. "$(dirname "$0")/lib.sh"

KEY=$WORK/pub.key
"$TK" keygen "$KEY" >/dev/null || { echo "keygen failed"; exit 1; }
PUB=$(cat "$KEY.pub")
PY=$TK_PY_VENV/bin/python

# good_pkg DIR: a correct ReLU package "me/relu".
good_pkg() {
  rm -rf "$1"; mkdir -p "$1"
  cat >"$1/kernel.json" <<'EOF'
{
  "name": "me/relu",
  "version": "1.0.0",
  "license": "MIT",
  "description": "ReLU",
  "kernels": [
    {
      "name": "relu_f32", "op": "relu", "source": "relu.cu", "symbol": "tk_relu_f32",
      "params": [
        {"name": "out", "type": "tensor", "dtype": "f32"},
        {"name": "x", "type": "tensor", "dtype": "f32"},
        {"name": "n", "type": "i64", "value": "numel(x)"}
      ],
      "launch": {"grid": ["cdiv(numel(out), 256)"], "block": ["256"], "smem": "0"},
      "constraints": {"dtypes": ["f32"], "min_cc": 75},
      "priority": 0
    }
  ]
}
EOF
  cat >"$1/relu.cu" <<'EOF'
// relu: out[i] = max(x[i], 0)
extern "C" __global__ void tk_relu_f32(float *out, const float *x, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = x[i] > 0.f ? x[i] : 0.f;
}
EOF
}

# The issue's list of mistakes: "sed expression on kernel.json|what the error must say".
BAD_CASES=(
  's/"source": "relu.cu"/"source": "relux.cu"/|source '"'"'relux.cu'"'"' is not one of the package'"'"'s files'
  's/"dtype": "f32"}/"dtype": "float32"}/|dtype '"'"'float32'"'"''
  's/"launch"/"lanuch"/|did you mean '"'"'launch'"'"'?'
  's/cdiv(numel(out)/cdiv(numel(outt)/|'"'"'outt'"'"' is not a tensor parameter'
  's/"constraints"/"constraint"/|did you mean '"'"'constraints'"'"'?'
  's/"priority"/"prority"/|did you mean '"'"'priority'"'"'?'
  's/"license"/"licence"/|did you mean '"'"'license'"'"'?'
  's/"priority": 0/"priority": "high"/|'"'"'priority'"'"' must be an integer'
  's/"min_cc": 75/"min_cc": "75"/|constraints.min_cc must be an integer'
  's/"dtypes": \["f32"\]/"dtypes": ["float"]/|constraints.dtypes[0] is not a dtype'
  's/"version": "1.0.0"/"version": "1.0"/|'"'"'version'"'"' must be MAJOR.MINOR.PATCH'
  's/"block": \["256"\], //|launch.block must be a list'
  's/"value": "numel(x)"/"value": "numel(x)", "dtype": "i64"/|only a tensor has a '"'"'dtype'"'"''
  's/"min_cc": 75/"min_cc": 75, "align": 3/|constraints.align must be a power of two'
  's/"license": "MIT"/"license": "MIT", "device_toolkit": 2/|needs device toolkit 2; this tk has <tk/device.cuh> version 1'
  's/"license": "MIT"/"license": "MIT", "device_toolkit": "1"/|'"'"'device_toolkit'"'"' must be a positive integer'
)

t_bad_manifests_refused_at_publish() {
  local c sedexp want reg=$WORK/reg-bad
  for c in "${BAD_CASES[@]}"; do
    sedexp=${c%%|*}; want=${c#*|}
    good_pkg "$WORK/bad"; sed -i "$sedexp" "$WORK/bad/kernel.json"
    cmp -s "$WORK/bad/kernel.json" <(good_pkg "$WORK/g"; cat "$WORK/g/kernel.json") && fail "case '$sedexp' changed nothing"
    expect_rc 5 "$TK" publish "$WORK/bad" --to "$reg" --key "$KEY"
    expect_out "$want"
    expect_out "not published"
    [ -e "$reg/kernels" ] || [ -e "$reg/api" ] && fail "case '$sedexp': the registry tree was written"
    expect_rc 5 "$TK" check "$WORK/bad" --no-compile
    expect_out "$want"
  done
  # the line, column and caret of an unknown key
  good_pkg "$WORK/bad"; sed -i 's/"launch"/"lanuch"/' "$WORK/bad/kernel.json"
  expect_rc 5 "$TK" check "$WORK/bad"
  expect_out "kernel.json:14:7: unknown key 'lanuch' in kernels[0] (kernel 'relu_f32')"
  expect_out "      ^"
  # a minified kernel.json: the line is shown around the key, the caret under it
  good_pkg "$WORK/bad"
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["compile"] = {"option": []}; open(sys.argv[1], "w").write(json.dumps(d))' "$WORK/bad/kernel.json"
  expect_rc 5 "$TK" check "$WORK/bad"
  expect_out "unknown key 'option' in compile"
  echo "$OUT" | awk '/^    \.\.\..*"option"/ {getline c; i = index($0, "\"option\""); if (substr(c, i, 1) == "^") ok = 1} END {exit !ok}' ||
    fail "the caret is not under the key: $OUT"
  # a missing source file (not only a misnamed one) and a missing directory
  good_pkg "$WORK/bad"; rm "$WORK/bad/relu.cu"; echo x >"$WORK/bad/README.md"
  expect_rc 5 "$TK" publish "$WORK/bad" --to "$reg" --key "$KEY"
  expect_out "source 'relu.cu' is not one of the package's files"
  expect_rc 3 "$TK" check "$WORK/nothing-here"
  [ -e "$reg" ] && fail "a refused publish created the registry directory"
  return 0
}

t_good_package_publishes_and_installs() {
  good_pkg "$WORK/ok"
  expect_rc 0 "$TK" check "$WORK/ok" --no-compile
  expect_rc 0 "$TK" publish "$WORK/ok" --to "$WORK/reg" --key "$KEY" -q
  export TK_ENDPOINT=file://$WORK/reg
  "$TK" trust add me "$PUB" -q
  expect_rc 0 "$TK" get me/relu
}

have_nvrtc() {
  good_pkg "$WORK/probe"
  "$TK" check "$WORK/probe" --arch sm_80 >/dev/null 2>&1 && return 0
  [ "${CI:-}" = true ] && { fail "NVRTC is needed in CI"; return 1; }
  skip "no NVRTC"; return 1
}

t_check_compiles() {
  have_nvrtc || return 0
  good_pkg "$WORK/c"
  expect_rc 0 "$TK" publish "$WORK/c" --check --arch sm_80,sm_90
  expect_out "every kernel compiled"
  # a symbol the source does not declare: one line per arch, no name-map noise
  sed -i 's/"symbol": "tk_relu_f32"/"symbol": "tk_relu_f33"/' "$WORK/c/kernel.json"
  expect_rc 7 "$TK" check "$WORK/c" --arch sm_80,sm_90
  expect_out "relu.cu (sm_80): kernel 'relu_f32': symbol 'tk_relu_f33' is not declared in relu.cu"
  expect_out "relu.cu (sm_90): kernel 'relu_f32': symbol 'tk_relu_f33' is not declared in relu.cu"
  expect_out "2 of 2 compiles failed"
  expect_no_out "__nv_name_map"
  # the manifest's parameter list against the kernel's own (the PTX entry): one parameter short (the
  # kernel would read past tk's argument array in cuLaunchKernel), one too many, a size that differs
  good_pkg "$WORK/c"; sed -i 's/long long n)/long long n, float alpha)/' "$WORK/c/relu.cu"
  expect_rc 7 "$TK" check "$WORK/c" --arch sm_90
  expect_out "relu.cu (sm_90): kernel 'relu_f32': the manifest lists 3 parameters, 'tk_relu_f32' takes 4"
  expect_out "HINT: 'params' must list every parameter of the __global__ function"
  expect_rc 7 "$TK" publish "$WORK/c" --check --arch sm_90
  good_pkg "$WORK/c"; sed -i 's/const float \*x, long long n)/long long n)/; s/x\[i\] > 0.f ? x\[i\]/out[i] > 0.f ? out[i]/' "$WORK/c/relu.cu"
  expect_rc 7 "$TK" check "$WORK/c" --arch sm_90
  expect_out "the manifest lists 3 parameters, 'tk_relu_f32' takes 2"
  good_pkg "$WORK/c"; sed -i 's/long long n)/int n)/; s/long long i = /int i = /' "$WORK/c/relu.cu"
  expect_rc 7 "$TK" check "$WORK/c" --arch sm_90
  expect_out "kernel 'relu_f32': parameter 3 'n' is 8 bytes in the manifest (i64), 4 in 'tk_relu_f32'"
  # a syntax error, reported as file:line; --check writes nothing, not even the cache
  good_pkg "$WORK/c"; sed -i 's/x\[i\] : 0.f;/x[i] : 0.f/' "$WORK/c/relu.cu"
  expect_rc 7 "$TK" publish "$WORK/c" --check --arch sm_90 --to "$WORK/reg-c" --key "$KEY"
  expect_out "relu.cu:7: error: expected a \";\""
  [ -e "$WORK/reg-c" ] && fail "--check wrote the registry"
  "$TK" cache ls >"$WORK/cache.txt" 2>&1
  grep -q relu "$WORK/cache.txt" && fail "--check wrote the binary cache"
  return 0
}

# <tk/device.cuh> (docs/device-toolkit.md): a package that includes it and declares "device_toolkit": 1
# checks, compiles for sm_80 and sm_90 and publishes with the field kept; a newer one is refused with
# a hint at check and at publish, writing nothing.
t_device_toolkit_package() {
  good_pkg "$WORK/t"
  sed -i 's/"license": "MIT"/"license": "MIT", "device_toolkit": 1/' "$WORK/t/kernel.json"
  cat >"$WORK/t/relu.cu" <<'EOF'
#include <tk/device.cuh>
extern "C" __global__ void tk_relu_f32(float *out, const float *x, tk_i64 n)
{
    tk::map(out, x, n, [](float v) { return v > 0.f ? v : 0.f; });
}
EOF
  expect_rc 0 "$TK" check "$WORK/t" --no-compile
  expect_rc 0 "$TK" publish "$WORK/t" --to "$WORK/reg-t" --key "$KEY" -q
  grep -q '"device_toolkit": 1' "$WORK"/reg-t/kernels/me/relu/resolve/*/manifest.json \
    || fail "the published manifest lost device_toolkit"
  sed -i 's/"device_toolkit": 1/"device_toolkit": 99/' "$WORK/t/kernel.json"
  expect_rc 5 "$TK" check "$WORK/t" --no-compile
  expect_out "needs device toolkit 99"
  expect_out "HINT: upgrade tk"
  expect_rc 5 "$TK" publish "$WORK/t" --to "$WORK/reg-t2" --key "$KEY"
  [ -e "$WORK/reg-t2" ] && fail "a refused publish wrote the registry"
  have_nvrtc || return 0
  sed -i 's/"device_toolkit": 99/"device_toolkit": 1/' "$WORK/t/kernel.json"
  expect_rc 0 "$TK" check "$WORK/t" --arch sm_80,sm_90
  expect_out "every kernel compiled"
  return 0
}

t_schema_agrees_with_tk() {
  if ! py_has "$PY" jsonschema; then
    [ "${CI:-}" = true ] && { fail "jsonschema missing from $PY (scripts/setup.sh --test)"; return; }
    skip "no jsonschema in $PY"; return
  fi
  # every shipped package passes tk check and validates against the schema; each bad manifest is
  # refused by both (the ones tk refuses for a reason beyond the schema's reach, an unknown tensor in
  # an expression or a missing file, are left out). One python for all the schema checks: each
  # process is half a second of start-up.
  local f d c sedexp n=0 good=() bad=()
  for f in "$ROOT"/kernels-src/*/kernel.json; do
    expect_rc 0 "$TK" check "$(dirname "$f")" --no-compile
    good+=("$f")
  done
  for c in "${BAD_CASES[@]}"; do
    sedexp=${c%%|*}
    case "$sedexp" in *outt*|*relux*) continue ;; esac
    n=$((n + 1)); d=$WORK/s$n
    good_pkg "$d"; sed -i "$sedexp" "$d/kernel.json"
    expect_rc 5 "$TK" check "$d" --no-compile
    bad+=("$d/kernel.json")
  done
  [ ${#bad[@]} -ge 3 ] || fail "only ${#bad[@]} bad manifests"
  expect_rc 0 "$PY" - "$ROOT/docs/kernel.schema.json" "${#good[@]}" "${good[@]}" "${bad[@]}" <<'EOF'
import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
jsonschema.Draft202012Validator.check_schema(schema)
v = jsonschema.Draft202012Validator(schema)
ngood, files = int(sys.argv[2]), sys.argv[3:]
wrong = 0
for i, f in enumerate(files):
    errs = list(v.iter_errors(json.load(open(f))))
    if i < ngood and errs:
        wrong += 1
        for e in errs: print(f, list(e.absolute_path), e.message[:200])
    elif i >= ngood and not errs:
        wrong += 1
        print(f, "is accepted by the schema, refused by tk check:", open(f).read()[:400])
sys.exit(1 if wrong else 0)
EOF
  return 0
}

t_variant_expansion_matches_expanded_manifest() {
  # kernels-src/activation declares 11 templated entries; published, they are the 33 kernels of the
  # hand-expanded manifest it replaced (tests/data/activation.expanded.json), in the same order
  expect_rc 0 "$TK" publish "$ROOT/kernels-src/activation" --to "$WORK/reg-a" --key "$KEY" -q
  expect_rc 0 python3 -c '
import json, sys
got = json.load(open(sys.argv[1]))["kernels"]
want = json.load(open(sys.argv[2]))["kernels"]
src = json.load(open(sys.argv[3]))["kernels"]
assert len(src) == 11 and len(got) == 33 and len(want) == 33, (len(src), len(got))
for i, (g, w) in enumerate(zip(got, want)):
    assert g == w, (i, g, w)
' "$WORK/reg-a/kernels/kernels-community/activation/resolve/v1/manifest.json" \
    "$ROOT/tests/data/activation.expanded.json" "$ROOT/kernels-src/activation/kernel.json"
  # a template of the test package, then mistakes in it
  good_pkg "$WORK/v"
  sed -i -e 's/"name": "relu_f32"/"name": "relu_{dtype}", "dtypes": ["f32", "f16"]/' \
    -e 's/"symbol": "tk_relu_f32"/"symbol": "tk_relu<{T}>"/' -e 's/"dtype": "f32"}/"dtype": "{dtype}"}/' \
    -e 's/"dtypes": \["f32"\], "min_cc"/"dtypes": ["{dtype}"], "min_cc"/' "$WORK/v/kernel.json"
  expect_rc 0 "$TK" check "$WORK/v" --no-compile
  cp "$WORK/v/kernel.json" "$WORK/v.json"
  sed -i 's/"relu_{dtype}"/"relu"/' "$WORK/v/kernel.json"
  expect_rc 5 "$TK" check "$WORK/v" --no-compile
  expect_out "needs '{dtype}' in its name"
  cp "$WORK/v.json" "$WORK/v/kernel.json"; sed -i 's/"f32", "f16"\]/"f32", "float16"]/' "$WORK/v/kernel.json"
  expect_rc 5 "$TK" publish "$WORK/v" --to "$WORK/reg-v" --key "$KEY"
  expect_out "dtypes[1] ('float16') is not a dtype"
  cp "$WORK/v.json" "$WORK/v/kernel.json"; sed -i 's/tk_relu<{T}>/tk_relu<{Type}>/' "$WORK/v/kernel.json"
  expect_rc 5 "$TK" check "$WORK/v" --no-compile
  expect_out "'{Type}' is not a variant placeholder"
  # a failure inside a variant is located at its template entry
  cp "$WORK/v.json" "$WORK/v/kernel.json"; sed -i 's/numel(out), 256/numel(outt), 256/' "$WORK/v/kernel.json"
  expect_rc 5 "$TK" check "$WORK/v" --no-compile
  expect_out "kernel.json:7:5: kernel 'relu_f32', launch.grid[0]"
  [ -e "$WORK/reg-v" ] && fail "a refused publish wrote the registry"
  return 0
}

# softmax, sampling, casted and flash-attn declare variants too: published, their templates give the
# kernels they were listed as before (tests/data/PKG.expanded.json), the same set, and in the same
# order among the kernels a call can choose between (same op, same tensor dtypes), so dispatch and
# its tie-breaks are unchanged.
t_variant_packages_match_snapshots() {
  local p
  for p in softmax sampling casted flash-attn; do
    expect_rc 0 "$TK" publish "$ROOT/kernels-src/$p" --to "$WORK/reg-$p" --key "$KEY" -q
    expect_rc 0 python3 -c '
import json, sys
got = json.load(open(sys.argv[1]))["kernels"]
want = json.load(open(sys.argv[2]))["kernels"]
src = json.load(open(sys.argv[3]))["kernels"]
assert sum(1 for k in src if "dtypes" in k) > 0 and len(src) < len(want), (len(src), len(want))
key = lambda k: json.dumps(k, sort_keys=True)
assert sorted(map(key, got)) == sorted(map(key, want)), "the expanded kernels differ from the snapshot"
sig = lambda k: (k["op"], tuple(p.get("dtype", "") for p in k["params"] if p["type"] == "tensor"))
for s in set(map(sig, want)):
    a = [k["name"] for k in want if sig(k) == s]
    b = [k["name"] for k in got if sig(k) == s]
    assert a == b, (s, a, b)
' "$WORK"/reg-$p/kernels/kernels-community/$p/resolve/v1/manifest.json "$ROOT/tests/data/$p.expanded.json" \
      "$ROOT/kernels-src/$p/kernel.json"
  done
  return 0
}

t_init_skeleton_passes_check() {
  cd "$WORK" || return
  expect_rc 0 "$TK" init me/vec-add
  expect_out "next: tk check ./vec-add"
  [ -f vec-add/kernel.json ] && [ -f vec-add/vec-add.cu ] && [ -f vec-add/README.md ] || fail "files missing"
  expect_rc 0 "$TK" check ./vec-add --no-compile
  expect_rc 6 "$TK" init me/vec-add
  expect_out "already holds a kernel.json"
  expect_rc 2 "$TK" init 'me/bad name'
  expect_rc 0 "$TK" init plain --dir "$WORK/p2" -q
  grep -q '"name": "my-org/plain"' "$WORK/p2/kernel.json" || fail "default org"
  have_nvrtc || return 0
  expect_rc 0 "$TK" publish ./vec-add --check
  expect_rc 0 "$TK" publish ./vec-add --to "$WORK/reg-i" --key "$KEY" -q
  export TK_ENDPOINT=file://$WORK/reg-i
  "$TK" trust add me "$PUB" -q
  expect_rc 0 "$TK" build me/vec-add --arch sm_80
  expect_out "1 compiled"
}

t_build_and_run_from_directory() {
  have_nvrtc || return 0
  good_pkg "$WORK/d"
  expect_rc 0 "$TK" build "$WORK/d" --arch sm_80,sm_90
  expect_out "2 compiled"
  # progress: one line per unit as it finishes, counted over both archs, then one summary
  expect_out "[1/2] relu.cu sm_"
  expect_out "[2/2] relu.cu sm_"
  expect_out "me/relu@local: 2 compiled in "
  echo "$OUT" | awk 'length > 100 {bad = 1} END {exit bad}' || fail "a progress line is over 100 columns"
  expect_out "is local: not signed, not installed"
  expect_rc 0 "$TK" build "$WORK/d" --arch sm_90
  expect_out "1 already cached"
  expect_rc 0 "$TK" cache ls
  expect_out "me/relu@local"
  # nothing installed, no store entry
  expect_rc 0 "$TK" list
  expect_out "no packages installed"
  # a broken directory is refused as publish would refuse it
  sed -i 's/"launch"/"lanuch"/' "$WORK/d/kernel.json"
  expect_rc 5 "$TK" build "$WORK/d" --arch sm_90
  expect_out "did you mean 'launch'?"
  # tk run takes a directory too (tk_get_kernel(ctx, "./dir")); without a GPU it stops at the
  # device with exit 7, on a GPU it runs
  good_pkg "$WORK/d"
  OUT=$("$TK" run "$WORK/d" relu_f32 --shape 1024 --shape 1024 2>&1); local rc=$?
  if [ $rc = 7 ]; then
    case "$OUT" in *"CUDA"*|*"GPU"*) ;; *) fail "tk run exited 7 without naming the device: $OUT" ;; esac
  elif [ $rc != 0 ]; then
    fail "tk run ./dir exited $rc: $OUT"
  fi
  return 0
}

t_check_json_shape() {
  # one object whether the check passes or not: ok, dir, compiled, report, error (the error object's
  # inner shape, status as a token and the hint in its own field)
  local d="$WORK/cj"
  good_pkg "$d"
  OUT=$("$TK" check --json --no-compile "$d") || fail "good package: $OUT"
  "$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); assert d=={"ok":True,"dir":sys.argv[2],"compiled":False,"report":None,"error":None}, d' "$OUT" "$d" \
    || fail "good package shape: $OUT"
  sed -i 's/"lanuch"/"launch"/; s/"launch"/"lanuch"/' "$d/kernel.json"
  OUT=$("$TK" check --json --no-compile "$d"); local rc=$?
  [ "$rc" = 5 ] || fail "bad manifest exit $rc"
  "$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); e=d["error"]; assert d["ok"] is False and e["status"]=="manifest" and e["exit_code"]==5 and "lanuch" in e["message"] and "HINT" not in e["message"] and e["hint"], d' "$OUT" \
    || fail "bad manifest shape: $OUT"
  good_pkg "$d"; sed -i 's/out\[i\] = x\[i\] > 0.f/out[i] = x[i] >>> 0.f/' "$d/relu.cu"
  OUT=$("$TK" check --json --arch sm_80 "$d"); rc=$?
  [ "$rc" = 0 ] && fail "compile error passed"
  "$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); assert d["ok"] is False and d["compiled"] and "relu.cu" in d["report"] and d["error"]["status"]=="compile", d' "$OUT" \
    || fail "compile error shape: $OUT"
  return 0
}

run_tests
