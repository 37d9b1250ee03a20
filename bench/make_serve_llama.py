#!/usr/bin/env python3
"""A Llama-shaped random checkpoint with a tokenizer, for bench/serve_model.sh: the layers of
bench/make_bench_llama.py (hidden 512, 8 layers, 8 heads / 4 kv, intermediate 1408, f32) over the small
BPE tokenizer tests/models/gen_oracle.py trains (vocab 420), so the server has text to decode and the
layers dominate the time. make_serve_llama.py OUT"""
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "models"))
from gen_oracle import make_tokenizer  # noqa: E402

out = sys.argv[1]
torch.manual_seed(0)
tok, bos, eos = make_tokenizer("llama")
LlamaForCausalLM(LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=512, intermediate_size=1408,
                             num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                             max_position_embeddings=2048, bos_token_id=bos, eos_token_id=eos,
                             initializer_range=0.05)).save_pretrained(out)
tok.save(os.path.join(out, "tokenizer.json"))
