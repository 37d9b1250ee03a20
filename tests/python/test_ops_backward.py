"""The backward ops training uses, called from Python (tk.ops) on CPU torch tensors, against
torch.autograd on the same inputs computed in float64: linear_backward (nn.Linear and Conv1D layouts,
accumulation), embedding_backward (padding_idx), every activation backward, the gated ones,
softmax/log_softmax, rotary_embedding_backward, attention_backward (causal, GQA, sliding window,
varlen), the norm backwards through the training path, cross_entropy's gradient with ignore_index
and label_smoothing as F.cross_entropy defines them, and adamw against torch.optim.AdamW.

Tolerances (f32 results against float64 autograd): 2e-5 relative + 2e-6 absolute per element times
the result's scale; bf16/f16 inputs add their rounding (harness.TOL). The C test
(tests/test_ops_backward.c) checks the same ops against float64 formulas and finite differences.
"""
import math

from harness import Skip, close, need_torch

torch = need_torch()
import torch.nn.functional as F  # noqa: E402

import tk  # noqa: E402

A, R = 2e-6, 2e-5


def _g(seed):
    return torch.Generator().manual_seed(seed)


def _r(*shape, gen, lo=-1.0, hi=1.0, dtype=torch.float32):
    return (torch.rand(*shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def _grads(f, *xs):
    """f's gradients w.r.t. xs in float64 (xs upcast, leaves)."""
    leaves = [x.detach().double().requires_grad_(True) for x in xs]
    out = f(*leaves)
    return out, leaves


def test_linear_backward():
    g = _g(1)
    for tr in (0, 1):
        for acc in (0, 1):
            x, go = _r(9, 33, gen=g), _r(9, 19, gen=g)
            w = _r(33, 19, gen=g) if tr else _r(19, 33, gen=g)
            b = _r(19, gen=g)
            gx0, gw0, gb0 = _r(9, 33, gen=g), _r(*w.shape, gen=g), _r(19, gen=g)
            gx, gw, gb = gx0.clone(), gw0.clone(), gb0.clone()
            tk.ops.linear_backward(gx, gw, gb, go, x, w, tr, acc)
            xs, ws, bs = (t.double().requires_grad_(True) for t in (x, w, b))
            y = (xs @ ws + bs) if tr else F.linear(xs, ws, bs)
            y.backward(go.double())
            close(gx, xs.grad + (gx0.double() if acc else 0), what="linear_backward grad_x tr=%d acc=%d" % (tr, acc),
                  atol=A * 6, rtol=R)
            close(gw, ws.grad + gw0.double(), what="linear_backward grad_weight (accumulated)", atol=A * 3, rtol=R)
            close(gb, bs.grad + gb0.double(), what="linear_backward grad_bias (accumulated)", atol=A * 3, rtol=R)


def test_embedding_backward():
    g = _g(2)
    ids = torch.randint(0, 13, (4, 9), generator=g)
    go = _r(4, 9, 70, gen=g)
    for pad in (-1, 3):
        w = _r(13, 70, gen=g).double().requires_grad_(True)
        F.embedding(ids, w, padding_idx=None if pad < 0 else pad).backward(go.double())
        gw = torch.zeros(13, 70)
        tk.ops.embedding_backward(gw, go, ids, pad)
        close(gw, w.grad, what="embedding_backward padding_idx=%d" % pad, atol=A * 4, rtol=R)


def test_activation_backward():
    g = _g(3)
    k = 0.7978845608028654
    acts = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
            "gelu_new": lambda x: 0.5 * x * (1 + torch.tanh(k * (x + 0.044715 * x ** 3))),
            "gelu_quick": lambda x: x * torch.sigmoid(1.702 * x), "tanh": torch.tanh}
    for dt, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        x, go = _r(5, 301, gen=g, lo=-5, hi=5, dtype=dt), _r(5, 301, gen=g, dtype=dt)
        for name, f in acts.items():
            xs = x.double().requires_grad_(True)
            f(xs).backward(go.double())
            gi = torch.empty_like(x)
            getattr(tk.ops, name + "_backward")(gi, go, x)
            if dname == "f32":
                close(gi, xs.grad, what=name + "_backward", atol=A, rtol=R)
            else:
                close(gi, xs.grad, dname, what=name + "_backward")
        d = 150
        gated = {"silu_and_mul": lambda a, b: F.silu(a) * b, "mul_and_silu": lambda a, b: a * F.silu(b),
                 "gelu_and_mul": lambda a, b: F.gelu(a) * b,
                 "gelu_tanh_and_mul": lambda a, b: F.gelu(a, approximate="tanh") * b}
        x2, go2 = _r(4, 2 * d, gen=g, lo=-4, hi=4, dtype=dt), _r(4, d, gen=g, dtype=dt)
        for name, f in gated.items():
            xs = x2.double().requires_grad_(True)
            f(xs[:, :d], xs[:, d:]).backward(go2.double())
            gi = torch.empty_like(x2)
            getattr(tk.ops, name + "_backward")(gi, go2, x2)
            if dname == "f32":
                close(gi, xs.grad, what=name + "_backward", atol=A * 4, rtol=R)
            else:
                close(gi, xs.grad, dname, what=name + "_backward")


def test_softmax_backward():
    g = _g(4)
    z, go = _r(6, 257, gen=g, lo=-3, hi=3), _r(6, 257, gen=g)
    for name, f in (("softmax", lambda t: torch.softmax(t, -1)), ("log_softmax", lambda t: torch.log_softmax(t, -1))):
        zs = z.double().requires_grad_(True)
        y = f(zs)
        y.backward(go.double())
        gi = torch.empty(6, 257)
        getattr(tk.ops, name + "_backward")(gi, go, y.detach().float())
        close(gi, zs.grad, what=name + "_backward", atol=A, rtol=1e-4)


def _rope_ref(x, cos, sin, neox):
    if neox:
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)


def test_rotary_backward():
    g = _g(5)
    T, Hq, Hkv, D, P = 7, 4, 2, 16, 12
    cache = torch.empty(P, D)
    tk.ops.rope_cos_sin_cache(cache)
    pos = torch.randint(0, P, (T,), generator=g)
    cos, sin = cache[pos, :D // 2].double()[:, None, :], cache[pos, D // 2:].double()[:, None, :]
    for neox in (1, 0):
        q, k = _r(T, Hq, D, gen=g), _r(T, Hkv, D, gen=g)
        gq, gk = _r(T, Hq, D, gen=g), _r(T, Hkv, D, gen=g)
        qs, ks = q.double().requires_grad_(True), k.double().requires_grad_(True)
        (_rope_ref(qs, cos, sin, neox) * gq.double()).sum().add((_rope_ref(ks, cos, sin, neox) * gk.double()).sum()).backward()
        tk.ops.rotary_embedding_backward(gq, gk, pos, cache, neox)
        close(gq, qs.grad, what="rotary_embedding_backward grad_query neox=%d" % neox, atol=A, rtol=R)
        close(gk, ks.grad, what="rotary_embedding_backward grad_key neox=%d" % neox, atol=A, rtol=R)


def _attn_ref(q, k, v, causal, wl):
    # q [S, Hq, D], k/v [S, Hkv, D] one sequence; returns [S, Hq, D]
    S, Hq, D = q.shape
    rep = Hq // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = torch.einsum("ihd,jhd->hij", q, kk) / math.sqrt(D)
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    vis = torch.ones(S, S, dtype=torch.bool)
    if causal:
        vis &= j <= i
    if wl >= 0:
        vis &= j >= i - wl
    s = s.masked_fill(~vis, float("-inf"))
    return torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), vv)


def test_attention_backward():
    g = _g(6)
    lens = [6, 1, 9, 4]
    T, Hq, Hkv, D = sum(lens), 4, 2, 16
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    for causal, wl in ((1, -1), (1, 3), (0, -1)):
        q, k, v = _r(1, T, Hq, D, gen=g), _r(1, T, Hkv, D, gen=g), _r(1, T, Hkv, D, gen=g)
        dout = _r(1, T, Hq, D, gen=g)
        out, lse = torch.empty(1, T, Hq, D), torch.empty(1, Hq, T)
        tk.ops.attention(out, q, k, v, lse, cu, cu, max(lens), causal=causal, window_left=wl)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        tk.ops.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, causal=causal, window_left=wl,
                                  cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens))
        qs, ks, vs = (t.double().requires_grad_(True) for t in (q, k, v))
        outs = [_attn_ref(qs[0, a:b], ks[0, a:b], vs[0, a:b], causal, wl) for a, b in zip(cu[:-1], cu[1:])]
        (torch.cat(outs) * dout[0].double()).sum().backward()
        what = "attention_backward varlen causal=%d window_left=%d" % (causal, wl)
        close(dq, qs.grad, what=what + " dq", atol=1e-5, rtol=1e-4)
        close(dk, ks.grad, what=what + " dk", atol=1e-5, rtol=1e-4)
        close(dv, vs.grad, what=what + " dv", atol=1e-5, rtol=1e-4)


def test_norm_backward():
    g = _g(7)
    x, go, gr = _r(5, 96, gen=g, lo=-2, hi=2), _r(5, 96, gen=g), _r(5, 96, gen=g)
    w, b = _r(96, gen=g, lo=0.5, hi=1.5), _r(96, gen=g)
    # rms_norm as LlamaRMSNorm
    xs, ws = x.double().requires_grad_(True), w.double().requires_grad_(True)
    (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-5) * ws).backward(go.double())
    gi, gw = torch.empty(5, 96), torch.empty(96)
    tk.ops.rms_norm_backward(gi, gw, go, x, w, 1e-5)
    close(gi, xs.grad, what="rms_norm_backward grad_input", atol=A * 4, rtol=R)
    close(gw, ws.grad, what="rms_norm_backward grad_weight", atol=A * 4, rtol=R)
    # fused_add_layer_norm_backward: residual path + the norm's gradient
    xs, ws, bs = (t.double().requires_grad_(True) for t in (x, w, b))
    F.layer_norm(xs, (96,), ws, bs, 1e-5).backward(go.double())
    gi, gw, gb = torch.empty(5, 96), torch.empty(96), torch.empty(96)
    tk.ops.fused_add_layer_norm_backward(gi, gw, gb, go, gr, x, w, 1e-5)
    close(gi, xs.grad + gr.double(), what="fused_add_layer_norm_backward grad_input", atol=A * 4, rtol=R)
    close(gw, ws.grad, what="fused_add_layer_norm_backward grad_weight", atol=A * 4, rtol=R)
    close(gb, bs.grad, what="fused_add_layer_norm_backward grad_bias", atol=A * 4, rtol=R)


def test_cross_entropy_grad():
    g = _g(8)
    N, V = 11, 37
    for smooth in (0.0, 0.1):
        logits = _r(N, V, gen=g, lo=-4, hi=4)
        target = torch.randint(0, V, (N,), generator=g)
        target[[2, 7]] = -100
        ls = logits.double().requires_grad_(True)
        ref = F.cross_entropy(ls, target, ignore_index=-100, label_smoothing=smooth)
        ref.backward()
        loss, grad = torch.empty(()), torch.empty(N, V)
        tk.ops.cross_entropy(logits, target, loss, grad, ignore_index=-100, label_smoothing=smooth)
        close(loss, ref, what="cross_entropy loss smoothing=%g" % smooth, atol=1e-6, rtol=1e-6)
        close(grad, ls.grad, what="cross_entropy grad smoothing=%g" % smooth, atol=1e-7, rtol=1e-5)


def test_adamw_matches_torch():
    g = _g(9)
    p0 = _r(300, gen=g)
    ref = p0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([ref], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    p, m, v = p0.clone(), torch.zeros(300), torch.zeros(300)
    for step in range(1, 8):
        grad = _r(300, gen=g, lo=-0.5, hi=0.5)
        ref.grad = grad.clone()
        opt.step()
        tk.ops.adamw(p, grad, m, v, lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=step)
    close(p, ref.detach(), what="adamw after 7 steps vs torch.optim.AdamW", atol=1e-7, rtol=1e-6)
    close(m, opt.state[ref]["exp_avg"], what="adamw exp_avg", atol=1e-8, rtol=1e-6)
    close(v, opt.state[ref]["exp_avg_sq"], what="adamw exp_avg_sq", atol=1e-10, rtol=1e-6)
