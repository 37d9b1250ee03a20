"""tk.kernelize on tiny random transformers models (made here from a config and a seed, no download):
a Llama's logits and greedy generation with tk ops equal the original's, and the tk ops really ran
(every call is counted); a Gemma, whose RMSNorm (1 + weight) tk's rms_norm does not compute, keeps
those layers and says so; padding masks fall back to sdpa; restore() undoes it.

Stated tolerances on the logits (max |diff|): f32 1e-4, bf16 2e-2 (logits of magnitude < 1; the
bf16 difference is one rounding of rms_norm's output, which tk does once and transformers twice)."""
import collections

from harness import Skip, need_torch

torch = need_torch()
try:
    import transformers  # noqa: F401
    from transformers import GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM
except ImportError:
    import os
    if os.environ.get("CI") == "true":
        raise AssertionError("transformers is not installed in the test venv (CI=true: a failure)")
    raise Skip("transformers is not installed")

import tk  # noqa: E402
import tk.ops  # noqa: E402

PARAMS = {"test_llama_logits_and_generate": ["cpu:f32", "cpu:bf16", "cuda:f32", "cuda:bf16"]}


class Counter:
    """Counts the ops tk runs (the real calls go through)."""

    def __init__(self):
        self.n = collections.Counter()
        self._orig = tk.ops._run_values

    def __enter__(self):
        def counting(spec, values, ctx=None):
            self.n[spec.name] += 1
            return self._orig(spec, values, ctx)
        tk.ops._run_values = counting
        return self

    def __exit__(self, *exc):
        tk.ops._run_values = self._orig


def _llama(dtype, device, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2)
    m = LlamaForCausalLM(cfg).eval().to(dtype).to(device)
    for mod in m.modules():  # non-trivial norm weights, so a wrong weight path shows
        if type(mod).__name__.endswith("RMSNorm"):
            torch.nn.init.normal_(mod.weight, 1.0, 0.3)
    return m


def test_llama_logits_and_generate(case):
    dev, dt = case.split(":")
    if dev == "cuda" and not torch.cuda.is_available():
        raise Skip("no CUDA device: the kernelized model on a GPU did not run")
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dt]
    tol = {"f32": 1e-4, "bf16": 2e-2}[dt]
    m = _llama(dtype, dev)
    ids = torch.randint(3, 128, (2, 13), generator=torch.Generator().manual_seed(1)).to(dev)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        ref = m(ids).logits.float()
        gen_ref = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    report = tk.kernelize(m, verbose=False)
    kinds = collections.Counter(what.split(" ")[0] for _, _, what in report.replaced)
    assert kinds == {"rms_norm": 5, "silu_and_mul": 2, "rotary_embedding": 2, "attention": 1}, kinds
    assert report.kept == [], report.kept
    with Counter() as c, torch.no_grad():
        got = m(ids).logits.float()
    assert c.n == {"rms_norm": 5, "silu_and_mul": 2, "rotary_embedding": 2, "attention": 2}, dict(c.n)
    err = (got - ref).abs().max().item()
    assert err <= tol, "kernelized logits differ by %.3g (tolerance %.1g)" % (err, tol)
    with Counter() as c, torch.no_grad():
        gen = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    if dt == "f32":  # bf16 argmax ties may flip with one rounding of difference
        assert torch.equal(gen, gen_ref), (gen, gen_ref)
    assert c.n["attention"] == 2 * 6, dict(c.n)  # prefill and 5 decode steps, 2 layers
    report.restore()
    assert m.config._attn_implementation == "sdpa"
    with Counter() as c, torch.no_grad():
        again = m(ids).logits.float()
    assert not c.n, dict(c.n)
    assert torch.equal(again, ref)


def test_padding_mask_falls_back_to_sdpa():
    m = _llama(torch.float32, "cpu", seed=3)
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding in row 1
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).logits
    tk.kernelize(m, verbose=False)
    with Counter() as c, torch.no_grad():
        got = m(ids, attention_mask=mask).logits
    assert c.n["attention"] == 0 and c.n["rms_norm"] == 5, dict(c.n)  # the masked call went to sdpa
    keep = mask.bool()
    assert (got[keep] - ref[keep]).abs().max() <= 1e-4


def test_gemma_keeps_what_tk_does_not_compute():
    torch.manual_seed(0)
    cfg = GemmaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    m = GemmaForCausalLM(cfg).eval()
    for mod in m.modules():
        if type(mod).__name__.endswith("RMSNorm"):
            torch.nn.init.normal_(mod.weight, 0.0, 0.5)
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = m(ids).logits
    import logging
    seen = []

    class H(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    h = H(level=logging.WARNING)
    logging.getLogger("tk.kernelize").addHandler(h)
    try:
        report = tk.kernelize(m)
    finally:
        logging.getLogger("tk.kernelize").removeHandler(h)
    kept = [(p, cls) for p, cls, _ in report.kept]
    assert ("model.norm", "GemmaRMSNorm") in kept and len(kept) == 5, report.kept
    assert all("not tk's rms_norm" in why for _, _, why in report.kept)
    assert any("kept 5 original layers" in s and "model.norm (GemmaRMSNorm)" in s for s in seen), seen
    kinds = collections.Counter(what.split(" ")[0] for _, _, what in report.replaced)
    assert kinds["gelu_tanh_and_mul"] == 2 and kinds["rotary_embedding"] == 2, kinds
    with Counter() as c, torch.no_grad():
        got = m(ids).logits
    assert c.n["rms_norm"] == 0 and c.n["gelu_tanh_and_mul"] == 2, dict(c.n)
    assert (got - ref).abs().max() <= 1e-4


def test_modes_and_other_modules():
    m = _llama(torch.float32, "cpu")
    for bad in ("training", "torch_compile"):
        try:
            tk.kernelize(m, mode=bad)
            raise AssertionError("mode=%s accepted" % bad)
        except ValueError as e:
            assert "no autograd" in str(e)
    try:
        tk.kernelize(m, layers=("norm", "conv"))
        raise AssertionError("an unknown layer kind was accepted")
    except ValueError as e:
        assert "conv" in str(e)
    # a plain torch module: LayerNorm is mapped, the rest reported or left alone
    seq = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.GELU()).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = seq(x)
    r = tk.kernelize(seq, verbose=False)
    assert [w for _, _, w in r.replaced] == ["layer_norm"], r.replaced
    assert any("not a transformers PreTrainedModel" in w for _, _, w in r.kept), r.kept
    with Counter() as c, torch.no_grad():
        got = seq(x)
    assert c.n == {"layer_norm": 1} and (got - ref).abs().max() < 1e-5
    # autograd in training mode uses the original forward
    seq.train()
    with Counter() as c:
        seq(x.requires_grad_()).sum().backward()
    assert not c.n


def test_compiled_kernelized_llama_is_one_graph():
    """torch.compile(fullgraph=True) of a kernelized Llama: one graph that holds every tk op, and the
    logits of the eager original."""
    m = _llama(torch.float32, "cpu", seed=5)
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = m(ids).logits
    tk.kernelize(m, verbose=False)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(m, fullgraph=True, backend=backend)(ids).logits
    assert len(graphs) == 1, "%d graphs" % len(graphs)
    ops = collections.Counter(str(n.target).split(".")[1] for n in graphs[0].graph.nodes
                              if n.op == "call_function" and str(n.target).startswith("tk."))
    assert ops == {"rms_norm": 5, "silu_and_mul": 2, "rotary_embedding": 2, "attention": 2}, ops
    assert (got - ref).abs().max() <= 1e-4


def test_gpt2_layer_norm_and_attention():
    """Another architecture: GPT-2's nn.LayerNorm layers and its attention move to tk, its MLP (no gate)
    is kept and reported, and the logits stay."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)).eval()
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = m(ids).logits
    r = tk.kernelize(m, verbose=False)
    assert [(p, why) for p, _, why in r.kept] == [("transformer.h.%d.mlp" % i, "no tk mapping for GPT2MLP")
                                                   for i in range(2)], r.kept
    with Counter() as c, torch.no_grad():
        got = m(ids).logits
    assert c.n == {"layer_norm": 5, "attention": 2}, dict(c.n)
    assert (got - ref).abs().max() <= 1e-4
