#!/usr/bin/env python3
"""The random checkpoints bench/train_cpu.sh trains: a Llama (hidden 512, 8 layers, 8 heads / 4 kv,
intermediate 1408, vocab 32000; ~57M parameters) and a GPT-2 (n_embd 512, 8 layers, 8 heads, vocab
32000, 1024 positions; ~58M), f32, seeded. make_bench_train.py OUT (writes OUT/llama, OUT/gpt2)"""
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
out = sys.argv[1]
LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048)
                 ).save_pretrained(os.path.join(out, "llama"))
GPT2LMHeadModel(GPT2Config(vocab_size=32000, n_embd=512, n_layer=8, n_head=8, n_positions=1024, resid_pdrop=0.0,
                           bos_token_id=0, eos_token_id=0,
                           embd_pdrop=0.0, attn_pdrop=0.0)).save_pretrained(os.path.join(out, "gpt2"))
