"""The ops from Python against a PyTorch expression of each (computed in fp32 or f64 from the same
inputs), in f32, f16 and bf16, through get_kernel modules as Hugging Face kernels' users call them
(`activation.gelu_fast(out, x)`), on CPU tensors; and the same on CUDA tensors when a GPU is there.

Ragged sizes on purpose (rows of 77 and 250 columns), inputs in [-3, 3]. Tolerances per dtype: the
output's rounding (f16 2e-3, bf16 1.6e-2 relative) plus fp32 accumulation; see harness.TOL.
Compared with torch here: every activation, rms_norm, fused_add_rms_norm (also with an f32 weight over
16-bit x, against transformers' GemmaRMSNorm: every element equal), layer_norm (with and
without bias), fused_add_layer_norm, rms_norm_backward and layer_norm_backward (autograd), softmax,
log_softmax, rotary_embedding (NeoX and GPT-J), attention (causal and not, GQA), cross_entropy (loss
and grad), argmax, sample (greedy), casted_linear. The rest are compared with the C tool only
(test_ops_c.py).
"""
import math

from harness import Skip, close, need_torch

torch = need_torch()
import torch.nn.functional as F  # noqa: E402

import tk  # noqa: E402

DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
DTYPES = list(DT)
DEVICES = ["cpu", "cuda"]
PARAMS = {name: ["%s:%s" % (dev, dt) for dev in DEVICES for dt in DTYPES]
          for name in ("test_activations", "test_norms", "test_norm_backward", "test_softmax", "test_rotary",
                       "test_attention", "test_cross_entropy_argmax_sample", "test_casted_linear")}


def _setup(case):
    dev, dt = case.split(":")
    if dev == "cuda":
        if not torch.cuda.is_available():
            raise Skip("no CUDA device (torch.cuda.is_available() is False): the CUDA path did not run")
    return torch.device(dev), DT[dt], dt


def _rand(*shape, dtype, device, lo=-3.0, hi=3.0, gen=None):
    return (torch.rand(*shape, generator=gen) * (hi - lo) + lo).to(dtype).to(device)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_activations(case):
    dev, dtype, dt = _setup(case)
    act = tk.get_kernel("kernels-community/activation")
    g = _gen(1)
    x = _rand(3, 7, 250, dtype=dtype, device=dev, gen=g)
    xf = x.float()
    d = 125
    a, b = xf[..., :d], xf[..., d:]
    gated = {"silu_and_mul": F.silu(a) * b, "mul_and_silu": a * F.silu(b), "gelu_and_mul": F.gelu(a) * b,
             "gelu_tanh_and_mul": F.gelu(a, approximate="tanh") * b,
             "fatrelu_and_mul": torch.where(a > 0.5, a, torch.zeros_like(a)) * b}
    for name, ref in gated.items():
        out = torch.empty(3, 7, d, dtype=dtype, device=dev)
        r = getattr(act, name)(out, x, 0.5) if name == "fatrelu_and_mul" else getattr(act, name)(out, x)
        assert r is out
        close(out, ref, dt, name)
    k = 0.7978845608028654
    unary = {"gelu": F.gelu(xf), "gelu_tanh": F.gelu(xf, approximate="tanh"), "silu": F.silu(xf),
             "gelu_new": 0.5 * xf * (1 + torch.tanh(k * (xf + 0.044715 * xf ** 3))),
             "gelu_fast": 0.5 * xf * (1 + torch.tanh(k * xf * (1 + 0.044715 * xf * xf))),
             "gelu_quick": xf * torch.sigmoid(1.702 * xf)}
    for name, ref in unary.items():
        y = torch.empty_like(x)
        getattr(act, name)(y, x)
        close(y, ref, dt, name)
    # a non-contiguous input (every other row of a bigger tensor) gives the same result as its copy
    big = _rand(14, 250, dtype=dtype, device=dev, gen=g)
    view = big[::2]
    if dev.type == "cpu":
        y1, y2 = torch.empty(7, 250, dtype=dtype), torch.empty(7, 250, dtype=dtype)
        act.gelu_fast(y1, view)
        act.gelu_fast(y2, view.contiguous())
        assert torch.equal(y1, y2)
    else:  # kernels take contiguous tensors: refused with tk's hint
        try:
            act.gelu_fast(torch.empty(7, 250, dtype=dtype, device=dev), view)
            raise AssertionError("a non-contiguous CUDA input was accepted")
        except tk.UnsupportedError as e:
            assert "contiguous" in e.message and e.hint


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_norms(case):
    dev, dtype, dt = _setup(case)
    norm = tk.get_kernel("kernels-community/rmsnorm")
    g = _gen(2)
    x = _rand(5, 3, 77, dtype=dtype, device=dev, gen=g)
    w = _rand(77, dtype=dtype, device=dev, gen=g)
    bias = _rand(77, dtype=dtype, device=dev, gen=g)
    res = _rand(5, 3, 77, dtype=dtype, device=dev, gen=g)
    xf, wf, bf, rf = x.float(), w.float(), bias.float(), res.float()
    out = torch.empty_like(x)
    norm.rms_norm(out, x, w, 1e-5)
    close(out, _rms(xf, wf, 1e-5), dt, "rms_norm")
    norm.layer_norm(out, x, w, bias, 1e-5)
    close(out, F.layer_norm(xf, (77,), wf, bf, 1e-5), dt, "layer_norm")
    norm.layer_norm(out, x, w)
    close(out, F.layer_norm(xf, (77,), wf, None, 1e-5), dt, "layer_norm (no bias)")
    xi, ri = x.clone(), res.clone()
    norm.fused_add_rms_norm(xi, ri, w, 1e-6)
    s = xf + rf
    close(ri, s, dt, "fused_add_rms_norm residual")
    close(xi, _rms(ri.float(), wf, 1e-6), dt, "fused_add_rms_norm input")
    xi, ri = x.clone(), res.clone()
    norm.fused_add_layer_norm(xi, ri, w, bias, 1e-5)
    close(xi, F.layer_norm(ri.float(), (77,), wf, bf, 1e-5), dt, "fused_add_layer_norm")
    if dt != "f32":
        _gemma_norm(norm, x, res, dev, dtype)


def _gemma_norm(norm, x, res, dev, dtype):
    """A 16-bit x with an f32 weight 1 + w against transformers' own GemmaRMSNorm (weight w in the model's
    dtype, multiplied as 1 + w.float() before one rounding): every element equal but a rare one-ulp rstd
    tie, where a weight rounded to 16 bits first differs on many."""
    try:
        from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    except ImportError:
        raise Skip("transformers is not installed: the Gemma norm oracle did not run")
    m = GemmaRMSNorm(77, eps=1e-6).to(dev)
    with torch.no_grad():
        m.weight.copy_(torch.linspace(-0.02, 0.03, 77))
    m = m.to(dtype)
    w32 = 1.0 + m.weight.detach().float()
    for fused in (0, 1):
        xi, ri = x.clone(), res.clone()
        if fused:
            norm.fused_add_rms_norm(xi, ri, w32, 1e-6)
            got, want = xi, m(ri)
        else:
            got = torch.empty_like(x)
            norm.rms_norm(got, x, w32, 1e-6)
            want = m(x)
        what = "%s, f32 weight, against GemmaRMSNorm" % ("fused_add_rms_norm" if fused else "rms_norm")
        same = (got == want).float().mean().item()
        rounded = torch.empty_like(x)
        norm.rms_norm(rounded, ri if fused else x, w32.to(dtype), 1e-6)
        same16 = (rounded == want).float().mean().item()
        assert same >= 0.999, "%s: %.4f of the elements equal" % (what, same)
        assert same16 < same, "%s: the 16-bit weight matched as well (%.4f): the case cannot tell" % (what, same16)


def test_norm_backward(case):
    dev, dtype, dt = _setup(case)
    norm = tk.get_kernel("kernels-community/rmsnorm")
    g = _gen(3)
    x = _rand(6, 77, dtype=dtype, device=dev, gen=g)
    w = _rand(77, dtype=dtype, device=dev, gen=g)
    go = _rand(6, 77, dtype=dtype, device=dev, gen=g)
    xf = x.float().requires_grad_()
    wf = w.float().requires_grad_()
    _rms(xf, wf, 1e-6).backward(go.float())
    gi, gw = torch.empty_like(x), torch.empty_like(w)
    norm.rms_norm_backward(gi, gw, go, x, w, 1e-6)
    close(gi, xf.grad, dt, "rms_norm_backward grad_input", atol=5e-5 if dt == "f32" else None)
    close(gw, wf.grad, dt, "rms_norm_backward grad_weight", atol=5e-5 if dt == "f32" else None)
    xf.grad = wf.grad = None
    bf = torch.zeros(77, requires_grad=True, device=dev)
    F.layer_norm(xf, (77,), wf, bf, 1e-5).backward(go.float())
    gb = torch.empty_like(w)
    norm.layer_norm_backward(gi, gw, gb, go, x, w, 1e-5)
    close(gi, xf.grad, dt, "layer_norm_backward grad_input", atol=5e-5 if dt == "f32" else None)
    close(gw, wf.grad, dt, "layer_norm_backward grad_weight", atol=5e-5 if dt == "f32" else None)
    close(gb, bf.grad, dt, "layer_norm_backward grad_bias", atol=5e-5 if dt == "f32" else None)


def test_softmax(case):
    dev, dtype, dt = _setup(case)
    sm = tk.get_kernel("kernels-community/softmax")
    x = _rand(4, 1001, dtype=dtype, device=dev, gen=_gen(4)) * 3
    out = torch.empty_like(x)
    sm.softmax(out, x)
    close(out, torch.softmax(x.float(), -1), dt, "softmax")
    sm.log_softmax(out, x)
    close(out, torch.log_softmax(x.float(), -1), dt, "log_softmax", atol=1e-4 if dt == "f32" else None)


def test_rotary(case):
    dev, dtype, dt = _setup(case)
    rot = tk.get_kernel("kernels-community/rotary")
    g = _gen(5)
    T, Hq, Hkv, D, maxpos = 9, 4, 2, 64, 32
    q = _rand(T, Hq, D, dtype=dtype, device=dev, gen=g)
    k = _rand(T, Hkv, D, dtype=dtype, device=dev, gen=g)
    pos = torch.tensor([3, 0, 31, 7, 7, 12, 1, 2, 20], device=dev)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    fr = torch.arange(maxpos, dtype=torch.float64)[:, None] * inv[None]
    cache = torch.cat([fr.cos(), fr.sin()], -1).float().to(dev)
    cos, sin = cache[pos, : D // 2][:, None], cache[pos, D // 2:][:, None]
    for neox in (1, 0):
        qo, ko = q.clone(), k.clone()
        rot.rotary_embedding(qo, ko, pos, cache, neox)
        for name, x, got in (("query", q, qo), ("key", k, ko)):
            xf = x.float()
            if neox:
                x1, x2 = xf[..., : D // 2], xf[..., D // 2:]
                ref = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
            else:
                x1, x2 = xf[..., 0::2], xf[..., 1::2]
                ref = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)
            close(got, ref, dt, "rotary_embedding %s is_neox=%d" % (name, neox))


def test_attention(case):
    dev, dtype, dt = _setup(case)
    fa = tk.get_kernel("kernels-community/flash-attn")
    g = _gen(6)
    B, Hq, Hkv, D = 2, 4, 2, 64
    for Sq, Sk, causal in ((33, 33, 1), (5, 40, 0), (17, 17, 0)):
        q = _rand(B, Sq, Hq, D, dtype=dtype, device=dev, gen=g)
        k = _rand(B, Sk, Hkv, D, dtype=dtype, device=dev, gen=g)
        v = _rand(B, Sk, Hkv, D, dtype=dtype, device=dev, gen=g)
        out = torch.empty_like(q)
        fa.attention(out, q, k, v, causal=causal)
        ref = F.scaled_dot_product_attention(q.float().transpose(1, 2), k.float().transpose(1, 2),
                                             v.float().transpose(1, 2), is_causal=bool(causal),
                                             enable_gqa=True).transpose(1, 2)
        close(out, ref, dt, "attention Sq=%d Sk=%d causal=%d" % (Sq, Sk, causal),
              atol=1e-4 if dt == "f32" else None)


def test_cross_entropy_argmax_sample(case):
    dev, dtype, dt = _setup(case)
    g = _gen(7)
    ce = tk.get_kernel("kernels-community/cross-entropy")
    logits = _rand(16, 333, dtype=dtype, device=dev, gen=g) * 2
    target = torch.randint(0, 333, (16,), generator=g).to(dev)
    target[3] = -100
    loss = torch.empty(1, device=dev)
    grad = torch.empty_like(logits)
    ce.cross_entropy(logits, target, loss, grad)
    lf = logits.float().requires_grad_()
    ref = F.cross_entropy(lf, target, ignore_index=-100)
    ref.backward()
    close(loss, ref.reshape(1), "f32", "cross_entropy loss", atol=1e-5, rtol=1e-5)
    close(grad, lf.grad, dt, "cross_entropy grad", atol=1e-6 if dt == "f32" else None)
    smp = tk.get_kernel("kernels-community/sampling")
    ids = torch.empty(16, dtype=torch.int64, device=dev)
    smp.argmax(ids, logits)
    assert torch.equal(ids, logits.float().argmax(-1)), "argmax"
    ids.fill_(-5)
    smp.sample(ids, logits, temperature=0.0)  # greedy
    assert torch.equal(ids, logits.float().argmax(-1)), "sample(temperature=0)"


def test_casted_linear(case):
    dev, dtype, dt = _setup(case)
    cl = tk.get_kernel("kernels-community/casted")
    g = _gen(8)
    x = _rand(5, 96, dtype=dtype, device=dev, gen=g)
    w = torch.randint(-127, 128, (40, 96), generator=g, dtype=torch.int8).to(dev)
    scale = (torch.rand(40, generator=g) * 0.02).to(dev)
    bias = _rand(40, dtype=dtype, device=dev, gen=g)
    out = torch.empty(5, 40, dtype=dtype, device=dev)
    cl.casted_linear(out, x, w, scale, bias)
    ref = x.float() @ (w.float() * scale[:, None]).T + bias.float()
    close(out, ref, dt, "casted_linear", atol=1e-4 if dt == "f32" else None)
