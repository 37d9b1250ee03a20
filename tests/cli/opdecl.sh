#!/usr/bin/env bash
# Ops that packages declare (issue 14 item 4): a package declares scale_add in kernel.json "ops" and
# implements it. It is checked at publish (bad declarations refused with exit 5, nothing written),
# listed by tk ops (marked as declared by the package), shape-checked by tk run-op, and named as
# having no CPU reference; `tk run-op --package ./dir` and `tk ops --package ./dir` use a directory
# that is never published; two packages declaring one op differently is an error naming both.
. "$(dirname "$0")/lib.sh"

KEY=$WORK/pub.key
"$TK" keygen "$KEY" >/dev/null || { echo "keygen failed"; exit 1; }
PUB=$(cat "$KEY.pub")

# pkg DIR [NAME]: tests/data/opdecl (scale_add, one f32 kernel), as package NAME (test-org/scale-add).
pkg() {
  rm -rf "$1"; cp -r "$ROOT/tests/data/opdecl" "$1"
  [ -n "${2:-}" ] && sed -i "s|\"test-org/scale-add\"|\"$2\"|" "$1/kernel.json"
  return 0
}
# edit DIR PYTHON: changes DIR/kernel.json with a Python statement over the dict k.
edit() {
  python3 - "$1/kernel.json" "$2" <<'EOF'
import json, sys
k = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(k, open(sys.argv[1], "w"), indent=2)
EOF
}
install() { # publishes DIR to $WORK/reg and installs its package
  "$TK" publish "$1" --to "$WORK/reg" --key "$KEY" -q >/dev/null || { fail "publish $1"; return 1; }
  export TK_ENDPOINT=file://$WORK/reg
  "$TK" trust add "${2%%/*}" "$PUB" -q 2>/dev/null
  "$TK" get "$2" -q >/dev/null 2>&1 || fail "tk get $2 failed: $("$TK" get "$2" 2>&1 | tail -n 3)"
}

t_declared_op_checks_and_lists() {
  pkg "$WORK/sa"
  expect_rc 0 "$TK" check "$WORK/sa" --no-compile
  install "$WORK/sa" test-org/scale-add
  expect_rc 0 "$TK" ops
  expect_out "scale_add  (declared by test-org/scale-add)"
  expect_out "(out: T[..., n], x: T[..., n], y: T[..., n], alpha: f64 = 1) -> out"
  expect_rc 0 "$TK" ops scale_add
  expect_out "declared by test-org/scale-add; no CPU reference"
  expect_out "test-org/scale-add:scale_add_f32"
  "$TK" --json ops | python3 -c '
import json, sys
ops = {o["name"]: o for o in json.load(sys.stdin)}
o = ops["scale_add"]
assert o["standard"] is False and o["declared_by"] == "test-org/scale-add" and o["local"] is False, o
assert o["cpu_reference"] is False and [p["name"] for p in o["params"]] == ["out", "x", "y", "alpha"], o
assert o["params"][1]["dtypes"] == ["f32", "f16"] and o["params"][0]["dtype_like"] == "x", o
assert o["params"][1]["min_rank"] == 1 and o["params"][1]["max_rank"] is None, o
assert [i["impl"] for i in o["implementations"]] == ["test-org/scale-add:scale_add_f32"], o
assert all(p["cpu_reference"] for n, p in ops.items() if p["standard"]), "a standard op lost its reference"
' || fail "tk --json ops: scale_add is not listed as declared"
}

t_run_op_checks_declared_shapes() {
  pkg "$WORK/sa"
  install "$WORK/sa" test-org/scale-add
  # the shapes fit: nothing can run on the host, and it says why (exit 8, unsupported)
  expect_rc 8 "$TK" run-op scale_add --shape 4,8
  expect_out "no CPU reference for op scale_add (declared by test-org/scale-add)"
  OUT=$("$TK" --json run-op scale_add --shape 4,8 2>/dev/null)
  expect_out '"status": "unsupported"'
  # shapes that do not fit the declared patterns: exit 2, the tensor and the symbol named
  expect_rc 2 "$TK" run-op scale_add --shape out=4,8 --shape x=4,8 --shape y=4,6
  expect_out "'y' has shape [4, 6], want [..., n] with n = 8 (from 'out' [4, 8])"
  expect_rc 2 "$TK" run-op scale_add --shape out=4,8 --shape x=4,8 --shape y=3,8
  expect_out "its leading dims (\"...\") are [3], but those of 'out' [4, 8] are [4]"
  expect_rc 2 "$TK" run-op scale_add --shape out=8 --shape x=4,8 --shape y=4,8
  expect_out "'x' has shape [4, 8], want [..., n]: its leading dims"
  expect_rc 2 "$TK" run-op scale_add --shape 4,8 --arg beta=2
  expect_out "scale_add has no parameter 'beta'"
  OUT=$("$TK" --json run-op scale_add --shape out=4,8 --shape x=4,8 --shape y=4,6 2>/dev/null)
  echo "$OUT" | python3 -c 'import json,sys; e=json.load(sys.stdin)["error"]; assert e["status"] == "invalid" and "n = 8" in e["message"], e' \
    || fail "tk --json run-op: shape error is not a JSON error object: $OUT"
}

t_package_directory() {
  pkg "$WORK/sa"
  # never published, never installed: tk ops and tk run-op read it from the directory
  expect_rc 0 "$TK" ops --package "$WORK/sa" scale_add
  expect_out "declared by test-org/scale-add (a local package directory)"
  expect_out "test-org/scale-add@local:scale_add_f32"
  expect_rc 2 "$TK" run-op scale_add --package "$WORK/sa" --shape out=4,8 --shape x=4,8 --shape y=4,6
  expect_out "with n = 8"
  expect_rc 8 "$TK" run-op scale_add --package "$WORK/sa" --shape 4,8
  expect_out "no CPU reference for op scale_add (declared by test-org/scale-add)"
  expect_out "is local: not signed, not installed"
  "$TK" --json ops --package "$WORK/sa" 2>/dev/null | python3 -c '
import json, sys
o = {o["name"]: o for o in json.load(sys.stdin)}["scale_add"]
assert o["local"] is True and o["implementations"][0]["local"] is True, o' || fail "--package: not marked local"
  [ -e "$TK_HOME/store" ] && find "$TK_HOME/store" -type f | grep -q . && fail "--package wrote the store"
  # a built-in op with a package directory's kernels: host tensors still run on the CPU
  expect_rc 0 "$TK" run-op silu_and_mul --package "$ROOT/kernels-src/activation" --shape 4,8
  expect_out "silu_and_mul f32: cpu-"
  # --check needs a GPU run to compare; --device cuda runs the directory's kernel where there is a GPU
  expect_rc 2 "$TK" run-op scale_add --package "$WORK/sa" --shape 4,8 --check
  expect_out "--check compares a GPU run with the CPU reference: add --device cuda"
  expect_rc 2 "$TK" run-op scale_add --package "$WORK/sa" --shape 4,8 --device gpu
  expect_out "--device wants cpu, cuda or cuda:N, got 'gpu'"
  OUT=$("$TK" --json run-op scale_add --package "$WORK/sa" --shape 4,8 --device cuda --check 2>"$WORK/err")
  local rc=$?
  if [ $rc = 7 ]; then # no GPU: a clear device error, as a JSON object
    expect_out '"status": "no_device"'
  elif [ $rc = 0 ]; then # a GPU: the local kernel ran; no CPU reference to check against
    expect_out '"impl": "test-org/scale-add@local:scale_add_f32"'
    expect_out '"check": "unavailable"'
    grep -q "check unavailable: no CPU reference for op scale_add (declared by test-org/scale-add)" "$WORK/err" \
      || fail "--check did not say it is unavailable: $(cat "$WORK/err")"
  else
    fail "tk run-op --device cuda exited $rc: $OUT $(cat "$WORK/err")"
  fi
  # errors, plain and as JSON objects
  expect_rc 3 "$TK" run-op scale_add --package "$WORK/none" --shape 4,8
  expect_out "--package: '$WORK/none' is not a directory"
  OUT=$("$TK" --json run-op scale_add --package "$WORK/none" --shape 4,8 2>/dev/null)
  expect_out '"status": "not_found"'
  OUT=$("$TK" --json ops --package "$WORK/none" 2>/dev/null)
  expect_out '"status": "not_found"'
  OUT=$("$TK" --json run-op no_such_op --shape 4 2>/dev/null)
  expect_out '"status": "not_found"'
  OUT=$("$TK" --json run-op scale_add --shape 4,8 2>/dev/null)
  expect_out '"status": "not_found"'
}

t_bad_declarations_refused_at_publish() {
  local reg=$WORK/reg-bad change want
  while IFS='|' read -r change want; do
    [ -n "$change" ] || continue
    pkg "$WORK/bad"
    edit "$WORK/bad" "$change"
    expect_rc 5 "$TK" publish "$WORK/bad" --to "$reg" --key "$KEY"
    expect_out "$want"
    expect_rc 5 "$TK" check "$WORK/bad" --no-compile
    [ -e "$reg" ] && fail "a refused publish wrote $reg ($change)"
  done <<'CASES'
k["ops"][0]["name"] = "silu_and_mul"|op 'silu_and_mul' is one of tk's own ops: a package may implement it but not redeclare its signature
k["ops"][0]["params"][1]["dtypes"] = ["float32"]|op 'scale_add': param 'x': 'dtypes' must be a non-empty list
k["ops"][0]["params"][1]["shape"] = "[..., 2n]"|op 'scale_add': tensor 'x' has shape [..., 2n]
k["ops"][0]["params"][1]["shape"] = "[..., ..., n]"|at most one "..."
k["ops"][0]["params"][0]["dtype_like"] = "z"|tensor 'out' has dtype_like 'z'
k["ops"][0]["params"][3]["kind"] = "f32"|param 'alpha' needs a 'kind': "tensor", "i64" or "f64"
k["ops"][0]["params"][3]["shape"] = "[n]"|param 'alpha' is a scalar (f64): 'shape' is for tensors
k["ops"][0]["params"][2]["role"] = "inout"|'role' is "in" (read) or "out" (written)
k["ops"][0]["params"].append(dict(k["ops"][0]["params"][2]))|op 'scale_add': param 'y' is declared twice
k["ops"].append(dict(k["ops"][0]))|op 'scale_add' is declared twice
k["ops"][0]["params"][1]["shpe"] = "[n]"|unknown key 'shpe' in ops[0].params[1] (op 'scale_add')
k["kernels"][0]["params"][1]["name"] = "z"|kernel 'scale_add_f32': param 'z' is not a parameter of op 'scale_add' (out, x, y, alpha)
k["kernels"][0]["params"][0]["dtype"] = "bf16"|kernel 'scale_add_f32': tensor 'out' has dtype bf16, which op 'scale_add' does not allow there
k["kernels"][0]["params"][3]["type"] = "i32"|kernel 'scale_add_f32': param 'alpha' is a i32, but op 'scale_add' has it as a f64
k["kernels"][0]["params"].pop(2)|kernel 'scale_add_f32' does not take 'y', a tensor op 'scale_add' requires
CASES
}

t_two_packages_one_op() {
  pkg "$WORK/a"
  install "$WORK/a" test-org/scale-add
  # the same signature from another package: one op with two implementations
  pkg "$WORK/b" other-org/scale-add-fast
  install "$WORK/b" other-org/scale-add-fast
  expect_rc 0 "$TK" ops scale_add
  expect_out "other-org/scale-add-fast:scale_add_f32"
  expect_out "test-org/scale-add:scale_add_f32"
  # another signature from a third package: refused at install, naming both
  pkg "$WORK/c" third-org/scale-add-i
  edit "$WORK/c" 'k["ops"][0]["params"][3]["kind"] = "i64"; k["ops"][0]["params"][3]["default"] = 1; k["kernels"][0]["params"][3]["type"] = "i64"'
  # the kernel takes what its manifest says (publish compares the two, jit/ptxsig.c)
  sed -i 's/float alpha/long long alpha/' "$WORK/c/scale_add.cu"
  "$TK" publish "$WORK/c" --to "$WORK/reg" --key "$KEY" -q >/dev/null || fail "publish c"
  "$TK" trust add third-org "$PUB" -q 2>/dev/null
  expect_rc 5 "$TK" get third-org/scale-add-i
  expect_out "op 'scale_add' is declared differently by the installed"
  expect_out "and by third-org/scale-add-i"
  expect_out "alpha: i64 = 1"
  "$TK" list 2>/dev/null | grep -q third-org && fail "the refused package was installed"
  # the same through a package directory: tk ops and run-op name both
  expect_rc 5 "$TK" ops --package "$WORK/c"
  expect_out "op 'scale_add' is declared differently by"
  expect_out "third-org/scale-add-i"
  expect_rc 5 "$TK" run-op scale_add --package "$WORK/c" --shape 4,8
  expect_out "declared differently"
}

t_schema_agrees() {
  local py=$TK_PY_VENV/bin/python
  if ! py_has "$py" jsonschema; then
    [ "${CI:-}" = true ] && { fail "jsonschema missing from $py (scripts/setup.sh --test)"; return; }
    skip "no jsonschema in $py"; return
  fi
  # each edit: tk check's verdict, then one python judges them all (start-up is half a second each)
  local change rc n=0 cases=()
  for change in 'pass' 'k["ops"][0]["params"][3]["shape"] = "[n]"' 'k["ops"][0]["params"][1]["shpe"] = "[n]"' \
                'del k["ops"][0]["params"][1]["dtypes"]' 'k["ops"][0]["params"][2]["role"] = "inout"' \
                'k["ops"][0]["params"][3]["kind"] = "f32"' 'k["ops"][0]["params"][1]["default"] = 0'; do
    n=$((n + 1))
    pkg "$WORK/s$n"; edit "$WORK/s$n" "$change"
    "$TK" check "$WORK/s$n" --no-compile >/dev/null 2>&1; rc=$?
    cases+=("$WORK/s$n/kernel.json" "$rc" "$change")
  done
  "$py" - "$ROOT/docs/kernel.schema.json" "${cases[@]}" <<'EOF' || fail "schema and tk disagree"
import json, sys, jsonschema
v = jsonschema.Draft202012Validator(json.load(open(sys.argv[1])))
bad = 0
for f, rc, change in zip(*[iter(sys.argv[2:])] * 3):
    errs = list(v.iter_errors(json.load(open(f))))
    if bool(errs) != (rc != "0"):
        bad += 1
        print(f"schema and tk disagree on: {change} (tk check exit {rc}, schema errors: {[e.message[:100] for e in errs]})")
sys.exit(1 if bad else 0)
EOF
}

run_tests
