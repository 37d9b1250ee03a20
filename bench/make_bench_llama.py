#!/usr/bin/env python3
"""A Llama-shaped random checkpoint for bench/models_cpu.sh: hidden 512, 8 layers, 8 heads (4 kv),
intermediate 1408, vocab 32000, f32 (~57M parameters). make_bench_llama.py OUT"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048)
                 ).save_pretrained(sys.argv[1])
