#!/usr/bin/env bash
# tk selftest and its traces in the other commands, without a GPU (docs/selftest.md): the errors (no
# device: exit 7 with the hint, in text and JSON; a stub driver; usage), the plan (every kernel of a
# package has cases, the JSON shape), tk get --selftest without a GPU (the install stands), and
# records written into cache.db the way a GPU run writes them (through sqlite3, the on-disk contract)
# as tk selftest --records, tk cache ls, tk info and tk doctor show them, then forgotten. The GPU half
# is tests/test_gpu_selftest.c and scripts/gpu-check.sh's phase 1b.
. "$(dirname "$0")/lib.sh"

no_gpu() {
  local n; n=$("$TK" doctor --json 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["gpus"]))' 2>/dev/null)
  [ "${n:-0}" = 0 ]
}

t_no_device_is_exit_7_with_a_hint() {
  no_gpu || { skip "this machine has a GPU"; return; }
  expect_rc 7 "$TK" selftest kernels-community/activation
  expect_out "a self-test needs the GPU it proves kernels for"
  expect_out "HINT:"
  expect_rc 7 "$TK" selftest
  expect_rc 7 "$TK" selftest --results
  OUT=$("$TK" --json selftest kernels-community/activation 2>/dev/null); local rc=$?
  [ $rc = 7 ] || fail "--json: exit $rc, want 7"
  echo "$OUT" | python3 -c '
import json, sys
e = json.load(sys.stdin)["error"]
assert e["status"] == "no_device" and e["exit_code"] == 7, e
assert e["hint"] and "GPU" in e["hint"], e
assert "HINT" not in e["message"], e
' || fail "--json error object: $OUT"
  # the toolkit's stub libcuda is not a driver: the same exit, its own reason
  local stub
  for stub in /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so; do
    [ -f "$stub" ] || continue
    expect_rc 7 env TK_LIBCUDA="$stub" "$TK" selftest kernels-community/activation
    expect_out "stub"
    break
  done
}

t_usage_errors() {
  expect_rc 2 "$TK" selftest --bogus
  expect_out "unknown option '--bogus'"
  expect_rc 2 "$TK" selftest --device cpu kernels-community/activation
  expect_out "--device wants cuda or cuda:N"
  expect_rc 2 "$TK" selftest --timeout 0 kernels-community/activation
  expect_rc 2 "$TK" selftest --timeout abc kernels-community/activation
  expect_rc 2 "$TK" selftest --arch sm_90 kernels-community/activation
  expect_out "--arch goes with --plan"
  expect_rc 2 "$TK" selftest --results --forget
  expect_rc 2 "$TK" selftest --records --op silu
  expect_rc 2 "$TK" selftest --op
  OUT=$("$TK" --json selftest --bogus 2>/dev/null); case "$OUT" in *'"status": "usage"'*) ;; *) fail "--json usage: $OUT" ;; esac
  expect_rc 0 "$TK" selftest --help
  expect_out "EXIT STATUS"
  expect_out "--plan"
  expect_rc 2 env TK_SELFTEST=sometimes "$TK" selftest --records
  expect_out "TK_SELFTEST='sometimes'"
  echo '{"selftest": "always"}' >"$TK_HOME/config.json"
  expect_rc 2 "$TK" selftest --records
  expect_out '"selftest" must be "off", "record" or "required"'
  rm -f "$TK_HOME/config.json"
}

t_plan_covers_every_kernel() {
  "$TK" --quiet get kernels-community/activation --no-build >/dev/null 2>&1 || { fail "tk get activation"; return; }
  expect_rc 0 "$TK" selftest --plan --arch sm_80 kernels-community/activation
  expect_out "33 planned, 0 untested"
  OUT=$("$TK" --json selftest --plan --arch sm_90 kernels-community/activation ./tests/data/selftest/broken 2>/dev/null) ||
    { fail "tk --json selftest --plan failed: $OUT"; return; }
  echo "$OUT" | python3 -c '
import json, sys
r = json.load(sys.stdin)
assert [p["package"] for p in r] == ["kernels-community/activation", "tk-test/broken-silu"], r
for p in r:
    assert p["plan"] is True and p["arch"] == "sm_90", p
    for k in p["kernels"]:
        assert k["status"] == "planned" and k["cases"] > 0, k
        assert len(k["detail"]["case_labels"]) == k["cases"], k
        assert set(k) >= {"kernel", "op", "status", "cases", "seconds", "detail"}, k
    assert p["counts"]["planned"] == len(p["kernels"]), p
    assert p["cpu_seconds"] >= 0
assert r[1]["local"] is True
labels = [l for k in r[1]["kernels"] for l in k["detail"]["case_labels"]]
assert any("[1, 1]" in l for l in labels) and any("4099" in l for l in labels), labels
' || fail "plan JSON: $(echo "$OUT" | head -c 600)"
  # -v lists the cases
  expect_rc 0 "$TK" -v selftest --plan --arch sm_80 ./tests/data/selftest/broken
  expect_out "silu f32 [1, 1]"
  expect_rc 3 "$TK" selftest --plan nobody/nothing
}

t_get_selftest_without_a_gpu() {
  no_gpu || { skip "this machine has a GPU"; return; }
  expect_rc 7 "$TK" get kernels-community/softmax --selftest --no-build
  expect_out "no GPU to test on"
  expect_out "HINT:"
  expect_rc 0 "$TK" info kernels-community/softmax # the install stands
  OUT=$("$TK" --json get kernels-community/softmax --selftest --no-build 2>/dev/null); local rc=$?
  [ $rc = 7 ] || fail "--json get --selftest: exit $rc, want 7"
  echo "$OUT" | python3 -c '
import json, sys
p = json.load(sys.stdin)[0]
assert p["name"] == "kernels-community/softmax", p
assert p["selftest"][0]["error"]["status"] == "no_device", p["selftest"]
' || fail "get --selftest --json: $OUT"
}

# A record as a GPU run writes it, straight into cache.db (the schema is the contract: cache/kcache.c).
put_record() { # KEY KERNEL PACKAGE STATUS PID
  python3 - "$TK_HOME/cache/cache.db" "$@" <<'PY'
import sqlite3, sys, time
db, key, kernel, pkg, status, pid = sys.argv[1:7]
c = sqlite3.connect(db)
c.execute("INSERT OR REPLACE INTO selftest VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
          (key, kernel, "GPU-0f0f0f0f-1111-2222-3333-444455556666", "570.86.15/12080", "0.1.0", pkg, "silu", status,
           '{"summary": "case \'silu f32 [3, 7]\': out[1, 3] got 2 want 1"}', "NVIDIA H100 80GB HBM3", int(pid),
           int(time.time()), 0.01))
c.commit()
PY
}

t_records_in_every_view() {
  "$TK" --quiet get kernels-community/activation --no-build >/dev/null 2>&1 || { fail "tk get"; return; }
  "$TK" --quiet build kernels-community/activation --arch sm_80 >/dev/null 2>&1 || { skip "no NVRTC to build with"; return; }
  local key commit dead
  key=$("$TK" --json cache ls | python3 -c 'import json,sys; print(next(e["key"] for e in json.load(sys.stdin) if "silu" in " ".join(e["kernels"]) or e["kernel_count"] > 3))')
  commit=$("$TK" --json info kernels-community/activation | python3 -c 'import json,sys; print(json.load(sys.stdin)["commit"])')
  sh -c 'exit 0' & dead=$!; wait $dead # a pid that has ended
  put_record "$key" silu_f32 "kernels-community/activation@$commit" failed 0 || { fail "insert"; return; }
  put_record "$key" gelu_f32 "kernels-community/activation@$commit" running "$dead"
  expect_rc 0 "$TK" selftest --records
  expect_out "FAILED      kernels-community/activation@"
  expect_out "INTERRUPTED"
  expect_out "NVIDIA H100 80GB HBM3"
  OUT=$("$TK" --json selftest --records kernels-community/activation)
  echo "$OUT" | python3 -c '
import json, sys
r = {x["kernel"]: x for x in json.load(sys.stdin)}
assert r["silu_f32"]["status"] == "failed" and r["gelu_f32"]["status"] == "interrupted", r
x = r["silu_f32"]
assert x["package"] == "kernels-community/activation" and len(x["commit"]) == 40, x
assert set(x) >= {"binary_key", "gpu_uuid", "gpu_name", "driver", "tk_version", "tested", "seconds", "detail"}, x
assert "summary" in x["detail"], x
' || fail "records JSON: $OUT"
  # tk cache ls: under the binary they were recorded for
  expect_rc 0 "$TK" cache ls
  expect_out "selftest on NVIDIA H100 80GB HBM3 (driver 570.86.15/12080, tk 0.1.0): 0 passed; not passed: "
  OUT=$("$TK" --json cache ls)
  echo "$OUT" | python3 -c "
import json, sys
es = {e['key']: e for e in json.load(sys.stdin)}
st = es['$key']['selftest']
assert sorted(s['kernel'] for s in st) == ['gelu_f32', 'silu_f32'], st
assert all(e['selftest'] == [] for k, e in es.items() if k != '$key')
" || fail "cache ls JSON: $(echo "$OUT" | head -c 400)"
  # tk info: no GPU here, the records of other GPUs
  expect_rc 0 "$TK" info kernels-community/activation
  expect_out "self-tests: no GPU here; recorded on other GPUs:"
  expect_out "failed      silu_f32 on NVIDIA H100 80GB HBM3"
  OUT=$("$TK" --json info kernels-community/activation)
  echo "$OUT" | python3 -c '
import json, sys
s = json.load(sys.stdin)["selftest"]
assert s["gpus"] == [] and len(s["records"]) == 2, s
' || fail "info JSON: $(echo "$OUT" | tail -c 400)"
  # tk doctor: the count, and what to run
  OUT=$("$TK" doctor 2>&1)
  expect_out "selftest: needs a GPU (2 results recorded for other GPUs"
  OUT=$("$TK" --json doctor 2>/dev/null)
  echo "$OUT" | python3 -c 'import json,sys; s=json.load(sys.stdin)["selftest"]; assert s == {"gpus": [], "records": 2}, s' ||
    fail "doctor JSON selftest: $(echo "$OUT" | tail -c 200)"
  # forgotten: one package, then none left
  expect_rc 0 "$TK" selftest --forget kernels-community/activation
  expect_out "forgot 2 self-test records"
  expect_rc 0 "$TK" selftest --records
  expect_out "no self-test is recorded"
  expect_rc 3 "$TK" selftest --forget nobody/nothing
  # records survive tk cache clear (a binary compiled again has the same key)
  put_record "$key" silu_f32 "kernels-community/activation@$commit" passed 0
  expect_rc 0 "$TK" cache clear
  OUT=$("$TK" --json selftest --records); case "$OUT" in *'"passed"'*) ;; *) fail "cache clear dropped the records: $OUT" ;; esac
}

# An old cache.db (schema 2, before self-tests) is migrated by the command too, keeping its binaries.
t_old_cache_db_migrates() {
  "$TK" --quiet get kernels-community/activation --no-build >/dev/null 2>&1 || { fail "tk get"; return; }
  "$TK" --quiet build kernels-community/activation --arch sm_80 >/dev/null 2>&1 || { skip "no NVRTC to build with"; return; }
  local n db=$TK_HOME/cache/cache.db
  n=$("$TK" --json cache stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["entries"])')
  python3 - "$db" <<'PY' || { fail "could not make a schema-2 cache.db"; return; }
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("DROP TABLE selftest")
c.execute("PRAGMA user_version = 2")
c.commit()
PY
  expect_rc 0 "$TK" selftest --records
  expect_out "no self-test is recorded"
  [ "$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("PRAGMA user_version").fetchone()[0])' "$db")" = 3 ] ||
    fail "cache.db was not migrated to schema 3"
  [ "$("$TK" --json cache stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["entries"])')" = "$n" ] ||
    fail "the migration lost compiled binaries"
}

run_tests
