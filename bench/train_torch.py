#!/usr/bin/env python3
"""PyTorch's side of bench/train_cpu.sh: the training step tk's bench/train_step.c times, in eager
PyTorch on the CPU: model(ids, labels=ids).loss.backward(); clip_grad_norm_(1.0); AdamW step (lr 1e-4,
wd 0.01), on the same checkpoint and batch shape, f32, dropout 0 (eval mode: no dropout; gradients are
still computed). One warm-up step, then STEPS timed. Prints one JSON line.

    train_torch.py DIR SEQ BATCH STEPS THREADS"""
import json
import resource
import sys
import time

import torch
import transformers

d, seq, batch, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
cfg = transformers.AutoConfig.from_pretrained(d)
cls = getattr(transformers, cfg.architectures[0])
model = cls.from_pretrained(d, dtype=torch.float32).eval()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
g = torch.Generator().manual_seed(0)


def step():
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    opt.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


step()
t0 = time.perf_counter()
for _ in range(steps):
    step()
dt = (time.perf_counter() - t0) / steps
print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "threads": threads, "step_s": dt,
                  "tokens_per_s": batch * seq / dt,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
