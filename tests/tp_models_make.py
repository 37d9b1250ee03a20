#!/usr/bin/env python3
"""Writes the tiny checkpoints tests/cli/tp_models.sh splits over MPI ranks, with transformers'
save_pretrained, and transformers' own logits for one prompt beside each (OUT/<name>/ref.json: "ids",
"logits"), the outside oracle the split's logits are held to.

    tp_models_make.py OUT [NAME,NAME,...]    (only those; default all: tests/gpu_tp.py makes a few)

  llama       LlamaForCausalLM, GQA (12 heads, 6 kv heads: splits over 2, 3 and 6 ranks), head_dim 16
              apart from hidden / heads, an MLP width (37) and a vocabulary (101) that no rank count
              divides (torch.chunk's uneven parts), attention and MLP biases, an untied LM head
  qwen2       Qwen2ForCausalLM: q/k/v biases, tied embeddings, 4 heads and 2 kv heads (3 ranks do not
              divide them: the error case)
  llama-edge  3 heads, 3 kv heads, MLP width 4 and vocabulary 4: at 3 ranks torch.chunk gives the last
              rank no MLP features and no vocabulary rows at all
  gpt2        GPT2LMHeadModel (Conv1D weights, fused c_attn, tied head): 6 heads, MLP width 37, vocabulary
              101; transformers has no plan for it, the test passes one
  qwen3, gemma, gemma2, gemma3, granite, smollm3
              the Llama variations that split as Llama does (12 heads, 6 kv heads, head_dim 8, MLP width
              37, vocabulary 101): Qwen3's q/k norms per head (tied); Gemma's (1 + w) norms, sqrt(hidden)
              embedding scale and GeGLU (tied: the head is the unscaled table); Gemma 2's post-norms,
              sliding layer, query_pre_attn_scalar and both softcaps; Gemma 3's q/k norms and two RoPEs;
              Granite's four multipliers (folded into the split weights at load); SmolLM3's NoPE layers.
              Eager attention in transformers (sdpa would drop Gemma 2's attention softcap)
  olmo2       Olmo2ForCausalLM (12 heads, 6 kv heads): its q/k norms span the whole projection, split
              with q_proj's and k_proj's heads by tk's plan (their sums of squares all-reduced)
  phi3, phi3-gqa
              Phi-3 (fused qkv_proj and gate_up_proj, LongRoPE, partial rotary) with 12 kv heads (three
              equal q|k|v blocks) and with 6 (grouped: q's 12 heads, then k's and v's 6), split by
              tk's plan
  bert        BertForMaskedLM: an architecture tensor parallelism does not split (the refusal case)
  mixtral, qwen2_moe, qwen3_moe, qwen3_moe-fused
              mixtures of experts on the same attention: Mixtral (4 experts, top 2, per-expert w1/w3/w2
              tensors, expert width 38: uneven over 3 ranks), Qwen2-MoE (a shared expert with its gate, a
              dense layer from mlp_only_layers, norm_topk_prob off), Qwen3-MoE (6 experts, top 3, q/k
              norms, decoder_sparse_step 2), and the same Qwen3-MoE as transformers 5's fused expert
              tensors ([E, 2I, H] and [E, H, I])
Seeds are fixed: the same script writes the same weights.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import (BertConfig, BertForMaskedLM, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GemmaConfig,
                          GemmaForCausalLM, GPT2Config, GPT2LMHeadModel, GraniteConfig, GraniteForCausalLM,
                          LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Olmo2Config,
                          Olmo2ForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM)

OUT = sys.argv[1]
ONLY = set(sys.argv[2].split(",")) if len(sys.argv) > 2 else None


def save(name, model, seed, ids):
    """Random weights (seeded), save_pretrained, and transformers' logits for ids: the checkpoint's dir."""
    d = os.path.join(OUT, name)
    if ONLY is not None and name not in ONLY:
        return d
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g).to(p.dtype)
            is_norm = p.dim() == 1 and "norm" in n
            p.copy_(1.0 + 0.1 * r if is_norm else 0.2 * r)
    model.save_pretrained(d)
    model.set_attn_implementation("eager")
    if hasattr(model, "set_experts_implementation") and model._can_set_experts_implementation():
        model.set_experts_implementation("eager")  # grouped_mm wants 16-byte strides; a loop over experts
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump({"ids": ids, "logits": logits.tolist()}, f)
    return d


def main():
    torch.manual_seed(0)
    base = dict(num_hidden_layers=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1,
                eos_token_id=2)
    save("llama", LlamaForCausalLM(LlamaConfig(
        vocab_size=101, hidden_size=48, intermediate_size=37, num_attention_heads=12, num_key_value_heads=6,
        head_dim=16, attention_bias=True, mlp_bias=True, tie_word_embeddings=False, **base)).eval(), 1,
        [1, 17, 54, 99, 3, 76, 42, 100, 8])
    save("qwen2", Qwen2ForCausalLM(Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=37, num_attention_heads=4, num_key_value_heads=2,
        tie_word_embeddings=True, **base)).eval(), 2, [1, 5, 96, 33, 70, 12, 64])
    save("llama-edge", LlamaForCausalLM(LlamaConfig(
        vocab_size=4, hidden_size=24, intermediate_size=4, num_attention_heads=3, num_key_value_heads=3,
        tie_word_embeddings=True, **base)).eval(), 3, [1, 3, 0, 2, 3])
    save("gpt2", GPT2LMHeadModel(GPT2Config(
        vocab_size=101, n_embd=48, n_layer=2, n_head=6, n_inner=37, n_positions=64, bos_token_id=1,
        eos_token_id=2)).eval(), 4, [1, 17, 54, 99, 3, 76, 42, 100, 8])
    ids = [1, 17, 54, 99, 3, 76, 42, 100, 8]
    fam = dict(vocab_size=101, hidden_size=48, intermediate_size=37, num_attention_heads=12, num_key_value_heads=6,
               head_dim=8, **base)
    save("qwen3", Qwen3ForCausalLM(Qwen3Config(**fam, tie_word_embeddings=True)).eval(), 5, ids)
    save("gemma", GemmaForCausalLM(GemmaConfig(**fam)).eval(), 6, ids)
    save("gemma2", Gemma2ForCausalLM(Gemma2Config(**fam, sliding_window=4, query_pre_attn_scalar=24,
                                                  attn_logit_softcapping=2.0, final_logit_softcapping=3.0)).eval(),
         7, ids)
    save("gemma3", Gemma3ForCausalLM(Gemma3TextConfig(
        **fam, sliding_window=4, query_pre_attn_scalar=24, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})).eval(), 8, ids)
    save("granite", GraniteForCausalLM(GraniteConfig(
        **fam, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625,
        logits_scaling=8.0, tie_word_embeddings=True)).eval(), 9, ids)
    save("olmo2", Olmo2ForCausalLM(Olmo2Config(**fam)).eval(), 11, ids)
    # Phi-3: fused qkv_proj (as many kv heads as heads: three equal blocks) and gate_up_proj; LongRoPE
    # (original 6 positions of 128: the ids take long_factor), partial rotary; and one with GQA
    phi = dict(**{k: v for k, v in fam.items() if k != "head_dim"}, partial_rotary_factor=0.5, pad_token_id=None,
               original_max_position_embeddings=6,
               rope_scaling={"type": "longrope", "short_factor": [1.1], "long_factor": [3.0]})  # head_dim 48 / 12
    save("phi3", Phi3ForCausalLM(Phi3Config(**{**phi, "num_key_value_heads": 12})).eval(), 15, ids)
    save("phi3-gqa", Phi3ForCausalLM(Phi3Config(**{**phi, "num_key_value_heads": 6})).eval(), 16, ids)
    save("mixtral", MixtralForCausalLM(MixtralConfig(
        **{**fam, "intermediate_size": 38}, num_local_experts=4, num_experts_per_tok=2)).eval(), 12, ids)
    save("qwen2_moe", Qwen2MoeForCausalLM(Qwen2MoeConfig(
        **{**fam, "num_hidden_layers": 3}, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=20,
        shared_expert_intermediate_size=24, mlp_only_layers=[1], norm_topk_prob=False)).eval(), 13, ids)
    d = save("qwen3_moe", Qwen3MoeForCausalLM(Qwen3MoeConfig(
        **{**fam, "num_hidden_layers": 4}, num_experts=6, num_experts_per_tok=3, moe_intermediate_size=16,
        norm_topk_prob=True, decoder_sparse_step=2)).eval(), 14, ids)
    # transformers 5's in-memory layout: the experts fused into [E, 2I, H] and [E, H, I] tensors
    if ONLY is None or {"qwen3_moe", "qwen3_moe-fused"} <= ONLY:
        m = Qwen3MoeForCausalLM.from_pretrained(d)
        f = os.path.join(OUT, "qwen3_moe-fused")
        os.makedirs(f, exist_ok=True)
        sd = {k: v.contiguous() for k, v in m.state_dict().items()}
        assert any(k.endswith("mlp.experts.gate_up_proj") for k in sd), "no fused experts in the state dict"
        save_file(sd, os.path.join(f, "model.safetensors"), metadata={"format": "pt"})
        for n in ("config.json", "ref.json"):
            shutil.copy(os.path.join(d, n), f)
    save("bert", BertForMaskedLM(BertConfig(
        vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=12, intermediate_size=37,
        max_position_embeddings=64)).eval(), 17, ids)
    save("smollm3", SmolLM3ForCausalLM(SmolLM3Config(
        **{**fam, "num_hidden_layers": 4}, no_rope_layer_interval=2, pad_token_id=None)).eval(), 10, ids)


if __name__ == "__main__":
    main()
