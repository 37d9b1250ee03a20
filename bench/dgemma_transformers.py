#!/usr/bin/env python3
"""transformers' own DiffusionGemma generate() on bench/diffusion_block.sh's checkpoint, timed the way tk's
--json stats time tk (the generation loop only; the model is loaded first): prints one JSON line
{"tokens_per_s", "ms", "steps", "blocks", "threads"}. Its noise is torch's (torch.manual_seed(1)), so the
tokens differ from tk's; the step count is what makes the two comparable, and the bench prints both.

    dgemma_transformers.py DIR IDS GEN_LENGTH STEPS [DEVICE]   (DEVICE: cpu, the default, or cuda)
"""
import json
import sys
import time

import torch
import transformers.models.diffusion_gemma.generation_diffusion_gemma as gen
from transformers import DiffusionGemmaForBlockDiffusion


def main():
    d, ids, G, S = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
    dev = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    m = DiffusionGemmaForBlockDiffusion.from_pretrained(d, dtype=torch.float32).to(dev).eval()
    steps = [0]
    accept = gen.EntropyBoundSampler.accept_canvas

    def counted(self, *a, **k):
        steps[0] += 1
        return accept(self, *a, **k)

    gen.EntropyBoundSampler.accept_canvas = counted
    torch.manual_seed(1)
    x = torch.tensor([ids], device=dev)
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = m.generate(x, max_new_tokens=G, max_denoising_steps=S)
        sync()
        dt = time.perf_counter() - t0
    n = out.sequences.shape[1] - len(ids)
    print(json.dumps({"tokens_per_s": n / dt, "ms": dt * 1e3, "steps": steps[0],
                      "blocks": -(-n // m.config.canvas_length), "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
