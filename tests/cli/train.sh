#!/usr/bin/env bash
# tk train through the real tk binary: a tiny GPT-2 and a tiny Llama (tests/models/gen_oracle.py, with
# their tokenizer.json) and a tiny BertForMaskedLM (tests/models/train_oracle.py cli) fine-tuned on a
# text file; --json records; the checkpoints load in transformers and give tk's logits; --resume is
# bit-identical to an uninterrupted run; kill -9 at random moments never leaves `latest` pointing at a
# partial checkpoint; Ctrl-C saves; and the bad inputs: empty, binary and too-short data, no tokenizer,
# an unwritable --out, a full disk (the previous checkpoint intact), a NaN weight and an overflowing
# activation (the tensor named), out of memory (the knobs named). The gradients themselves are checked
# against PyTorch by tests/test_train.c. Needs the test venv ($TK_PY_VENV); under CI=true its absence
# is a failure.
. "$(dirname "$0")/lib.sh"

PY=${TK_PY_VENV:-$ROOT/build/py-venv}/bin/python
CK=$WORK/ck
DATA=$WORK/data.txt

need_venv() {
  if ! "$PY" -c "import torch, transformers, tokenizers" 2>/dev/null; then
    if [ "${CI:-}" = true ]; then fail "no test venv at $PY (CI=true: a missing oracle is a failure)"; else skip "no venv at $PY (scripts/setup.sh --test)"; fi
    return 1
  fi
  [ -f "$CK/bert-mlm/model.safetensors" ] && return 0
  "$PY" "$ROOT/tests/models/gen_oracle.py" make "$CK/gpt2" gpt2 >/dev/null 2>"$WORK/make.log" &&
    "$PY" "$ROOT/tests/models/gen_oracle.py" make "$CK/llama" llama >/dev/null 2>>"$WORK/make.log" &&
    "$PY" "$ROOT/tests/models/train_oracle.py" cli "$CK" "$CK/gpt2" >/dev/null 2>>"$WORK/make.log" ||
    { fail "making the tiny checkpoints failed:"; tail -n 5 "$WORK/make.log" >&2; return 1; }
}

python3 - "$DATA" <<'EOF'
import random, sys
random.seed(1)
w = "the quick brown fox jumps over a lazy dog once upon a time there was a little model step by step".split()
open(sys.argv[1], "w").write("\n".join(" ".join(random.choice(w) for _ in range(12)) for _ in range(300)))
EOF

TRAIN=(--data "$DATA" --seq-len 32 --batch-size 4 --eval-fraction 0.05)

t_help_and_usage() {
  expect_rc 0 "$TK" train --help
  expect_out "--checkpointing"
  expect_out "--resume"
  expect_rc 2 "$TK" train
  expect_out "usage: tk train"
  expect_rc 2 "$TK" train "$WORK" --data "$DATA"
  expect_out "--out DIR"
  expect_rc 2 "$TK" train "$WORK" --out "$WORK/o"
  expect_out "--data FILE"
  expect_rc 2 "$TK" train "$WORK" --data "$DATA" --out "$WORK/o" --frobnicate
  expect_out "unknown option '--frobnicate'"
  expect_rc 2 "$TK" train "$WORK" --data "$DATA" --out "$WORK/o" --lr abc
  expect_out "--lr wants a number"
  expect_rc 2 "$TK" train "$WORK" --data "$DATA" --out "$WORK/o" --schedule linear
  expect_out "cosine or constant"
}

# A short run: JSON records, the checkpoint's files, and transformers loading it with tk's logits.
t_gpt2_json_and_transformers_loads_the_checkpoint() {
  need_venv || return
  expect_rc 0 "$TK" --json train "$CK/gpt2" "${TRAIN[@]}" --out "$WORK/g" --steps 12 --lr 1e-3 --warmup 2 --save-every 6
  echo "$OUT" | python3 -c '
import json, sys, math
recs = [json.loads(l) for l in sys.stdin if l.strip()]
steps = [r for r in recs if "loss" in r and "step" in r]
assert [r["step"] for r in steps] == list(range(1, 13)), [r.get("step") for r in steps]
assert all(math.isfinite(r["loss"]) and r["tokens"] > 0 and r["tokens_per_s"] > 0 for r in steps)
assert steps[0]["lr"] == 0.0 and steps[1]["lr"] == 5e-4 and abs(steps[2]["lr"] - 1e-3) < 1e-12, steps[:3]
saved = [r["saved"] for r in recs if "saved" in r]
assert saved == ["'"$WORK"'/g/checkpoint-6", "'"$WORK"'/g/checkpoint-12"], saved
assert any(r.get("eval") for r in recs)
done = recs[-1]
assert done["done"] and done["step"] == 12 and not done["interrupted"] and math.isfinite(done["eval_loss"]), done
' || fail "unexpected --json records: $OUT"
  [ "$(cat "$WORK/g/latest")" = checkpoint-12 ] || fail "latest: $(cat "$WORK/g/latest")"
  local c=$WORK/g/checkpoint-12 f
  for f in config.json model.safetensors optimizer.safetensors trainer_state.json tokenizer.json generation_config.json; do
    [ -f "$c/$f" ] || fail "checkpoint-12 lacks $f"
  done
  # transformers loads it (no missing or unexpected keys) and its logits are tk's
  expect_rc 0 "$TK" model logits "$c" --ids 5,17,42,9,100 --json
  echo "$OUT" >"$WORK/tk_logits.json"
  "$PY" - "$c" "$WORK/tk_logits.json" <<'EOF' || fail "transformers disagrees with tk on the trained checkpoint"
import json, sys, torch
from transformers import GPT2LMHeadModel
m, info = GPT2LMHeadModel.from_pretrained(sys.argv[1], output_loading_info=True)
assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
ref = m.eval()(torch.tensor([[5, 17, 42, 9, 100]])).logits[0]
got = torch.tensor(json.load(open(sys.argv[2]))["logits"])
err = (got - ref).abs().max().item()
assert err <= 1e-4 * (1 + ref.abs().max().item()), err
print("    transformers loads checkpoint-12; max |tk - transformers| logit %.2g" % err)
EOF
  # and tk generates with it
  expect_rc 0 "$TK" generate "$c" --prompt "the quick" --max-new-tokens 4
}

# 12 steps straight, and 12 steps interrupted after 5 and resumed: the same bytes.
t_resume_is_bit_identical() {
  need_venv || return
  expect_rc 0 "$TK" train "$CK/llama" "${TRAIN[@]}" --out "$WORK/a" --steps 12 --quiet
  expect_rc 0 "$TK" train "$CK/llama" "${TRAIN[@]}" --out "$WORK/b" --steps 5 --schedule constant --quiet
  # a run with another schedule is refused by --steps below its own only for cosine; make b's like a's:
  rm -rf "$WORK/b"
  expect_rc 0 "$TK" train "$CK/llama" "${TRAIN[@]}" --out "$WORK/b" --steps 12 --save-every 5 --save-total-limit 0 --quiet
  rm -rf "$WORK/b/checkpoint-10" "$WORK/b/checkpoint-12"
  echo checkpoint-5 >"$WORK/b/latest"
  expect_rc 0 "$TK" train --out "$WORK/b" --resume --quiet
  cmp -s "$WORK/a/checkpoint-12/model.safetensors" "$WORK/b/checkpoint-12/model.safetensors" ||
    fail "resumed parameters differ from the uninterrupted run's"
  cmp -s "$WORK/a/checkpoint-12/optimizer.safetensors" "$WORK/b/checkpoint-12/optimizer.safetensors" ||
    fail "resumed optimiser state differs"
  # an existing run is never overwritten; resuming with other data is refused
  expect_rc 2 "$TK" train "$CK/llama" "${TRAIN[@]}" --out "$WORK/a" --steps 3
  expect_out "already holds a training run"
  echo "other text entirely, long enough to make a few sequences of thirty two tokens each" >"$WORK/other.txt"
  expect_rc 2 "$TK" train --out "$WORK/b" --resume --data "$WORK/other.txt"
  expect_out "the data files differ"
}

# kill -9 at random moments: `latest` always names a whole checkpoint, and --resume finishes the run.
t_kill9_never_loses_the_checkpoint() {
  need_venv || return
  local o=$WORK/k round pid c
  for round in 1 2; do
    if [ -f "$o/latest" ]; then
      "$TK" train --out "$o" --resume --quiet >/dev/null 2>&1 &
    else
      "$TK" train "$CK/gpt2" "${TRAIN[@]}" --out "$o" --steps 40 --save-every 1 --quiet >/dev/null 2>&1 &
    fi
    pid=$!
    sleep "$(python3 -c "import random; print(round(random.uniform(0.5, 2.5) + ($round - 1) * 1.5, 2))")"
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    [ -f "$o/latest" ] || { fail "round $round: no latest after kill -9"; return; }
    c=$o/$(cat "$o/latest")
    [ -f "$c/trainer_state.json" ] && [ -f "$c/model.safetensors" ] && [ -f "$c/optimizer.safetensors" ] ||
      { fail "round $round: latest names $c, which is not whole"; return; }
    expect_rc 0 "$TK" model info "$c" --json
    echo "    round $round: killed at $(cat "$o/latest")"
  done
  expect_rc 0 "$TK" train --out "$o" --resume --quiet
  [ "$(cat "$o/latest")" = checkpoint-40 ] || fail "the resumed run ended at $(cat "$o/latest")"
  # no temporary directory is left behind once a run ends normally
  ls -a "$o" | grep -q '^\.tmp-' && echo "    (temporaries of the killed runs remain: $(ls -a "$o" | grep -c '^\.tmp-'))"
  true
}

# SIGINT (Ctrl-C): the step finishes, a checkpoint is saved, exit 130, and --resume continues.
t_ctrl_c_saves_and_exits_130() {
  need_venv || return
  local o=$WORK/c pid rc
  "$TK" train "$CK/gpt2" "${TRAIN[@]}" --out "$o" --steps 100000 --quiet >/dev/null 2>"$WORK/c.err" &
  pid=$!
  sleep 2
  kill -INT "$pid"
  wait "$pid"
  rc=$?
  [ "$rc" = 130 ] || fail "exit $rc after SIGINT, want 130: $(cat "$WORK/c.err")"
  grep -q "interrupted at step" "$WORK/c.err" || fail "no 'interrupted' message: $(cat "$WORK/c.err")"
  grep -q -- "--resume continues it" "$WORK/c.err" || fail "no resume hint"
  [ -f "$o/latest" ] && [ -f "$o/$(cat "$o/latest")/trainer_state.json" ] || fail "no checkpoint after SIGINT"
}

t_bad_data_is_refused_clearly() {
  need_venv || return
  : >"$WORK/empty.txt"
  expect_rc 2 "$TK" train "$CK/gpt2" --data "$WORK/empty.txt" --out "$WORK/e1"
  expect_out "'$WORK/empty.txt' is empty"
  printf 'text\0\1\2binary\377' >"$WORK/bin.dat"
  expect_rc 2 "$TK" train "$CK/gpt2" --data "$WORK/bin.dat" --out "$WORK/e2"
  expect_out "is not UTF-8 text (byte 4"
  expect_out "HINT:"
  echo "too short" >"$WORK/short.txt"
  expect_rc 2 "$TK" train "$CK/gpt2" --data "$WORK/short.txt" --out "$WORK/e3" --seq-len 64
  expect_out "less than one sequence of --seq-len 64"
  expect_rc 3 "$TK" train "$CK/gpt2" --data "$WORK/nope.txt" --out "$WORK/e4"
  expect_out "nope.txt"
  expect_rc 3 "$TK" train "$CK/gpt2-notok" --data "$DATA" --out "$WORK/e5"
  expect_out "tokenizer.json"
  # none of them left a run behind
  [ ! -e "$WORK/e1/latest" ] && [ ! -e "$WORK/e3/latest" ] || fail "a refused run wrote a checkpoint"
}

t_unwritable_out_and_full_disk_keep_the_last_checkpoint() {
  need_venv || return
  echo x >"$WORK/afile"
  expect_rc 6 "$TK" train "$CK/gpt2" "${TRAIN[@]}" --out "$WORK/afile/run" --steps 2
  expect_out "cannot create it"
  # a full disk: files may not grow past 64 KiB (SIGXFSZ ignored: write fails with EFBIG)
  local o=$WORK/f
  expect_rc 0 "$TK" train "$CK/gpt2" "${TRAIN[@]}" --out "$o" --steps 3 --quiet
  local before; before=$(cd "$o/checkpoint-3" && sha256sum model.safetensors optimizer.safetensors trainer_state.json)
  OUT=$( (trap '' XFSZ; ulimit -f 64; "$TK" train --out "$o" --resume --steps 6 --quiet) 2>&1); local rc=$?
  [ "$rc" = 6 ] || fail "exit $rc on a full disk, want 6: $OUT"
  expect_out "File too large"
  expect_out "the previous one is kept"
  [ "$(cat "$o/latest")" = checkpoint-3 ] || fail "latest moved to $(cat "$o/latest")"
  [ "$(cd "$o/checkpoint-3" && sha256sum model.safetensors optimizer.safetensors trainer_state.json)" = "$before" ] ||
    fail "the previous checkpoint changed"
  [ -z "$(ls -a "$o" | grep '^\.tmp-')" ] || fail "the partial checkpoint was left: $(ls -a "$o")"
  [ ! -e "$o/checkpoint-6" ] || fail "a partial checkpoint-6 exists"
}

t_nan_stops_and_names_the_tensor() {
  need_venv || return
  expect_rc 1 "$TK" train "$CK/gpt2-nan" "${TRAIN[@]}" --out "$WORK/n1" --steps 3
  expect_out "step 1: the loss is nan; parameter 'transformer.h.0.attn.c_proj.weight' holds NaN or inf"
  expect_out "no checkpoint was saved"
  expect_rc 1 "$TK" train "$CK/gpt2-overflow" "${TRAIN[@]}" --out "$WORK/n2" --steps 3
  expect_out "layer 1: the c_fc output is the first tensor that holds NaN or inf"
  expect_rc 1 "$TK" --json train "$CK/gpt2-nan" "${TRAIN[@]}" --out "$WORK/n3" --steps 3
  expect_out '"error"'
}

t_out_of_memory_names_the_knobs() {
  need_venv || return
  OUT=$( (ulimit -v 1500000; "$TK" train "$CK/gpt2" --data "$DATA" --seq-len 32 --batch-size 40000 --out "$WORK/m" --steps 1 --quiet) 2>&1); local rc=$?
  [ "$rc" = 1 ] || fail "exit $rc out of memory, want 1: $OUT"
  expect_out "out of memory"
  expect_out "--batch-size, --seq-len and --checkpointing"
}

t_bert_mlm_trains_and_loads_in_transformers() {
  need_venv || return
  expect_rc 0 "$TK" train "$CK/bert-mlm" "${TRAIN[@]}" --out "$WORK/bm" --steps 8 --lr 1e-3 --checkpointing --quiet
  "$PY" - "$WORK/bm/checkpoint-8" <<'EOF' || fail "transformers cannot use the trained BertForMaskedLM"
import sys, torch
from transformers import BertForMaskedLM
m, info = BertForMaskedLM.from_pretrained(sys.argv[1], output_loading_info=True)
assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
out = m.eval()(torch.tensor([[2, 10, 4, 12, 3]]), labels=torch.tensor([[-100, -100, 11, -100, -100]]))
assert torch.isfinite(out.loss), out.loss
EOF
}

run_tests
