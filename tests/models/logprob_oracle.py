#!/usr/bin/env python3
"""logprob_oracle.py — transformers as the oracle for `tk generate --logprobs` (tests/cli/generate.sh
runs it; it never runs tk, it reads what tk printed).

  logprob_oracle.py < JOBS
      Each input line is "DIR MODE TOP TKJSON IDS[;IDS...] [key=value ...]": tk's --json answer (a file:
      one object, or an array of them for several prompts) to those prompts on the checkpoint in DIR,
      with --top-logprobs TOP, checked per prompt against transformers in float32 on the CPU:
        generate  model.generate(prompt, do_sample=False, output_logits=True, output_scores=True,
                  return_dict_in_generate=True, key=value ...) on the prompt alone: the same new ids,
                  and at each step torch.log_softmax(logits)[chosen id] and torch.topk(log_softmax, TOP);
        forward   (sampling: the samplers' random streams differ) one forward over the prompt followed by
                  tk's own tokens: torch.log_softmax of the raw logits at the positions that predict
                  them, and its topk.
      key=value (GenerationConfig fields) are generate's; forward reads temperature=T only to check that
      the raw logits' log_softmax and the tempered one's differ, so that a logprob taken after the
      temperature would fail. generate does the same with output_scores (the processed scores: a
      repetition penalty's) when they differ from the raw logits.
      Prints one line per prompt ("DIR prompt I: N tokens, max |tk - torch| X") and exits 1 on the first
      disagreement beyond ATOL (1e-4, f32) or a differing id.
"""
import json
import math
import sys

import torch

from gen_oracle import parse_value as value  # the job lines' key=value options, as gen_oracle reads them

ATOL = 1e-4


def load(d):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()


def close(a, b):
    """tk's value (None: JSON's null for NaN and inf) against torch's."""
    if a is None:
        return not math.isfinite(b)
    return abs(a - b) <= ATOL


def check_top(where, got, lp_row, top):
    """got: tk's [{id, logprob}] against torch.topk of one log_softmax row."""
    vals, ids = torch.topk(lp_row, top)
    if len(got) != top:
        raise AssertionError(f"{where}: {len(got)} top entries, want {top}")
    for q, g in enumerate(got):
        if not close(g["logprob"], float(vals[q])):
            raise AssertionError(f"{where}: top {q + 1} logprob {g['logprob']}, torch {float(vals[q])}")
        # ids agree unless torch's neighbours tie (then either order is right)
        tied = any(abs(float(vals[q]) - float(vals[r])) <= 1e-6 for r in (q - 1, q + 1) if 0 <= r < top)
        if g["id"] != int(ids[q]) and not tied:
            raise AssertionError(f"{where}: top {q + 1} id {g['id']}, torch {int(ids[q])}")
        if abs(g["logprob"] - float(lp_row[g["id"]])) > ATOL:
            raise AssertionError(f"{where}: top {q + 1} (id {g['id']}) logprob {g['logprob']}, torch "
                                 f"{float(lp_row[g['id']])}")


def rows_generate(model, prompt, kw, got_ids):
    """transformers' greedy generation: its new ids, raw log_softmax rows, and processed-score rows."""
    x = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, output_logits=True,
                             output_scores=True, return_dict_in_generate=True, **kw)
    ids = out.sequences[0, len(prompt):].tolist()
    if ids != got_ids:
        raise AssertionError(f"greedy ids differ: tk {got_ids}, transformers {ids}")
    raw = [torch.log_softmax(l[0].float(), -1) for l in out.logits]
    processed = [torch.log_softmax(s[0].float(), -1) for s in out.scores]
    return raw, processed


def rows_forward(model, prompt, got_ids, kw):
    """One forward over prompt + tk's tokens: the rows that predict each of tk's tokens, raw and tempered."""
    x = torch.tensor([prompt + got_ids])
    with torch.no_grad():
        logits = model(x).logits[0].float()
    pos = range(len(prompt) - 1, len(prompt) - 1 + len(got_ids))
    raw = [torch.log_softmax(logits[p], -1) for p in pos]
    t = float(kw.get("temperature", 1.0))
    tempered = [torch.log_softmax(logits[p] / t, -1) for p in pos]
    return raw, tempered


def check_prompt(where, model, mode, top, prompt, ans, kw):
    got_ids = ans["ids"]
    lps = ans["logprobs"]
    if len(lps) != len(got_ids) or [e["id"] for e in lps] != got_ids:
        raise AssertionError(f"{where}: logprobs' ids {[e['id'] for e in lps]} are not ids {got_ids}")
    if mode == "generate":
        raw, other = rows_generate(model, prompt, kw, got_ids)
    else:
        raw, other = rows_forward(model, prompt, got_ids, kw)
    worst, apart = 0.0, 0.0
    total = 0.0
    for i, (e, row) in enumerate(zip(lps, raw)):
        want = float(row[e["id"]])
        if not close(e["logprob"], want):
            raise AssertionError(f"{where}: token {i} (id {e['id']}): tk {e['logprob']}, torch {want}")
        worst = max(worst, abs(e["logprob"] - want))
        apart = max(apart, abs(float(other[i][e["id"]]) - want))
        total += want
        if top:
            check_top(f"{where}, token {i}", e["top"], row, top)
        elif e["top"]:
            raise AssertionError(f"{where}: token {i} has top entries without --top-logprobs")
    if ans["logprob_sum"] is None or abs(ans["logprob_sum"] - total) > ATOL * max(1, len(lps)):
        raise AssertionError(f"{where}: logprob_sum {ans['logprob_sum']}, torch {total}")
    # the discriminating check: with a temperature or a penalty, the values tk must not report (after
    # them) are far from the raw ones, so a tk that reported those would have failed above
    if kw.get("temperature", 1.0) != 1.0 or kw.get("repetition_penalty", 1.0) != 1.0:
        if apart < 100 * ATOL:
            raise AssertionError(f"{where}: the processed log-probabilities are within {apart:.2e} of the raw "
                                 "ones: this job cannot tell them apart")
    return worst, apart


def main():
    models = {}
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        d, mode, top, tkfile, prompts = f[0], f[1], int(f[2]), f[3], f[4]
        kw = {k: value(v) for k, v in (a.split("=", 1) for a in f[5:])}
        if d not in models:
            models[d] = load(d)
        answers = json.load(open(tkfile))
        answers = answers if isinstance(answers, list) else [answers]
        plist = [[int(x) for x in p.split(",")] for p in prompts.split(";")]
        assert len(answers) == len(plist), f"{len(answers)} answers for {len(plist)} prompts"
        for i, (p, ans) in enumerate(zip(plist, answers)):
            where = f"{d.rsplit('/', 1)[-1]} {mode} {' '.join(f[5:])} prompt {i}"
            worst, apart = check_prompt(where, models[d], mode, top, p, ans, kw)
            print(f"{where}: {len(ans['ids'])} tokens, max |tk - torch| {worst:.2e} (processed values "
                  f"{apart:.2e} away)", flush=True)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"MISMATCH: {e}", flush=True)
        sys.exit(1)
