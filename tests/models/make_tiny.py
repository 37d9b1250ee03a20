#!/usr/bin/env python3
"""Writes tiny random-weight Hugging Face checkpoints for tk's model tests, with transformers'
save_pretrained (so the files are exactly what the Hub holds for real models), into OUT/<name>/.

    make_tiny.py OUT

Each model is small enough to run in milliseconds but keeps the features under test: GQA and Llama-3 rope
scaling, YaRN and dynamic NTK rope, Mistral's sliding window (shorter than the test prompt), Qwen2's q/k/v
biases with tied embeddings, a bf16 Llama with a transformers-v4 style config (rope_scaling + rope_theta +
torch_dtype), Qwen2 with a sliding window on its upper layers, GPT-2 (sharded into several files, and again
unprefixed in one file as the original gpt2 upload is), BERT with its pooler; and the Llama decoder's
variations: Qwen3 (q/k norms per head, tied), OLMo2 (post-norms, q/k norms over the projections), Granite
(its four multipliers), SmolLM3 (NoPE layers, head_dim 16), Gemma ((1 + w) norms, sqrt(hidden) embedding
scale, GeGLU), Gemma 2 (pre- and post-norms, a sliding layer and a global one, query_pre_attn_scalar, an
attention softcap and a final logit softcap low enough to bite), Gemma 3 text (q/k norms, two RoPEs: linear-
scaled global, local), Phi-3 (fused qkv_proj and gate_up_proj, partial rotary, a sliding window on every
layer), Phi-3 with LongRoPE (short and long factors, the attention factor); and the mixtures of experts: Mixtral (4 experts, top 2, a sliding window), Qwen2-MoE (a shared
expert with its gate, a dense layer from mlp_only_layers, norm_topk_prob off), Qwen3-MoE (8 experts, top 3,
norm_topk_prob on, decoder_sparse_step 2), and Qwen3-MoE again with transformers 5's fused expert tensors
(mlp.experts.gate_up_proj / down_proj, as the model holds them in memory) instead of the per-expert ones
save_pretrained writes; and block diffusion: DiffusionGemma (a Gemma-4-style encoder/decoder over one weight set:
sliding layers of head_dim 16 with a window of 4, full layers of global head size 32 with one kv head whose
value is the key, proportional RoPE, a dense MLP beside 4 experts with top 2, canvas_length 6), and again
with layer_scalar 0.5, 0.75, 1.25, 1.5 (the scalars tk folds into the weights).
Seeds are fixed: the same script writes the same weights.
"""
import json
import os
import shutil
import sys

import torch
from transformers import (BertConfig, BertModel, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM,
                          Gemma3TextConfig, GemmaConfig, GemmaForCausalLM,
                          GPT2Config, GPT2LMHeadModel, GraniteConfig, GraniteForCausalLM, Phi3Config,
                          Phi3ForCausalLM,
                          LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Olmo2Config,
                          Olmo2ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          SmolLM3Config, SmolLM3ForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig,
                          Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM,
                          DiffusionGemmaForBlockDiffusion)

from bd_oracle import diffusion_gemma_cfg  # the block diffusion test's model (tests/models/)

OUT = sys.argv[1]
V = 256  # vocabulary of every tiny model


def save(name, model, seed, **kw):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    # Larger random weights than the default init, so logits differ clearly between tokens.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g).to(p.dtype)
            is_norm = p.dim() == 1 and n.endswith("weight") and ("norm" in n.lower() or ".ln_" in n)
            p.copy_(1.0 + 0.1 * r if is_norm else 0.2 * r)
    model.save_pretrained(d, **kw)
    return d


def llama_cfg(**kw):
    base = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
    base.update(kw)
    return base


def main():
    os.makedirs(OUT, exist_ok=True)
    save("llama", LlamaForCausalLM(LlamaConfig(**llama_cfg(
        rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16}))), 1)
    save("llama-yarn", LlamaForCausalLM(LlamaConfig(**llama_cfg(
        max_position_embeddings=128, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}))), 2)
    save("llama-dynamic", LlamaForCausalLM(LlamaConfig(**llama_cfg(
        max_position_embeddings=8, rope_scaling={"rope_type": "dynamic", "factor": 2.0}))), 3)
    save("mistral", MistralForCausalLM(MistralConfig(**llama_cfg(sliding_window=4))), 4)
    save("qwen2", Qwen2ForCausalLM(Qwen2Config(**llama_cfg(tie_word_embeddings=True))), 5)
    # bf16 weights on disk and a transformers-v4 config: rope_scaling (linear) + rope_theta, torch_dtype.
    m = LlamaForCausalLM(LlamaConfig(**llama_cfg(rope_scaling={"rope_type": "linear", "factor": 2.0})))
    d = save("llama-bf16-v4", m.to(torch.bfloat16), 6)
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = {"type": rp["rope_type"], "factor": rp["factor"]}
    c["torch_dtype"] = c.pop("dtype")
    json.dump(c, open(p, "w"), indent=2)
    save("gpt2", GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                            bos_token_id=0, eos_token_id=0)), 7, max_shard_size="100KB")
    # The original gpt2 upload's layout: no "transformer." prefix, one file.
    from safetensors.torch import load_file, save_file
    d = os.path.join(OUT, "gpt2-unprefixed")
    os.makedirs(d, exist_ok=True)
    src = os.path.join(OUT, "gpt2")
    tensors = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            tensors.update({k.removeprefix("transformer."): v for k, v in load_file(os.path.join(src, f)).items()})
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(src, "config.json"), d)
    # Qwen2 with its sliding window on the layers from max_window_layers on (here: layer 1 of 2).
    save("qwen2-sliding", Qwen2ForCausalLM(Qwen2Config(**llama_cfg(use_sliding_window=True, sliding_window=4,
                                                                   max_window_layers=1))), 9)
    save("qwen3", Qwen3ForCausalLM(Qwen3Config(**llama_cfg(head_dim=16, tie_word_embeddings=True))), 10)
    save("olmo2", Olmo2ForCausalLM(Olmo2Config(**llama_cfg())), 11)
    save("granite", GraniteForCausalLM(GraniteConfig(**llama_cfg(
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625, logits_scaling=8.0))), 12)
    save("smollm3", SmolLM3ForCausalLM(SmolLM3Config(**llama_cfg(num_hidden_layers=4, head_dim=16,
                                                                   no_rope_layer_interval=2, pad_token_id=None,
                                                                   bos_token_id=1, eos_token_id=2))), 13)
    save("gemma", GemmaForCausalLM(GemmaConfig(**llama_cfg(head_dim=16))), 14)
    save("gemma2", Gemma2ForCausalLM(Gemma2Config(**llama_cfg(
        head_dim=16, sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0))), 15)
    save("gemma3", Gemma3ForCausalLM(Gemma3TextConfig(**llama_cfg(
        num_hidden_layers=4, head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}))), 16)
    save("phi3", Phi3ForCausalLM(Phi3Config(**llama_cfg(partial_rotary_factor=0.5, sliding_window=5,
                                                         pad_token_id=None, bos_token_id=1, eos_token_id=2))), 17)
    # LongRoPE (Phi-3.5, Phi-4-mini): 6 factors for 12 rotary dims (partial_rotary_factor 0.75 of 16);
    # original_max_position_embeddings 10 of 256, so a 7-token sequence takes short_factor, 12 and 20
    # take long_factor (and generation crosses from one to the other), and the attention factor
    # sqrt(1 + ln(25.6) / ln(10)) scales cos and sin.
    save("phi3-longrope", Phi3ForCausalLM(Phi3Config(**llama_cfg(
        head_dim=16, partial_rotary_factor=0.75, pad_token_id=None, bos_token_id=1, eos_token_id=2,
        original_max_position_embeddings=10,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.02, 1.1, 1.25, 1.5, 1.9],
                      "long_factor": [1.0, 1.3, 2.1, 3.7, 5.2, 9.0]}))), 23)
    save("mixtral", MixtralForCausalLM(MixtralConfig(**llama_cfg(
        intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, sliding_window=5))), 18)
    # (seed 22: with 19, two experts' router logits at one position are equal in bf16, and which of them
    # runs depends on the last bit of the hidden state: tk's bf16 and transformers' bf16 then differ by a
    # whole expert; that is routing, not numerics, and the bf16 test measures numerics)
    save("qwen2_moe", Qwen2MoeForCausalLM(Qwen2MoeConfig(**llama_cfg(
        num_hidden_layers=3, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=40, mlp_only_layers=[1], norm_topk_prob=False))), 22)
    d = save("qwen3_moe", Qwen3MoeForCausalLM(Qwen3MoeConfig(**llama_cfg(
        num_hidden_layers=4, head_dim=16, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
        norm_topk_prob=True, decoder_sparse_step=2))), 20)
    # transformers 5's own in-memory layout: the experts fused into [E, 2I, H] and [E, H, I] tensors
    from safetensors.torch import save_file as save_st
    m = Qwen3MoeForCausalLM.from_pretrained(d)
    f = os.path.join(OUT, "qwen3_moe-fused")
    os.makedirs(f, exist_ok=True)
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd), "no fused experts in the state dict"
    save_st(sd, os.path.join(f, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(d, "config.json"), f)
    for name, scalars in (("diffusion_gemma", None), ("diffusion_gemma-scalars", [0.5, 0.75, 1.25, 1.5])):
        m = DiffusionGemmaForBlockDiffusion(diffusion_gemma_cfg())
        if scalars:  # a buffer, not a parameter: save() leaves it at 1
            for n, b in m.named_buffers():
                if n.endswith("layer_scalar"):
                    b.fill_(scalars[int(n.split(".layers.")[1].split(".")[0])])
        save(name, m, 24)
    save("bert", BertModel(BertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, max_position_embeddings=64)), 8)


if __name__ == "__main__":
    main()
