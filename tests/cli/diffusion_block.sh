#!/usr/bin/env bash
# tk generate on DiffusionGemmaForBlockDiffusion (block diffusion) against transformers' own
# DiffusionGemma generate() (tests/models/bd_oracle.py), its torch.randint and torch.multinomial fed from
# the draws file tk reads (--draws): every denoising step must accept the same canvas positions and the
# run must end with the same ids, over the temperature schedule, wide and narrow entropy bounds, the
# stable-and-confident early stop, several blocks (the prompt's sliding window crossed), and an eos that
# ends generation (pad after it). The encoder's cached keys and values against TK_DGEMMA_CACHE=0 (each step
# recomputing them). Then determinism under --seed, --json / --show-steps, and a clear error
# for each kind of bad input. Needs the test venv ($TK_PY_VENV); under CI=true its absence is a failure.
. "$(dirname "$0")/lib.sh"

PY=$TK_PY_VENV/bin/python
ORACLE=$ROOT/tests/models/bd_oracle.py
CK=$WORK/bd

need_model() {
  if ! py_has "$PY" torch transformers safetensors numpy; then
    if [ "${CI:-}" = true ]; then fail "no oracle venv at $PY (CI=true: a missing oracle is a failure)"; else skip "no venv at $PY (scripts/setup.sh --test)"; fi
    return 1
  fi
  [ -f "$CK/.done" ] && return 0
  { "$PY" "$ORACLE" make "$CK" && "$PY" "$ORACLE" make "$CK-eos" eos=41; } >"$WORK/make.log" 2>&1 ||
    { fail "bd_oracle.py make failed:"; tail -n 5 "$WORK/make.log" >&2; return 1; }
  touch "$CK/.done"
}

# JOBS: "DIR PROMPT key=value..." (bd_oracle.py's keys; tk gets the same as flags)
JOBS="bd 5,17,99 max_new_tokens=12 max_denoising_steps=6 seed=5
bd 5,17,99,3 max_new_tokens=18 max_denoising_steps=10 entropy_bound=3.0 seed=1
bd 5,17,99,3,250,7,8,9,10 max_new_tokens=12 max_denoising_steps=8 entropy_bound=1.5 t_min=0.05 t_max=0.3 confidence_threshold=2.0 seed=2
bd 5 max_new_tokens=6 max_denoising_steps=20 entropy_bound=0.5 t_min=0.01 t_max=0.1 confidence_threshold=1.0 stability_threshold=2 seed=3
bd 5,6 max_new_tokens=7 max_denoising_steps=5 stability_threshold=0 confidence_threshold=4.3 seed=4
bd-eos 5,17,99 max_new_tokens=18 max_denoising_steps=6 entropy_bound=2.0 seed=7"

t_matches_transformers() {
  need_model || return
  local n=0 dir prompt args flags a k v
  while read -r dir prompt args; do
    n=$((n + 1)); flags=
    for a in $args; do
      k=${a%%=*}; v=${a#*=}
      case $k in
        max_new_tokens) flags="$flags --gen-length $v" ;;
        max_denoising_steps) flags="$flags --steps $v" ;;
        seed) ;;
        *) flags="$flags --${k//_/-} $v" ;;
      esac
    done
    # shellcheck disable=SC2086
    HF_HUB_OFFLINE=1 "$PY" "$ORACLE" "$WORK/$dir" "$WORK/draws-$n" "$prompt" $args >"$WORK/want-$n.json" 2>"$WORK/oracle-$n.err" ||
      { fail "job $n: the oracle failed: $(tail -n 2 "$WORK/oracle-$n.err")"; continue; }
    # shellcheck disable=SC2086
    "$TK" generate "$WORK/$dir" --ids "$prompt" $flags --draws "$WORK/draws-$n" --json >"$WORK/got-$n.json" 2>"$WORK/tk-$n.err" ||
      { fail "job $n: tk failed: $(cat "$WORK/tk-$n.err")"; continue; }
    python3 - "$WORK/want-$n.json" "$WORK/got-$n.json" "$n" <<'PYEOF' || fail "job $n ($dir $prompt $args) differs from transformers"
import json, sys
w, g = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ws = [(s["block"], s["accepted"]) for s in w["steps"]]
gs = [(s["block"], s["accepted"]) for s in g["stats"]["per_step"]]
for i, (a, b) in enumerate(zip(ws, gs)):
    if a != b:
        print(f"  step {i}: transformers accepts {a}, tk {b}", file=sys.stderr)
        break
ok = ws == gs and w["ids"] == g["ids"] and g["stats"]["forward_passes"] == w["forwards"]
if not ok:
    print(f"  ids: transformers {w['ids']}, tk {g['ids']}; steps {len(ws)} vs {len(gs)}", file=sys.stderr)
print(f"  job {sys.argv[3]}: {len(gs)} steps, {sum(len(a) for _, a in gs)} accepted, end {g['end']}")
sys.exit(0 if ok else 1)
PYEOF
  done <<<"$JOBS"
  # the runs above exercise what they claim: an early stop, several accepted per step, an eos
  grep -q '"stop":true' "$WORK/got-4.json" || fail "job 4 never stopped early"
  grep -q '"end": "eos"' "$WORK/got-6.json" || fail "job 6 did not end at its eos"
  grep -q '"accepted":\[[0-9]*,' "$WORK/got-3.json" || fail "job 3 never accepted two positions in a step"
}

# The encoder's keys and values kept across steps (the default) against TK_DGEMMA_CACHE=0, which runs each
# step's forward over the whole sequence: the same ids, the same accepted positions and stops at every step,
# and the mean entropies equal to rounding, over five blocks past the sliding window (4) and an eos run.
t_cache_matches_recompute() {
  need_model || return
  local i dir args
  for i in 1 2; do
    case $i in
      1) dir=$CK; args="--ids 5,17,99,3,250,7,8,9,10 --gen-length 30 --steps 8 --entropy-bound 1.5 --seed 3" ;;
      2) dir=$CK-eos; args="--ids 5,17,99 --gen-length 30 --steps 6 --entropy-bound 4.0 --seed 6" ;;
    esac
    # shellcheck disable=SC2086
    TK_DGEMMA_CACHE=1 "$TK" generate "$dir" $args --json >"$WORK/kv-on-$i.json" 2>"$WORK/kv-on-$i.err" ||
      { fail "run $i, cache on: $(cat "$WORK/kv-on-$i.err")"; continue; }
    # shellcheck disable=SC2086
    TK_DGEMMA_CACHE=0 "$TK" generate "$dir" $args --json >"$WORK/kv-off-$i.json" 2>"$WORK/kv-off-$i.err" ||
      { fail "run $i, cache off: $(cat "$WORK/kv-off-$i.err")"; continue; }
    python3 - "$WORK/kv-on-$i.json" "$WORK/kv-off-$i.json" "$i" <<'PYEOF' || fail "run $i: the cached and recomputed paths differ"
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
sa, sb = a["stats"]["per_step"], b["stats"]["per_step"]
key = lambda s: (s["block"], s["accepted"], s["stop"])
bad = [i for i, (x, y) in enumerate(zip(sa, sb)) if key(x) != key(y)]
de = max(abs(x["mean_entropy"] - y["mean_entropy"]) for x, y in zip(sa, sb))
ok = a["ids"] == b["ids"] and len(sa) == len(sb) and not bad and de < 1e-4 and a["end"] == b["end"]
ok = ok and a["stats"]["forward_passes"] == b["stats"]["forward_passes"]
blocks = len({s["block"] for s in sa})
print(f"  run {sys.argv[3]}: {blocks} blocks, {len(sa)} steps, end {a['end']}, mean entropies within {de:.1e}")
if not ok:
    print(f"  cached {a['ids']} ({len(sa)} steps), recomputed {b['ids']} ({len(sb)} steps); first differing step "
          f"{bad[:1]}", file=sys.stderr)
sys.exit(0 if ok else 1)
PYEOF
  done
  grep -q '"end": "eos"' "$WORK/kv-on-2.json" || fail "run 2 did not end at its eos"
  [ "$(python3 -c 'import json,sys; print(len({s["block"] for s in json.load(open(sys.argv[1]))["stats"]["per_step"]}))' "$WORK/kv-on-1.json")" = 5 ] ||
    fail "run 1 did not run five blocks"
}

t_seed_determinism() {
  need_model || return
  expect_rc 0 "$TK" generate "$CK" --ids 5,17 --gen-length 6 --steps 4 --seed 9 --json
  local a=$OUT
  expect_rc 0 "$TK" generate "$CK" --ids 5,17 --gen-length 6 --steps 4 --seed 9 --json
  [ "$(echo "$a" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')" = \
    "$(echo "$OUT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')" ] || fail "the same seed gave different ids"
  expect_rc 0 "$TK" generate "$CK" --ids 5,17 --gen-length 6 --steps 4 --seed 10 --json
  [ "$(echo "$a" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')" != \
    "$(echo "$OUT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ids"])')" ] || fail "seeds 9 and 10 gave the same ids"
  echo "$a" | python3 -c '
import json, sys
d = json.load(sys.stdin); s = d["stats"]
assert len(d["ids"]) == 6 and s["sampler"] == "block" and s["alg"] == "entropy_bound" and s["block_length"] == 6, s
assert 0 <= s["sampler_ms"] <= s["ms"] and s["forward_passes"] == len(s["per_step"]) <= 4 and all(0 <= p < 6 for t in s["per_step"] for p in t["accepted"]), s
' || fail "--json shape: $a"
}

t_show_steps_and_auto() {
  need_model || return
  # no --diffusion: the checkpoint picks block diffusion; --show-steps draws each step's argmax canvas
  expect_rc 0 "$TK" generate "$CK" --ids 5,17 --gen-length 12 --steps 3 --show-steps
  expect_out "step 1/6 block 1: "
  expect_out "step 6/6 block 2: "
  expect_out "______" # the second block, not begun
}

t_bad_input() {
  need_model || return
  expect_rc 2 "$TK" generate "$CK" --ids 5 --sampler llada
  expect_out "block diffusion checkpoint"; expect_out "HINT:"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --cfg-scale 2
  expect_out "canvas_length (6)"; expect_out "HINT:"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --block-length 3
  expect_out "block_length"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --temperature 0.5 # its own falls from --t-max to --t-min
  expect_out "falls from t_max to t_min"; expect_out "HINT:"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --top-p 0.9
  expect_out "top_p"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --t-min 0.9 --t-max 0.5
  expect_out "t_min 0.9, t_max 0.5"
  expect_rc 2 "$TK" generate "$CK" --ids 5,300
  expect_out "prompt id 300"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --gen-length 300
  expect_out "longer than the model's context of 256"; expect_out "HINT:"
  head -c 80 /dev/zero >"$WORK/short"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --gen-length 6 --steps 4 --draws "$WORK/short"
  expect_out "ran out of draws"
  # the third draw is 1.5: refused with its number and offset, not used as a probability
  python3 -c 'import struct,sys; sys.stdout.buffer.write(struct.pack("<4000d", 0.25, 0.5, 1.5, *[0.5]*3997))' >"$WORK/bad"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --gen-length 6 --steps 4 --draws "$WORK/bad"
  expect_out "draw 3 (byte offset 16) is 1.5, outside [0, 1)"
  expect_rc 2 "$TK" generate "$CK" --ids 5 --entropy-bound 0
  expect_out "--entropy-bound"
}

run_tests
