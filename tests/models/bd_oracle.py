#!/usr/bin/env python3
"""Block diffusion oracle: transformers' own DiffusionGemmaForBlockDiffusion.generate (5.24) with its
randomness replaced by draws from a file that tk reads too (tk generate --draws), so both sides see the
same noise. Prints one JSON line: the generated ids (pad after eos, as transformers returns them), every
denoising step's accepted canvas positions with its block, and the decoder forward passes.

    bd_oracle.py DIR DRAWS IDS key=value...
    bd_oracle.py make DIR [eos=ID]

make writes the test checkpoint: make_tiny.py's tiny DiffusionGemma with the self-conditioning MLP's output
scaled by 0.05 (at the random init's scale the loop from one step's logits to the next step's input
amplifies rounding about tenfold per step, so transformers in f32 and in f64 part after a few steps; damped,
both agree with tk to 1e-6 over whole runs), and with eos=ID a generation_config.json whose eos_token_id
is ID and pad_token_id 0.

IDS: the prompt, comma-separated. keys: max_new_tokens, max_denoising_steps, t_min, t_max, entropy_bound,
stability_threshold, confidence_threshold (generate's arguments), seed (the draws' generator). DRAWS is
written: little-endian float64 uniforms in [0, 1), more than the run can use, consumed in transformers'
order: per block torch.randint for the starting canvas (canvas_length), then per step torch.multinomial
(canvas_length: the inverse CDF of each row's probabilities, in float64) and torch.randint for the
renoised canvas (canvas_length: floor(u * vocab_size)). docs/diffusion.md has the same order.
"""
import json
import math
import sys

import numpy as np
import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma import generation_diffusion_gemma as gen
from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig


def diffusion_gemma_cfg():
    """make_tiny.py's DiffusionGemma: sliding layers of head_dim 16 and window 4, full layers of global head
    size 32 with one kv head, 4 experts with top 2, canvas_length 6"""
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, head_dim=16, global_head_dim=32,
                num_global_key_value_heads=1, rms_norm_eps=1e-6, sliding_window=4, num_experts=4, top_k_experts=2,
                moe_intermediate_size=32, final_logit_softcapping=5.0,
                layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])
    # the vision tower is part of the class (tk ignores it): a tiny one
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=6, boi_token_id=250,
                                eoi_token_id=251, image_token_id=252)


def make(d, eos=None):
    m = DiffusionGemmaForBlockDiffusion(diffusion_gemma_cfg())
    g = torch.Generator().manual_seed(24)
    with torch.no_grad():  # make_tiny.py's weights
        for n, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g).to(p.dtype)
            is_norm = p.dim() == 1 and n.endswith("weight") and "norm" in n.lower()
            p.copy_(1.0 + 0.1 * r if is_norm else 0.2 * r)
        m.model.decoder.self_conditioning.down_proj.weight.mul_(0.05)
    if eos is not None:
        m.generation_config.eos_token_id = eos
        m.generation_config.pad_token_id = 0
    m.save_pretrained(d)


def main():
    if sys.argv[1] == "make":
        kv = dict(a.split("=", 1) for a in sys.argv[3:])
        return make(sys.argv[2], int(kv["eos"]) if "eos" in kv else None)
    d, draws_path, ids = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
    kv = dict(a.split("=", 1) for a in sys.argv[4:])
    m = DiffusionGemmaForBlockDiffusion.from_pretrained(d, dtype=torch.float32).eval()
    C, V = m.config.canvas_length, m.config.text_config.vocab_size
    args = {"max_new_tokens": int(kv.get("max_new_tokens", 12)),
            "max_denoising_steps": int(kv.get("max_denoising_steps", 8))}
    for k in ("t_min", "t_max", "confidence_threshold"):
        if k in kv:
            args[k] = float(kv[k])
    if "stability_threshold" in kv:
        args["stability_threshold"] = int(kv["stability_threshold"])
    if "entropy_bound" in kv:
        args["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=float(kv["entropy_bound"]))
    blocks = math.ceil(args["max_new_tokens"] / C)
    u = np.random.default_rng(int(kv.get("seed", 0))).random(blocks * C * (1 + 2 * args["max_denoising_steps"]) + 64)
    u.astype("<f8").tofile(draws_path)
    it = iter(u.tolist())

    def randint(low, high=None, size=None, **_):
        if high is None:
            low, high = 0, low
        n = int(np.prod(size))
        return torch.tensor([low + min(int(math.floor(next(it) * (high - low))), high - low - 1) for _ in range(n)],
                            dtype=torch.long).view(*size)

    def multinomial(probs, num_samples=1, **_):
        assert num_samples == 1
        out = []
        for row in probs.double():
            cum = torch.cumsum(row, 0)
            target = next(it) * float(cum[-1])
            hit = ((cum > target) & (row > 0)).nonzero()
            out.append(int(hit[0]) if len(hit) else int((row > 0).nonzero()[-1]))
        return torch.tensor(out, dtype=torch.long)[:, None]

    steps, block = [], [-1]
    accept = gen.EntropyBoundSampler.accept_canvas
    prepare = gen.DiffusionGemmaGenerationMixin._prepare_denoiser_inputs

    def accept_rec(self, *a, **k):
        out = accept(self, *a, **k)
        steps.append({"block": block[0], "accepted": self.accepted_token_mask[0].nonzero().flatten().tolist()})
        return out

    def prepare_rec(self, *a, **k):
        block[0] += 1
        return prepare(self, *a, **k)

    gen.EntropyBoundSampler.accept_canvas = accept_rec
    gen.DiffusionGemmaGenerationMixin._prepare_denoiser_inputs = prepare_rec
    real = torch.randint, torch.multinomial
    torch.randint, torch.multinomial = randint, multinomial
    try:
        with torch.no_grad():
            out = m.generate(torch.tensor([ids]), **args)
    finally:
        torch.randint, torch.multinomial = real
    print(json.dumps({"ids": out.sequences[0, len(ids):].tolist(), "steps": steps, "forwards": len(steps)}))


if __name__ == "__main__":
    main()
