#!/usr/bin/env python3
"""Small random checkpoints of every causal family tk runs, one shape for all, for bench/families_cpu.sh:
hidden 512, 4 layers, 8 heads (4 kv) of 64, intermediate 1408, vocab 16000, f32, written with
transformers' save_pretrained (~28M parameters each; the MoE ones: Mixtral 4 experts of 704 and Qwen3-MoE 8
of 704, top 2, so the active width is the dense one's). Each family keeps its own features at their
defaults (Gemma 2's softcaps, Gemma 3's sliding pattern, Phi-3's fused projections, SmolLM3's NoPE
layers, Granite's multipliers).

    make_bench_families.py OUT [FAMILY ...]
"""
import os
import sys

import torch
import transformers as tf

BASE = dict(vocab_size=16000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, max_position_embeddings=2048)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 64}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                                                        "attention_multiplier": 0.0625, "logits_scaling": 8.0}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 64}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 64, "sliding_window": 64}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 64, "sliding_window": 64}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"intermediate_size": 704, "num_local_experts": 4,
                                                        "num_experts_per_tok": 2}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"head_dim": 64, "num_experts": 8,
                                                           "num_experts_per_tok": 2, "moe_intermediate_size": 704,
                                                           "norm_topk_prob": True}),
}


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or list(FAMILIES)
    for name in names:
        cfg_cls, model_cls, kw = FAMILIES[name]
        d = os.path.join(out, name)
        if os.path.exists(os.path.join(d, "config.json")):
            continue
        torch.manual_seed(0)
        cfg = getattr(tf, cfg_cls)(**dict(BASE, **kw))
        getattr(tf, model_cls)(cfg).save_pretrained(d)
        print(name, d)


if __name__ == "__main__":
    main()
