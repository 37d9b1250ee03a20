#!/usr/bin/env python3
"""A LLaDA-layout checkpoint for bench/serve_diffusion.sh: the random Llama of bench/make_bench_llama.py
(hidden 512, 8 layers, 8 heads (4 kv), intermediate 1408, vocab 32000, f32, ~57M parameters), its
tensors renamed to modeling_llada.py's names and its config written with LLaDA's keys, as
tests/models/dllm_oracle.py make does for its tiny one, and a WordPiece tokenizer whose every id is a
word ("[UNK]", "<s>", "</s>", "<|mdm_mask|>" (the mask token, 3), then "w4" ... "w31999"), so every
generated id decodes and answers can be compared as text.

    make_bench_llada_words.py LLAMA_DIR OUT      (LLAMA_DIR: written by make_bench_llama.py)
"""
import json
import os
import sys

from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

src, out = sys.argv[1], sys.argv[2]
lc = json.load(open(os.path.join(src, "config.json")))
sd = load_file(os.path.join(src, "model.safetensors"))
ren = {"model.embed_tokens.weight": "model.transformer.wte.weight", "model.norm.weight":
       "model.transformer.ln_f.weight", "lm_head.weight": "model.transformer.ff_out.weight"}
sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm", "self_attn.q_proj": "q_proj",
       "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
       "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "ff_out"}
t = {}
for k, v in sd.items():
    if k in ren:
        t[ren[k]] = v.contiguous()
        continue
    parts = k.split(".")  # model.layers.N.<module...>.weight
    t[f"model.transformer.blocks.{parts[2]}.{sub['.'.join(parts[3:-1])]}.{parts[-1]}"] = v.contiguous()
if "model.transformer.ff_out.weight" not in t:  # tied embeddings
    t["model.transformer.ff_out.weight"] = t["model.transformer.wte.weight"].clone()
os.makedirs(out, exist_ok=True)
save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
special = ["[UNK]", "<s>", "</s>", "<|mdm_mask|>"]
vocab = {w: i for i, w in enumerate(special + ["w%d" % i for i in range(len(special), lc["vocab_size"])])}
tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.decoder = decoders.WordPiece()
tok.add_special_tokens(special)
mask, eos = 3, 2
tok.save(os.path.join(out, "tokenizer.json"))
cfg = {
    "activation_type": "silu", "alibi": False, "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0,
    "block_type": "llama", "d_model": lc["hidden_size"], "embedding_size": lc["vocab_size"], "eos_token_id": eos,
    "include_bias": False, "include_qkv_bias": False, "layer_norm_type": "rms", "mask_token_id": mask,
    "max_sequence_length": 512, "mlp_hidden_size": lc["intermediate_size"], "model_type": "llada",
    "n_heads": lc["num_attention_heads"], "n_kv_heads": lc["num_key_value_heads"],
    "n_layers": lc["num_hidden_layers"], "pad_token_id": eos, "rms_norm_eps": lc["rms_norm_eps"], "rope": True,
    "rope_theta": lc.get("rope_theta", (lc.get("rope_parameters") or {}).get("rope_theta", 10000.0)), "scale_logits": False, "use_cache": False, "vocab_size": lc["vocab_size"],
    "weight_tying": False, "torch_dtype": "float32"}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
print(json.dumps({"dir": out, "vocab": lc["vocab_size"], "mask": mask}))
