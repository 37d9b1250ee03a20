#!/usr/bin/env python3
"""top_p_oracle.py — the kept sets of transformers' TopPLogitsWarper on rows of logits with ties.

Usage: top_p_oracle.py SEED NCASES
Prints one line per case:  p v draws kept_count kept... | logit...
  p       top-p, printed with repr (an exact double)
  draws   how many independent draws a test needs so that every kept token is drawn at least once
          with probability 1 - e^-30 (30 / the smallest renormalised probability among the kept)
  kept    the token ids TopPLogitsWarper leaves above -inf, ascending, with torch.sort made stable
          (see hf_kept). The script checks that its own default sort keeps the same number of tokens
          of every logit value, and exactly the same ids where that sort is stable (v <= 16).
  logit   the row: multiples of 1/4 (exact in f32, f16 and bf16), so ties are exact in every dtype

Cases are drawn from SEED: small vocabularies with few distinct levels (many ties everywhere), and
large vocabularies with a tie group of tens of tokens where the nucleus ends. A case whose cumulative
mass lies within 1e-5 of p at the boundary is redrawn, so float rounding (fp32 softmax and cumsum
here, fp32 weights in tk) cannot move a token across it; every tie remains.
"""
import math
import random
import sys

import torch
from transformers import TopPLogitsWarper


def hf_kept(row, p, stable):
    """The ids TopPLogitsWarper keeps. torch.sort's default is not stable above 16 elements on the CPU
    (nor on GPUs), so which ids of a tie it drops is an accident of the sort; with stable=True its
    ascending sort drops the lowest ids of a tie first, the order tk implements."""
    x = torch.tensor([row], dtype=torch.float32)
    sort = torch.sort
    if stable:
        torch.sort = lambda *a, **k: sort(*a, stable=True, **k)
    try:
        out = TopPLogitsWarper(top_p=p)(None, x)
    finally:
        torch.sort = sort
    return [i for i in range(len(row)) if out[0, i].item() != float("-inf")]


def levels(row, kept):
    count = {}
    for i in kept:
        count[row[i]] = count.get(row[i], 0) + 1
    return count


def margin_ok(row, p):
    """The descending order that keeps the fewest tokens (ties: highest id first); the prefix masses
    on each side of the boundary must be 1e-5 away from p."""
    m = max(row)
    w = [math.exp(v - m) for v in row]
    s = sum(w)
    order = sorted(range(len(row)), key=lambda i: (row[i], i), reverse=True)
    before = 0.0
    for i in order:
        after = before + w[i] / s
        if abs(before - p) < 1e-5 or abs(after - p) < 1e-5:
            return False
        if after >= p:
            return True
        before = after
    return True


def draws_needed(row, kept):
    m = max(row)
    w = [math.exp(row[i] - m) for i in kept]
    return int(math.ceil(30 * sum(w) / min(w)))


def small_case(rng):
    v = rng.choice([10, 12, 16, 33, 64])
    levels = [rng.randint(-6, 6) / 4 for _ in range(rng.randint(2, 5))]
    return [rng.choice(levels) for _ in range(v)], round(rng.uniform(0.05, 0.98), 6)


def large_case(rng):
    v = rng.choice([2000, 4099])
    top, tie = rng.randint(1, 4), rng.randint(20, 60)
    row = [-8.0] * v
    ids = rng.sample(range(v), top + tie)
    for i in ids[:top]:
        row[i] = 3.0
    for i in ids[top:]:
        row[i] = 2.0
    m = 3.0
    tw = [math.exp(x - m) for x in row]
    s = sum(tw)
    a = top / s
    b = a + tie * math.exp(-1.0) / s
    return row, round(rng.uniform(a + 0.01 * (b - a), b - 0.01 * (b - a)), 6)


def main():
    rng = random.Random(int(sys.argv[1]))
    n = int(sys.argv[2])
    out = []
    while len(out) < n:
        row, p = (small_case if len(out) % 3 else large_case)(rng)
        if not margin_ok(row, p):
            continue
        kept = hf_kept(row, p, stable=True)
        plain = hf_kept(row, p, stable=False)
        if levels(row, kept) != levels(row, plain) or (len(row) <= 16 and kept != plain):
            sys.exit("top_p_oracle: TopPLogitsWarper keeps %s with a stable sort but %s with its own, for p %r "
                     "and row %r" % (kept, plain, p, row))
        d = draws_needed(row, kept)
        if d > 200000:
            continue
        out.append("%r %d %d %d %s | %s" % (p, len(row), d, len(kept), " ".join(map(str, kept)),
                                             " ".join(repr(x) for x in row)))
    print("\n".join(out))


if __name__ == "__main__":
    main()
