#!/usr/bin/env python3
"""moe_oracle.py — transformers' own MoE blocks on random inputs, for test_ops_moe's `moe` op check.

Usage: moe_oracle.py SEED
Prints cases, each:
  case LABEL DTYPE T H E K I IS NORM ROUND
  t NAME N v0 v1 ...           (input, router_weight, gate_up [E, 2I, H], down [E, H, I],
                                shared_gate_up [2Is, H], shared_down [H, Is], shared_gate [1, H] when IS > 0,
                                out: the block's output, ids: the router's top-k indices [T, K],
                                weights: its top-k weights [T, K] in f32)
  end
Values are printed with repr (exact for f32; bf16 cases hold bf16 values). The blocks are
MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock (shared expert with its sigmoid gate) and
Qwen3MoeSparseMoeBlock (norm_topk_prob on and off), with their weights drawn at random; the "ties"
cases draw the router's inputs and weights from a few exact levels so that many router logits are
equal and torch.topk's tie order decides which experts run (E = 4 .. 128 covers both of its CPU
algorithms: nth_element, and partial_sort when k * 64 <= E).
"""
import sys

import torch
from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock


def emit(name, t):
    v = t.detach().to(torch.float32).reshape(-1).tolist()
    print("t", name, len(v), " ".join(repr(x) for x in v))


def block(kind, H, E, K, I, Is, norm):
    if kind == "mixtral":
        cfg = MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K)
        return MixtralSparseMoeBlock(cfg)
    if kind == "qwen2_moe":
        cfg = Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                             shared_expert_intermediate_size=Is, norm_topk_prob=norm)
        return Qwen2MoeSparseMoeBlock(cfg)
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                         norm_topk_prob=norm)
    return Qwen3MoeSparseMoeBlock(cfg)


def run(label, kind, dtype, T, H, E, K, I, Is, norm, ties, g):
    m = block(kind, H, E, K, I, Is, norm)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
        x = torch.rand(T, H, generator=g) * 2 - 1
        router = m.gate.weight
        if ties:  # few exact levels: equal logits, so torch.topk's tie order matters
            x = torch.randint(0, 2, (T, H), generator=g).float()
            router.copy_(torch.randint(0, 3, router.shape, generator=g).float() * 0.25)
        else:
            router.mul_(4.0)
    m = m.to(dtype).eval()
    x = x.to(dtype)
    with torch.no_grad():
        _, w, ids = m.gate(x)
        out = m(x.unsqueeze(0)).squeeze(0)
    rnd = 0 if kind == "mixtral" else 1
    nrm = 1 if kind == "mixtral" else int(norm)
    print("case", label, "bf16" if dtype == torch.bfloat16 else "f32", T, H, E, K, I, Is, nrm, rnd)
    emit("input", x)
    emit("router_weight", m.gate.weight)
    emit("gate_up", m.experts.gate_up_proj)
    emit("down", m.experts.down_proj)
    if Is:
        sh = m.shared_expert
        emit("shared_gate_up", torch.cat([sh.gate_proj.weight, sh.up_proj.weight], 0))
        emit("shared_down", sh.down_proj.weight)
        emit("shared_gate", m.shared_expert_gate.weight)
    emit("out", out)
    emit("ids", ids)
    emit("weights", w.float())
    print("end")


def main():
    g = torch.Generator().manual_seed(int(sys.argv[1]))
    torch.manual_seed(int(sys.argv[1]))
    f32, bf16 = torch.float32, torch.bfloat16
    run("mixtral", "mixtral", f32, 11, 32, 8, 2, 24, 0, True, False, g)
    run("mixtral-bf16", "mixtral", bf16, 11, 32, 8, 2, 24, 0, True, False, g)
    run("qwen2_moe", "qwen2_moe", f32, 9, 32, 6, 2, 16, 40, False, False, g)
    run("qwen2_moe-bf16", "qwen2_moe", bf16, 9, 32, 6, 2, 16, 40, False, False, g)
    run("qwen3_moe-norm", "qwen3_moe", f32, 7, 24, 8, 3, 16, 0, True, False, g)
    run("qwen3_moe-bf16", "qwen3_moe", bf16, 7, 24, 8, 3, 16, 0, False, False, g)
    run("ties-e4", "qwen3_moe", f32, 16, 8, 4, 2, 8, 0, True, True, g)
    run("ties-e60", "qwen3_moe", f32, 16, 8, 60, 4, 8, 0, False, True, g)
    run("ties-e64-k1", "mixtral", f32, 16, 8, 64, 1, 8, 0, True, True, g)
    run("ties-e128-k2", "qwen3_moe", f32, 16, 8, 128, 2, 8, 0, True, True, g)
    run("ties-e128-k8", "qwen3_moe", f32, 16, 8, 128, 8, 8, 0, True, True, g)
    run("ties-e20-k7", "qwen2_moe", bf16, 16, 8, 20, 7, 8, 12, False, True, g)


if __name__ == "__main__":
    main()
