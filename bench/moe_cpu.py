"""MoE layer throughput on the CPU: tk's `moe` op (the CPU reference, ops/moe.c: tokens grouped by
expert, OpenBLAS GEMMs) against transformers' eager Qwen3MoeSparseMoeBlock (its `experts` loop over the
hit experts, torch GEMMs), on the same weights and inputs, in f32. Prints Markdown table rows:
tokens, tk's tokens/s, transformers' tokens/s, the ratio, and the max |difference| of the outputs.

Shapes (a scaled-down Qwen3-30B-A3B layer, so its f32 weights fit a shared machine): hidden 1024,
32 experts of intermediate 512, top 4 renormalised. The median of 7 timed runs after 2 warm-ups.

usage: OPENBLAS_NUM_THREADS=N PYTHONPATH=python python bench/moe_cpu.py [threads=2]
"""
import os
import statistics
import sys
import tempfile
import time

import torch

os.environ.setdefault("TK_HOME", tempfile.mkdtemp())
import tk  # noqa: E402
from transformers import Qwen3MoeConfig  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

H, E, K, I = 1024, 32, 4, 512


def median_s(f, reps=7):
    for _ in range(2):
        f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                         norm_topk_prob=True)
    cfg._experts_implementation = "eager"
    m = Qwen3MoeSparseMoeBlock(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape) * 0.05)
    gu = m.experts.gate_up_proj.detach().contiguous()
    dn = m.experts.down_proj.detach().contiguous()
    rw = m.gate.weight.detach().contiguous()
    print("| tokens | tk moe (tokens/s) | transformers eager (tokens/s) | tk / transformers | max abs diff |")
    print("|---|---|---|---|---|")
    for T in (1, 16, 128, 512):
        x = torch.randn(T, H)
        out = torch.empty(T, H)

        def run_tk():
            tk.ops.moe(out, x, rw, gu, dn, K, 1)

        def run_hf():
            with torch.no_grad():
                return m(x[None])

        t_tk = median_s(run_tk)
        t_hf = median_s(run_hf)
        ref = run_hf()[0]
        run_tk()
        diff = float((out - ref).abs().max())
        print("| %d | %.0f | %.0f | %.2f | %.1e |" % (T, T / t_tk, T / t_hf, t_hf / t_tk, diff), flush=True)


if __name__ == "__main__":
    main()
