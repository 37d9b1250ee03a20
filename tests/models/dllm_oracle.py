"""dllm_oracle.py — the reference for tk's masked diffusion generation (tests/cli/diffusion_lm.sh).

  make DIR       writes tiny random checkpoints (seeded) with one tokenizer.json:
                   DIR/llama  LlamaForCausalLM (save_pretrained; no mask_token_id: run with
                              --bidirectional --mask-token-id)
                   DIR/llada  the same weights in LLaDA's published layout: config.json with
                              modeling_llada.py's keys, tensors under its names
                              (model.transformer.wte, blocks.N.q_proj, attn_out, ff_proj, up_proj,
                              ff_out, ...), written with safetensors from the Llama's state dict,
                              one tensor to one tensor
                   DIR/qwen2  Qwen2ForCausalLM (save_pretrained)
                   DIR/dream  the same weights as Dream publishes them: Qwen2 names, config.json
                              with architectures DreamModel, model_type Dream, mask_token_id
  check DIR      asserts that the 4D all-zero float mask really makes transformers attend
                 bidirectionally (first position's logits differ from the causal model's, the last
                 position's agree)
  logits REFDIR IDS
                 the bidirectional model's logits of IDS, {"logits": [[...] per position]}
  run REFDIR SAMPLER DRAWS key=value...   (run-many: one such line a job on stdin)
                 runs the published sampler (SAMPLER llada: ML-GSAI/LLaDA generate.py; dream: HKUNLP/
                 Dream generation_utils.py _sample), written here from the published algorithm, over
                 REFDIR's model run bidirectionally, and prints {"ids": [new ids], "steps": [[unmasked
                 positions, sorted], ...]}. Uniform draws (the Gumbel noise, random remasking, Dream's
                 origin transfer draws) come from DRAWS, a file of little-endian float64 this writes
                 (numpy seed 1234), which tk reads with --draws in the same order.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

TEXT = ["The quick brown fox jumps over the lazy dog.", "Masked diffusion models unmask a few tokens per step.",
        "Once upon a time there was a little model that generated text, all at once.",
        "To be, or not to be, that is the question."] * 4
MASK = "<|mdm_mask|>"


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    special = ["<unk>", "<s>", "</s>", MASK] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=360, special_tokens=special, limit_alphabet=40))
    return tok


def make(d):
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    tok = make_tokenizer()
    V, bos, eos, mask = tok.get_vocab_size(), tok.token_to_id("<s>"), tok.token_to_id("</s>"), tok.token_to_id(MASK)
    torch.manual_seed(0)
    H, I, NL, NH, NKV = 64, 128, 2, 4, 2
    lc = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=NL, num_attention_heads=NH,
                     num_key_value_heads=NKV, max_position_embeddings=96, bos_token_id=bos, eos_token_id=eos,
                     initializer_range=0.3, tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5)
    llama = LlamaForCausalLM(lc).float().eval()
    qc = Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=NL, num_attention_heads=NH,
                     num_key_value_heads=NKV, max_position_embeddings=96, bos_token_id=bos, eos_token_id=eos,
                     initializer_range=0.3, tie_word_embeddings=False, rope_theta=10000.0, rms_norm_eps=1e-6,
                     use_sliding_window=False)
    qwen = Qwen2ForCausalLM(qc).float().eval()
    for sub, m in (("llama", llama), ("qwen2", qwen), ("dream", qwen)):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
        m.save_pretrained(os.path.join(d, sub), safe_serialization=True)
        tok.save(os.path.join(d, sub, "tokenizer.json"))
    # Dream: Qwen2's weights and config, as Dream-org/Dream-v0-Instruct-7B's config.json names them
    p = os.path.join(d, "dream", "config.json")
    c = json.load(open(p))
    c.update({"architectures": ["DreamModel"], "model_type": "Dream", "mask_token_id": mask, "pad_token_id": eos,
              "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                           "AutoModel": "modeling_dream.DreamModel"}})
    json.dump(c, open(p, "w"), indent=2)
    # LLaDA: the Llama's tensors under modeling_llada.py's names (LLaDALlamaBlock), its config keys
    os.makedirs(os.path.join(d, "llada"), exist_ok=True)
    sd = llama.state_dict()
    ren = {"model.embed_tokens.weight": "model.transformer.wte.weight", "model.norm.weight":
           "model.transformer.ln_f.weight", "lm_head.weight": "model.transformer.ff_out.weight"}
    sub = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm", "self_attn.q_proj": "q_proj",
           "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
           "mlp.gate_proj": "ff_proj", "mlp.up_proj": "up_proj", "mlp.down_proj": "ff_out"}
    out = {}
    for k, v in sd.items():
        if k in ren:
            out[ren[k]] = v.contiguous()
            continue
        parts = k.split(".")  # model.layers.N.<module...>.weight
        mod = ".".join(parts[3:-1])
        out[f"model.transformer.blocks.{parts[2]}.{sub[mod]}.{parts[-1]}"] = v.contiguous()
    assert len(out) == len(sd)
    save_file(out, os.path.join(d, "llada", "model.safetensors"), metadata={"format": "pt"})
    llada_cfg = {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                     "AutoModel": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": H,
        "embedding_dropout": 0.0, "embedding_size": V, "eos_token_id": eos, "flash_attention": False,
        "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
        "layer_norm_with_affine": True, "mask_token_id": mask, "max_sequence_length": 96, "mlp_hidden_size": I,
        "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": NH, "n_kv_heads": NKV,
        "n_layers": NL, "pad_token_id": eos, "precision": "amp_bf16", "residual_dropout": 0.0,
        "rms_norm_eps": 1e-5, "rope": True, "rope_full_precision": True, "rope_theta": 500000.0,
        "scale_logits": False, "transformers_version": "4.46.3", "use_cache": False, "vocab_size": V,
        "weight_tying": False, "torch_dtype": "float32"}
    json.dump(llada_cfg, open(os.path.join(d, "llada", "config.json"), "w"), indent=2)
    tok.save(os.path.join(d, "llada", "tokenizer.json"))
    print(json.dumps({"dir": d, "vocab": V, "mask": mask, "eos": eos}))


def load(refdir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(refdir, dtype=torch.float32).eval()


def bidir(model):
    """logits of x [B, L] with every position attending to every other: a 4D additive float mask of
    zeros (transformers 5 uses a 4D mask as given; a 2D all-ones mask means 'causal')."""
    @torch.no_grad()
    def f(x):
        L = x.shape[1]
        return model(input_ids=x, attention_mask=torch.zeros(x.shape[0], 1, L, L)).logits
    return f


def check(d):
    for sub in ("llama", "qwen2"):
        m = load(os.path.join(d, sub))
        x = torch.tensor([[5, 17, 33, 48, 2, 9, 60, 61]])
        with torch.no_grad():
            causal = m(input_ids=x).logits
        bi = bidir(m)(x)
        with torch.no_grad():
            flag = m(input_ids=x, is_causal=False).logits  # the other way transformers 5 offers
            full = m(input_ids=x, attention_mask=torch.ones(1, 1, 8, 8, dtype=torch.bool)).logits
        first = (bi[0, 0] - causal[0, 0]).abs().max().item()
        agree = max((bi - flag).abs().max().item(), (bi - full).abs().max().item())
        assert first > 1e-3, f"{sub}: the 4D mask left the model causal (first position differs by {first})"
        assert agree < 1e-5, f"{sub}: the zero float mask, is_causal=False and an all-true 4D mask disagree ({agree})"
        print(f"{sub}: bidirectional (first position differs from causal by {first:.4g}; three ways agree to {agree:.2g})")


class Draws:
    def __init__(self, path, n):
        self.u = np.random.default_rng(1234).random(n)
        self.u.astype("<f8").tofile(path)
        self.i = 0

    def take(self, n):
        assert self.i + n <= len(self.u), "the draws file is too short"
        r = self.u[self.i:self.i + n]
        self.i += n
        return torch.from_numpy(r.copy())


def num_transfer_tokens(mask_index, steps):  # LLaDA's get_num_transfer_tokens
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base, rem = mask_num // steps, mask_num % steps
    n = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        n[i, :rem[i]] += 1
    return n


def llada(fwd, prompt, a, draws):
    P, G = len(prompt), a["gen_length"]
    B = a.get("block_length", G)
    mask_id, T, cfg, rm = a["mask_token_id"], a.get("temperature", 0.0), a.get("cfg_scale", 0.0), a.get("remasking", "low_confidence")
    x = torch.full((1, P + G), mask_id, dtype=torch.long)
    x[:, :P] = torch.tensor(prompt)
    prompt_index = x != mask_id
    nb = G // B
    spb = a["steps"] // nb
    log = []
    for b in range(nb):
        bmi = x[:, P + b * B:P + (b + 1) * B] == mask_id
        ntt = num_transfer_tokens(bmi, spb)
        for i in range(spb):
            mask_index = x == mask_id
            if cfg > 0:
                un_x = x.clone()
                un_x[prompt_index] = mask_id
                logits, un_logits = torch.chunk(fwd(torch.cat([x, un_x], dim=0)), 2, dim=0)
                logits = un_logits + (cfg + 1) * (logits - un_logits)
            else:
                logits = fwd(x)
            if T == 0:
                lwn = logits
            else:  # add_gumbel_noise: float64 logits, exp(l) / (-log u)^T
                l64 = logits.to(torch.float64)
                noise = draws.take(l64.numel()).view(l64.shape)
                lwn = l64.exp() / (-torch.log(noise)) ** T
            x0 = torch.argmax(lwn, dim=-1)
            if rm == "low_confidence":
                p = F.softmax(logits.to(torch.float64), dim=-1)
                x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            else:
                x0_p = draws.take(x0.numel()).view(x0.shape)
            x0_p[:, P + (b + 1) * B:] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=x0_p.dtype))
            _, sel = torch.topk(confidence[0], k=int(ntt[0, i]))
            x[0, sel] = x0[0, sel]
            log.append(sorted(sel.tolist()))
    return x[0, P:].tolist(), log


def dream(fwd, prompt, a, draws):
    P, G, N = len(prompt), a["gen_length"], a["steps"]
    mask_id, alg, eps = a["mask_token_id"], a.get("alg", "origin"), a.get("eps", 1e-3)
    x = F.pad(torch.tensor([prompt]), (0, G), value=mask_id)
    timesteps = torch.linspace(1, eps, N + 1)
    log = []
    for i in range(N):
        mask_index = x == mask_id
        logits = fwd(x)
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        before = x.clone()
        if alg == "origin":
            p_transfer = 1 - s / t if i < N - 1 else 1
            x0 = torch.zeros_like(x[mask_index], dtype=torch.long) + mask_id
            transfer = draws.take(x0.numel()) < p_transfer
            x0[transfer] = torch.softmax(mask_logits[transfer], dim=-1).max(dim=-1)[1]
            x[mask_index] = x0.clone()
        else:
            ml = mask_logits
            if a.get("top_p", 1.0) < 1:  # Dream's top_p_logits
                sl, si = torch.sort(ml, descending=True)
                rm = torch.cumsum(F.softmax(sl, dim=-1), dim=-1) > a["top_p"]
                rm[..., 1:] = rm[..., :-1].clone()
                rm[..., 0] = 0
                drop = torch.zeros_like(ml, dtype=torch.bool).scatter_(-1, si, rm)
                ml = ml.masked_fill(drop, torch.finfo(ml.dtype).min)
            if a.get("top_k"):  # Dream's top_k_logits
                kth = torch.topk(ml, min(a["top_k"], ml.size(-1)))[0][..., -1, None]
                ml = ml.masked_fill(ml < kth, torch.finfo(ml.dtype).min)
            probs = torch.softmax(ml, dim=-1)
            confidence, x0 = probs.max(dim=-1)
            if alg == "topk_margin":
                sp, _ = torch.sort(probs, dim=-1, descending=True)
                confidence = sp[:, 0] - sp[:, 1]
            elif alg == "entropy":
                confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
            num_mask_token = mask_index.sum() / mask_index.shape[0]
            k = int(num_mask_token * (1 - s / t)) if i < N - 1 else int(num_mask_token)
            full = torch.full_like(x, -torch.inf, dtype=logits.dtype)
            full[mask_index] = confidence
            if k > 0:
                _, ti = torch.topk(full, k)
                x_ = torch.zeros_like(x, dtype=torch.long) + mask_id
                x_[mask_index] = x0.clone()
                rows = torch.arange(x.size(0)).unsqueeze(1).expand_as(ti)
                x[rows, ti] = x_[rows, ti]
        log.append(sorted((x[0] != before[0]).nonzero().flatten().tolist()))
    return x[0, P:].tolist(), log


_models = {}


def run(refdir, sampler, draws_path, kv):
    a = {}
    for item in kv:
        k, v = item.split("=", 1)
        a[k] = v if k in ("remasking", "alg", "prompt") else (float(v) if "." in v or "e-" in v else int(v))
    prompt = [int(t) for t in a.pop("prompt").split(",")]
    m = _models.get(refdir) or _models.setdefault(refdir, load(refdir))
    V = m.config.vocab_size
    L = len(prompt) + a["gen_length"]
    draws = Draws(draws_path, a["steps"] * (L * V + L) + 16)
    ids, log = (llada if sampler == "llada" else dream)(bidir(m), prompt, a, draws)
    print(json.dumps({"ids": ids, "steps": log}))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2])
    elif sys.argv[1] == "logits":  # logits REFDIR IDS: the bidirectional model's logits, as JSON
        x = torch.tensor([[int(t) for t in sys.argv[3].split(",")]])
        print(json.dumps({"logits": bidir(load(sys.argv[2]))(x)[0].tolist()}))
    elif sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    elif sys.argv[1] == "run-many":  # one "REFDIR SAMPLER DRAWS key=value..." a line on stdin
        for line in sys.stdin:
            if line.strip():
                a = line.split()
                run(a[0], a[1], a[2], a[3:])
                sys.stdout.flush()
