"""The Python reference loop of bench/diffusion_cpu.sh: LLaDA's published sampler
(tests/models/dllm_oracle.py's llada(), written from ML-GSAI/LLaDA generate.py) over transformers'
model made bidirectional, at temperature 0. Prints {"ids", "ms", "tokens_per_s"} for the sampling loop
(the model load is not timed). hf_diffusion.py DIR PROMPT_TOKENS GEN_LENGTH BLOCK_LENGTH STEPS MASK_ID"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models"))
import dllm_oracle  # noqa: E402

d, P, G, B, S, mask = sys.argv[1], *map(int, sys.argv[2:7])
m = dllm_oracle.load(d)
prompt = [1 + i % 31999 for i in range(P)]
a = {"gen_length": G, "block_length": B, "steps": S, "mask_token_id": mask}
with torch.inference_mode():
    t0 = time.perf_counter()
    ids, _ = dllm_oracle.llada(dllm_oracle.bidir(m), prompt, a, None)
    ms = (time.perf_counter() - t0) * 1000
print(json.dumps({"ids": ids, "ms": ms, "tokens_per_s": G / (ms / 1000), "threads": torch.get_num_threads()}))
