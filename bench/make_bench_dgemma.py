#!/usr/bin/env python3
"""A small random DiffusionGemma (DiffusionGemmaForBlockDiffusion) for bench/diffusion_block.sh: hidden 256,
6 layers (five sliding of 4 heads over 2 kv heads of 64, window 64, then one full of global head size 128
with one kv head), intermediate 512, 4 experts of 256 (top 2), vocab 4096, canvas_length 16, f32,
transformers' own random init with the self-conditioning MLP's output scaled by 0.05, as
tests/models/bd_oracle.py's (undamped, the loop from one step's logits to the next step's input amplifies
rounding, so two paths that differ only in summation order soon draw different tokens), written with
save_pretrained (~10M parameters). Big enough that a forward is
not all overhead, small enough that a generation of a few blocks takes seconds on two cores. With
"words", also a WordPiece tokenizer whose every id is a word ("[UNK]", "<s>", "</s>", then "w3" ...
"w4095"), for bench/serve_diffusion.sh (KIND=dgemma): tk serve-model needs a tokenizer.

    make_bench_dgemma.py OUT [words]
"""
import os
import sys

import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion


def main():
    text = dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=6, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096, head_dim=64, global_head_dim=128,
                num_global_key_value_heads=1, sliding_window=64, num_experts=4, top_k_experts=2,
                moe_intermediate_size=256)
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    cfg = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=16, boi_token_id=4090,
                               eoi_token_id=4091, image_token_id=4092)
    torch.manual_seed(0)
    m = DiffusionGemmaForBlockDiffusion(cfg)
    with torch.no_grad():  # damped as tests/models/bd_oracle.py's: rounding is not amplified step to step
        m.model.decoder.self_conditioning.down_proj.weight.mul_(0.05)
    m.generation_config.eos_token_id = None  # every block runs: the bench measures whole generations
    m.save_pretrained(sys.argv[1])
    if sys.argv[2:] == ["words"]:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        special = ["[UNK]", "<s>", "</s>"]
        vocab = {w: i for i, w in enumerate(special + ["w%d" % i for i in range(len(special), text["vocab_size"])])}
        tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
        tok.add_special_tokens(special)
        tok.save(os.path.join(sys.argv[1], "tokenizer.json"))


if __name__ == "__main__":
    main()
