#!/usr/bin/env python3
"""Runs tk (the CLI, `tk model logits --json --hidden` and `tk embed --json`) and transformers /
sentence-transformers on the same checkpoints and ids, and prints one line per case:

    CASE <name> ok|FAIL <worst errors, tolerance>

    compare.py TK TINY_DIR [MINILM_DIR]

The reference is always transformers in f32 on the same checkpoint (weights upcast as tk does).
  f32:  |tk - ref| <= 1e-4 + 1e-4 * |ref| elementwise over logits, last hidden states (and BERT's
        pooler output); the argmax token agrees at every position.
  bf16, f16: tk rounds every activation to the low-precision dtype, as a bf16/f16 model does, so it is
        held to transformers' own error in that dtype: max |tk - ref| <= 2 * max |hf_lowp - ref| + 0.01
        per output, where hf_lowp is transformers run in bf16/f16 on the same ids; the argmax agrees
        at every position where the reference's top two logits are more than 0.1 (bf16) / 0.03 (f16)
        apart (closer ones may swap in low precision).
Sentence embeddings (all-MiniLM-L6-v2) vs sentence-transformers: cosine >= 0.9999 per sentence.
"""
import json
import os
import subprocess
import sys

import torch

TK, TINY = sys.argv[1], sys.argv[2]
MINILM = sys.argv[3] if len(sys.argv) > 3 else None
TOL = {"f32": (1e-4, 1e-4, 0.0), "bf16": (0.01, 0.0, 0.1), "f16": (0.01, 0.0, 0.03)}
TORCH_DT = {"bf16": torch.bfloat16, "f16": torch.float16}
torch.manual_seed(0)


def tk_logits(d, seqs, dtype):
    cmd = [TK, "model", "logits", d, "--dtype", dtype, "--hidden", "--json"]
    for s in seqs:
        cmd += ["--ids", ",".join(map(str, s))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("tk failed (%d): %s" % (r.returncode, r.stderr.strip()))
    return json.loads(r.stdout)


def hf_model(d, arch, dtype=torch.float32):
    import transformers
    cls = getattr(transformers, arch)
    # eager for an attention softcap (Gemma 2): some transformers versions default it to sdpa, which drops
    # the softcap; the others keep the default (their bf16 tolerance is measured against it)
    cfg = json.load(open(os.path.join(d, "config.json")))
    kw = {"attn_implementation": "eager"} if cfg.get("attn_logit_softcapping") else {}
    return cls.from_pretrained(d, dtype=dtype, **kw).eval()


def hf_run(m, arch, ids):
    x = torch.tensor([ids])
    with torch.no_grad():
        if arch == "DiffusionGemmaForBlockDiffusion":
            # the prompt through the encoder, the last canvas_length ids as the decoder's canvas (one
            # denoising step, no self-conditioning); each half's logits: the softcapped LM head
            P = len(ids) - m.config.canvas_length
            o = m.model(input_ids=x[:, :P], decoder_input_ids=x[:, P:])
            h = torch.cat([o.encoder_last_hidden_state[0], o.last_hidden_state[0]])
            cap = m.final_logit_softcapping
            return torch.tanh(m.lm_head(h).float() / cap) * cap, h, None
        if arch == "BertModel":
            o = m(x)
            return None, o.last_hidden_state[0], o.pooler_output[0]
        base = m.transformer if arch == "GPT2LMHeadModel" else m.model
        h = base(x).last_hidden_state
        return m(x).logits[0], h[0], None


def worst(got, ref, atol, rtol):
    got = torch.tensor(got, dtype=torch.float64)
    ref = ref.to(torch.float64)
    if got.shape != ref.shape:
        return False, "shape %s, want %s" % (list(got.shape), list(ref.shape))
    err = (got - ref).abs()
    bound = atol + rtol * ref.abs()
    i = int(torch.argmax(err - bound))
    ok = bool((err <= bound).all())
    return ok, "max |err| %.3g (at %d: got %.6g, want %.6g)" % (float(err.max()), i, float(got.flatten()[i]),
                                                                 float(ref.flatten()[i]))


def case(name, d, seqs, dtype="f32"):
    arch = json.load(open(os.path.join(d, "config.json")))["architectures"][0]
    atol, rtol, gap = TOL[dtype]
    try:
        out = tk_logits(d, seqs, dtype)
    except RuntimeError as e:
        print("CASE %s FAIL %s" % (name, e), flush=True)
        return
    m = hf_model(d, arch)
    mlow = hf_model(d, arch, TORCH_DT[dtype]) if dtype != "f32" else None
    msgs, ok, row = [], True, 0
    for s, ids in enumerate(seqs):
        n = len(ids)
        lg, hd, pooled = hf_run(m, arch, ids)
        low = hf_run(mlow, arch, ids) if mlow is not None else None
        checks = [("hidden", out["hidden"][row:row + n], hd, low and low[1])]
        if lg is not None:
            checks.append(("logits", out["logits"][row:row + n], lg, low and low[0]))
        if pooled is not None:
            checks.append(("pooled", [out["pooled"][s]], pooled[None], low and low[2][None]))
        for what, got, ref, lowref in checks:
            if lowref is not None:
                hf_err = float((lowref.double() - ref.double()).abs().max())
                good, msg = worst(got, ref, 2 * hf_err + atol, 0.0)
                msg += " vs transformers %s's %.3g" % (dtype, hf_err)
            else:
                good, msg = worst(got, ref, atol, rtol)
            ok &= good
            msgs.append("seq %d %s %s" % (s, what, msg))
        if lg is not None:
            got = torch.tensor(out["logits"][row:row + n])
            top2 = torch.topk(lg, 2, dim=-1).values
            clear = (top2[:, 0] - top2[:, 1]) > gap
            agree = got.argmax(-1) == lg.argmax(-1)
            bad = (~agree & clear).nonzero().flatten().tolist()
            if bad:
                ok = False
                msgs.append("seq %d argmax differs at positions %s" % (s, bad))
            else:
                msgs.append("seq %d argmax agrees at %d/%d positions (%d clear)" % (s, int(agree.sum()), n,
                                                                                   int(clear.sum())))
        row += n
    tol = "atol %g rtol %g" % (atol, rtol) if dtype == "f32" else "2 x transformers' %s error + %g" % (dtype, atol)
    print("CASE %s %s %s; tolerance %s" % (name, "ok" if ok else "FAIL", "; ".join(msgs), tol), flush=True)


def embed_case(name, d):
    from sentence_transformers import SentenceTransformer
    texts = ["A man is eating food.", "A man is riding a white horse on an enclosed ground.",
             "The quick brown fox jumps over the lazy dog!", "tk runs all-MiniLM-L6-v2 through tk_op_run.",
             "Un homme mange de la nourriture; ça va très bien.",
             # over max_seq_length (256 tokens): both truncate, keeping [SEP]
             " ".join(["A long sentence about kernels, models and tokenizers number %d." % i for i in range(40)])]
    r = subprocess.run([TK, "embed", d] + texts + ["--json"], capture_output=True, text=True)
    if r.returncode != 0:
        print("CASE %s FAIL tk embed failed (%d): %s" % (name, r.returncode, r.stderr.strip()), flush=True)
        return
    got = torch.tensor(json.loads(r.stdout)["embeddings"], dtype=torch.float64)
    ref = torch.tensor(SentenceTransformer(d, device="cpu").encode(texts), dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    ok = bool((cos >= 0.9999).all()) and got.shape == ref.shape
    print("CASE %s %s cosine per sentence %s; max |err| %.3g; want cosine >= 0.9999" % (
        name, "ok" if ok else "FAIL", ", ".join("%.7f" % c for c in cos.tolist()), float((got - ref).abs().max())),
        flush=True)


def main():
    g = torch.Generator().manual_seed(1)
    ids = lambda n: torch.randint(0, 256, (n,), generator=g).tolist()
    p12, p7, p20 = ids(12), ids(7), ids(20)
    case("llama_gqa_llama3_f32", os.path.join(TINY, "llama"), [p12])
    case("llama_batch_f32", os.path.join(TINY, "llama"), [p12, p7, p20])
    case("llama_bf16", os.path.join(TINY, "llama"), [p12], "bf16")
    case("llama_f16", os.path.join(TINY, "llama"), [p12], "f16")
    case("llama_yarn_f32", os.path.join(TINY, "llama-yarn"), [p20])
    # Dynamic NTK depends on the longest sequence in the batch (as transformers' on a padded batch),
    # so each length runs alone: 12 tokens > max_position_embeddings 8 rescales, 7 does not.
    case("llama_dynamic_scaled_f32", os.path.join(TINY, "llama-dynamic"), [p12])
    case("llama_dynamic_unscaled_f32", os.path.join(TINY, "llama-dynamic"), [p7])
    case("llama_bf16_checkpoint_v4_config_f32", os.path.join(TINY, "llama-bf16-v4"), [p12])
    case("mistral_sliding_window_f32", os.path.join(TINY, "mistral"), [p12, p20])
    case("qwen2_bias_tied_f32", os.path.join(TINY, "qwen2"), [p12])
    case("qwen2_bf16", os.path.join(TINY, "qwen2"), [p12], "bf16")
    case("gpt2_sharded_f32", os.path.join(TINY, "gpt2"), [p12, p7])
    case("gpt2_bf16", os.path.join(TINY, "gpt2"), [p12], "bf16")
    case("gpt2_unprefixed_f32", os.path.join(TINY, "gpt2-unprefixed"), [p12])
    case("qwen2_sliding_layers_f32", os.path.join(TINY, "qwen2-sliding"), [p20])
    case("qwen3_qk_norm_tied_f32", os.path.join(TINY, "qwen3"), [p12, p7])
    case("qwen3_bf16", os.path.join(TINY, "qwen3"), [p12], "bf16")
    case("olmo2_post_norms_f32", os.path.join(TINY, "olmo2"), [p12, p7])
    case("olmo2_bf16", os.path.join(TINY, "olmo2"), [p12], "bf16")
    case("granite_multipliers_f32", os.path.join(TINY, "granite"), [p12, p7])
    case("granite_bf16", os.path.join(TINY, "granite"), [p12], "bf16")
    case("smollm3_nope_f32", os.path.join(TINY, "smollm3"), [p12, p20])
    case("smollm3_bf16", os.path.join(TINY, "smollm3"), [p12], "bf16")
    case("gemma_f32", os.path.join(TINY, "gemma"), [p12, p7])
    case("gemma_bf16", os.path.join(TINY, "gemma"), [p12], "bf16")
    case("gemma2_softcap_sliding_f32", os.path.join(TINY, "gemma2"), [p12, p20])
    case("gemma2_bf16", os.path.join(TINY, "gemma2"), [p12], "bf16")
    case("gemma3_two_ropes_f32", os.path.join(TINY, "gemma3"), [p12, p20])
    case("gemma3_bf16", os.path.join(TINY, "gemma3"), [p12], "bf16")
    case("phi3_fused_partial_rotary_f32", os.path.join(TINY, "phi3"), [p12, p20])
    case("phi3_bf16", os.path.join(TINY, "phi3"), [p12], "bf16")
    # LongRoPE: 7 tokens take short_factor, 12 and 20 (past original_max_position_embeddings 10) long_factor
    case("phi3_longrope_f32", os.path.join(TINY, "phi3-longrope"), [p7, p12, p20])
    case("phi3_longrope_bf16", os.path.join(TINY, "phi3-longrope"), [p7, p20], "bf16")
    case("mixtral_moe_sliding_f32", os.path.join(TINY, "mixtral"), [p12, p20])
    case("mixtral_bf16", os.path.join(TINY, "mixtral"), [p12], "bf16")
    case("qwen2_moe_shared_expert_f32", os.path.join(TINY, "qwen2_moe"), [p12, p7])
    case("qwen2_moe_bf16", os.path.join(TINY, "qwen2_moe"), [p12], "bf16")
    case("qwen3_moe_sparse_step_f32", os.path.join(TINY, "qwen3_moe"), [p12, p7])
    case("qwen3_moe_bf16", os.path.join(TINY, "qwen3_moe"), [p12], "bf16")
    case("qwen3_moe_fused_experts_f32", os.path.join(TINY, "qwen3_moe-fused"), [p12])
    # block diffusion: the prompt (the encoder, causal) and a 6-token canvas (the decoder over the prompt's
    # keys: the sliding layers' last 3 of them, and its own) in one forward, two sequences in the batch
    case("diffusion_gemma_f32", os.path.join(TINY, "diffusion_gemma"), [p12, p20])
    case("diffusion_gemma_bf16", os.path.join(TINY, "diffusion_gemma"), [p12], "bf16")
    case("diffusion_gemma_layer_scalars_f32", os.path.join(TINY, "diffusion_gemma-scalars"), [p7, p20])
    case("bert_pooler_f32", os.path.join(TINY, "bert"), [p12, p7])
    if MINILM:
        embed_case("minilm_embeddings_vs_sentence_transformers", MINILM)


if __name__ == "__main__":
    main()
