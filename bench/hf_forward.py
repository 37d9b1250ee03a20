#!/usr/bin/env python3
"""transformers' CPU forward on a checkpoint, timed as bench/model_forward.c times tk's: the same ids
(0, 1, 2, ... modulo the vocabulary), one warm-up, then the mean of N forwards; f32, torch.no_grad.

    hf_forward.py DIR [tokens] [iters]
"""
import json
import sys
import time

import torch
import transformers

d = sys.argv[1]
T = int(sys.argv[2]) if len(sys.argv) > 2 else 128
N = int(sys.argv[3]) if len(sys.argv) > 3 else 5
cfg = json.load(open(d + "/config.json"))
cls = getattr(transformers, cfg["architectures"][0])
m = cls.from_pretrained(d, dtype=torch.float32).eval()
ids = torch.tensor([[i % cfg["vocab_size"] for i in range(T)]])
times = []
with torch.no_grad():
    for it in range(N + 1):
        t0 = time.perf_counter()
        m(ids)
        times.append(time.perf_counter() - t0)
mean = sum(times[1:]) / N
print(json.dumps({"tokens": T, "iters": N, "ms_per_forward": mean * 1e3, "tokens_per_s": T / mean,
                  "torch": torch.__version__, "threads": torch.get_num_threads()}))
