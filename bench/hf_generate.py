#!/usr/bin/env python3
"""transformers' greedy generate() on the CPU, timed as tk generate times itself: the same prompt ids
(1, 2, 3, ... modulo the vocabulary), f32, a streamer notes when each new token arrives; decode
tokens/s counts the tokens after the first (which the prefill gives) over the time from the first to
the last. One warm-up run first.

    hf_generate.py DIR [prompt_tokens] [new_tokens]
"""
import json
import sys
import time

import torch
import transformers

d = sys.argv[1]
P = int(sys.argv[2]) if len(sys.argv) > 2 else 32
N = int(sys.argv[3]) if len(sys.argv) > 3 else 64
cfg = json.load(open(d + "/config.json"))
m = getattr(transformers, cfg["architectures"][0]).from_pretrained(d, dtype=torch.float32).eval()
ids = torch.tensor([[1 + i % (cfg["vocab_size"] - 1) for i in range(P)]])


class Times:
    def __init__(self):
        self.t = []

    def put(self, value):
        self.t.append(time.perf_counter())

    def end(self):
        pass


with torch.no_grad():
    m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    s = Times()
    t0 = time.perf_counter()
    out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False, streamer=s)
new = out[0, P:].tolist()
# s.t[0] is the prompt, s.t[1] the first new token
first, last = s.t[1], s.t[-1]
print(json.dumps({"new_tokens": len(new), "prefill_ms": (first - t0) * 1e3,
                  "decode_tokens_per_s": (len(new) - 1) / (last - first), "ids": new,
                  "torch": torch.__version__, "threads": torch.get_num_threads()}))
