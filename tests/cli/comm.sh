#!/usr/bin/env bash
# The communicator (comm/) across processes: build/tests/test_comm's workers under `mpirun -np 2` and
# `-np 3` on this machine's CPUs (oversubscribed): every collective on odd sizes and dtypes (and GPU
# tensors staged through host memory: without a GPU, the driver's error), a rank
# that dies (SIGKILL, exit) or hangs in the middle of an all-reduce (the others must end non-zero with a
# clear error within TK_COMM_TIMEOUT, never hang), a world size that differs from the size asked for,
# a host program that owns MPI, and `tk doctor` under mpirun. Skips when this tk was built without MPI
# (tk doctor says so) or mpirun is missing.
. "$(dirname "$0")/lib.sh"

TC=$B/tests/test_comm
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
# no other network than loopback, and quiet about what the machine lacks (no InfiniBand here)
MPIRUN+=(--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

have_mpi() {
  if ! "$TK" doctor --json 2>/dev/null | grep -q '"built": true'; then skip "this tk was built without MPI"; return 1; fi
  if ! command -v mpirun >/dev/null; then
    [ -n "${CI:-}" ] && { fail "mpirun is missing (apt install openmpi-bin: scripts/setup.sh)"; return 1; }
    skip "mpirun not found (scripts/setup.sh installs openmpi-bin)"; return 1
  fi
}

# run_mpi LIMIT_S NP ARGS...: mpirun under a hard outer limit (a hang fails the test instead of the
# suite); sets RC, OUT and SECS.
run_mpi() {
  local limit=$1 np=$2; shift 2
  local t0; t0=$(date +%s.%N)
  OUT=$(timeout -k 5 "$limit" "${MPIRUN[@]}" -np "$np" "$@" 2>&1); RC=$?
  SECS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
}

t_collectives_np2() {
  have_mpi || return
  run_mpi 120 2 "$TC" --worker collectives 2
  [ $RC = 0 ] || { fail "mpirun -np 2 collectives exited $RC:"; echo "$OUT" | tail -n 30 >&2; }
  [ "$(grep -c '^6 passed, 0 failed' <<<"$OUT")" = 2 ] || fail "both ranks must pass all 6 tests: $(grep passed <<<"$OUT")"
}

t_collectives_np3() {
  have_mpi || return
  run_mpi 180 3 "$TC" --worker collectives 3
  [ $RC = 0 ] || { fail "mpirun -np 3 collectives exited $RC:"; echo "$OUT" | tail -n 30 >&2; }
  [ "$(grep -c '^6 passed, 0 failed' <<<"$OUT")" = 3 ] || fail "all 3 ranks must pass all 6 tests: $(grep passed <<<"$OUT")"
}

# A rank killed mid-collective: mpirun sees it die and ends the others at once.
t_rank_killed() {
  have_mpi || return
  TK_COMM_TIMEOUT=20 run_mpi 60 3 "$TC" --worker die 1 kill
  [ $RC != 0 ] && [ $RC != 124 ] || fail "exit $RC: the job must fail, not hang ($SECS s)"
  awk -v s="$SECS" 'BEGIN{exit !(s < 20)}' || fail "took ${SECS}s, more than the 20 s timeout"
  grep -q "rank 1: dying (kill)" <<<"$OUT" || fail "the victim did not run: $OUT"
  grep -qi "exited on signal 9\|killed" <<<"$OUT" || fail "mpirun does not name the killed rank: $OUT"
  grep -q "no failure seen" <<<"$OUT" && fail "a survivor finished as if nothing happened"
}

# A rank that exits with an error mid-collective.
t_rank_exits() {
  have_mpi || return
  TK_COMM_TIMEOUT=20 run_mpi 60 2 "$TC" --worker die 0 exit
  [ $RC != 0 ] && [ $RC != 124 ] || fail "exit $RC: the job must fail, not hang"
  awk -v s="$SECS" 'BEGIN{exit !(s < 20)}' || fail "took ${SECS}s"
}

# A rank that hangs: no launcher can see it; the others' timeout must fire, name the collective and the
# rank, and abort the job (which also ends the hung rank).
t_rank_hangs_timeout() {
  have_mpi || return
  TK_COMM_TIMEOUT=3 run_mpi 60 3 "$TC" --worker die 2 hang
  [ $RC != 0 ] && [ $RC != 124 ] || fail "exit $RC: the job must fail within the timeout, not hang"
  awk -v s="$SECS" 'BEGIN{exit !(s < 15)}' || fail "took ${SECS}s for a 3 s timeout"
  grep -q "rank 0: tk: all_reduce of 1000 f32 timed out after 3.0 s: rank 0 of 3 waited for the other ranks" <<<"$OUT" \
    || fail "rank 0's error is missing or unclear: $OUT"
  grep -q "HINT: a rank died, hung or fell far behind" <<<"$OUT" || fail "no hint"
  grep -q "a broken communicator did not stay broken" <<<"$OUT" && fail "a broken communicator worked again"
}

# A rank killed where the launcher does not end the job for it: the timeout is what ends the others.
t_rank_killed_launcher_keeps_going() {
  have_mpi || return
  TK_COMM_TIMEOUT=3 run_mpi 60 3 --mca orte_abort_on_non_zero_status 0 "$TC" --worker die 1 kill
  [ $RC != 0 ] && [ $RC != 124 ] || fail "exit $RC: must fail within the timeout, not hang"
  awk -v s="$SECS" 'BEGIN{exit !(s < 15)}' || fail "took ${SECS}s for a 3 s timeout"
  grep -q "timed out after 3.0 s" <<<"$OUT" || fail "no timeout error: $OUT"
}

t_world_size_differs() {
  have_mpi || return
  run_mpi 60 3 "$TC" --worker expect 2
  [ $RC != 0 ] || fail "3 ranks for a size of 2 must fail"
  grep -q "the job has 3 ranks but 2 were asked for" <<<"$OUT" || fail "unclear error: $OUT"
  grep -q "HINT: start as many ranks as the tensor-parallel size: mpirun -np 2" <<<"$OUT" || fail "no hint: $OUT"
  run_mpi 60 2 "$TC" --worker expect 2
  [ $RC = 0 ] || fail "2 ranks for a size of 2 failed: $OUT"
}

t_host_owns_mpi() {
  have_mpi || return
  run_mpi 60 3 "$TC" --worker host
  [ $RC = 0 ] || { fail "exit $RC"; echo "$OUT" | tail -n 20 >&2; }
  [ "$(grep -c '^1 passed, 0 failed' <<<"$OUT")" = 3 ] || fail "$OUT"
}

t_doctor_under_mpirun() {
  have_mpi || return
  run_mpi 60 2 "$TK" doctor --json
  # exit 7 without a GPU, the same on every rank; only rank 0 prints, one JSON object
  [ $RC = 0 ] || [ $RC = 7 ] || fail "tk doctor under mpirun exited $RC: $OUT"
  local js; js=$(sed -n '/^{/,/^}/p' <<<"$OUT")
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); p=d["parallel"]; assert p["world_size"]==2 and p["backend"]=="mpi", p; \
assert [r["rank"] for r in p["ranks"]]==[0,1], p; assert p["mpi"]["launcher"]=="Open MPI", p; assert all(r["pid"]>0 for r in p["ranks"])' "$js" \
    || fail "doctor --json under mpirun: $OUT"
  [ "$(grep -c '"tk_version"' <<<"$OUT")" = 1 ] || fail "more than one rank printed"
  run_mpi 60 2 "$TK" doctor
  grep -q "^ranks:    2, started by Open MPI, backend mpi" <<<"$OUT" || fail "no ranks line: $OUT"
  grep -q "^  rank 1: " <<<"$OUT" || fail "no line for rank 1: $OUT"
  OUT=$("$TK" doctor 2>&1)   # 0 with a GPU, 7 without
  expect_out "ranks:    1 (not started by mpirun"
  expect_out "MPI:      Open MPI"
}

# Ranks running different tk builds: every rank refuses to join, naming the rank that differs, in
# bounded time (the other binary is this tk with its build id changed, a real different build).
t_ranks_of_different_builds_refused() {
  have_mpi || return
  local id other=$WORK/tk-other
  id=$("$TK" --version | sed -n 's/.*(build \([0-9a-f]*\)).*/\1/p')
  [ ${#id} = 16 ] || { fail "tk --version shows no build id: $("$TK" --version)"; return; }
  python3 - "$TK" "$other" "$id" <<'EOF' || { fail "cannot make the other build"; return; }
import sys
b = open(sys.argv[1], "rb").read()
old = sys.argv[3].encode()
assert b.count(old) == 1, b.count(old)
open(sys.argv[2], "wb").write(b.replace(old, b"0123456789abcdef"))
EOF
  chmod +x "$other"
  "$other" --version | grep -q "(build 0123456789abcdef)" || fail "the other build: $("$other" --version)"
  OUT=$(timeout -k 5 60 "${MPIRUN[@]}" -np 1 "$TK" doctor : -np 1 "$other" doctor 2>&1); RC=$?
  [ $RC != 0 ] && [ $RC != 124 ] || fail "two builds: exit $RC: $OUT"
  grep -q "rank 1 (on [^)]*) runs tk build 0123456789abcdef, rank 0 (on [^)]*) build $id: every rank of a job must run the same tk" <<<"$OUT" ||
    fail "no clear error: $OUT"
  run_mpi 60 2 "$TK" doctor   # one build on both ranks joins (exit 7: no GPU)
  [ $RC = 0 ] || [ $RC = 7 ] || fail "one build under mpirun exited $RC: $OUT"
}

run_tests
