"""kernelize: run a transformers model's layers on tk ops.

    model = AutoModelForCausalLM.from_pretrained(...)   # eval mode
    report = tk.kernelize(model)                         # prints what it replaced and what it kept
    logits = model(input_ids).logits

What is replaced (mode="inference", the only mode: tk's ops have no autograd formulas yet):
- RMSNorm layers (the layers transformers marks with use_kernel_forward_from_hub("RMSNorm") when the
  `kernels` package is installed, else every module whose class name ends in "RMSNorm"), and
  torch.nn.LayerNorm: the instance's forward becomes tk's rms_norm / layer_norm.
- Gated MLPs (gate_proj, up_proj, down_proj and act_fn): the activation and the product become one
  silu_and_mul / gelu_and_mul / gelu_tanh_and_mul, whichever act_fn computes.
- Rotary embedding: the modeling module's apply_rotary_pos_emb (transformers' "rotary_pos_emb" hub
  hook) is wrapped; the wrapper runs tk's rotary_embedding only inside this model's attention layers
  and calls the original everywhere else.
- Attention: registered with transformers' own AttentionInterface as "tk" (with sdpa's mask function)
  and selected with model.set_attn_implementation("tk"). Calls without a mask (causal prefill,
  decode) run tk's attention; calls with a padding mask run transformers' sdpa.

Every candidate is checked before it is replaced: the new forward runs on a small random input beside
the original and must agree within the dtype's tolerance, so a layer with another formula (Gemma's
1 + weight, a partial rotary, an activation tk lacks) keeps its original forward, and the report says
which layers were kept and why. A replaced forward calls the original when autograd needs it (grad
mode on and the layer in training mode). report.restore() undoes everything.
"""
import logging
import sys
import threading

import torch

from . import _lib
from . import ops as _ops

log = logging.getLogger("tk.kernelize")

__all__ = ["kernelize", "KernelizeReport"]

_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}


class KernelizeReport:
    """What kernelize did: `replaced` and `kept` are lists of (module path, class name, detail)."""

    def __init__(self, model):
        self.model = model
        self.replaced = []
        self.kept = []
        self._undo = []

    def restore(self):
        """Puts every original forward and the attention implementation back."""
        for f in reversed(self._undo):
            f()
        self._undo = []

    def __str__(self):
        by = {}
        for _, cls, what in self.replaced:
            by[(cls, what)] = by.get((cls, what), 0) + 1
        lines = ["tk.kernelize: %d layers on tk ops" % len(self.replaced)]
        lines += ["  %3d x %s -> %s" % (n, cls, what) for (cls, what), n in sorted(by.items())]
        if self.kept:
            lines.append("  kept %d original layers:" % len(self.kept))
            lines += ["    %s (%s): %s" % k for k in self.kept]
        return "\n".join(lines)


def _fn(name):
    return _ops.function(name)


def _grad_needed(module):
    return torch.is_grad_enabled() and module.training


def _agree(got, ref):
    tol = _TOL.get(ref.dtype, 1e-4)
    g, r = got.detach().double(), ref.detach().double()
    if g.shape != r.shape:
        return "shape %s, want %s" % (tuple(g.shape), tuple(r.shape))
    err = ((g - r).abs() - tol * (1 + r.abs())).max().item() if r.numel() else 0
    return None if err <= 0 else "max |diff| %.3g over tolerance %.1g" % ((g - r).abs().max().item(), tol)


def _set_forward(report, m, fwd):
    had = "forward" in m.__dict__
    prev = m.__dict__.get("forward")
    m.forward = fwd

    def undo():
        if had:
            m.forward = prev
        else:
            m.__dict__.pop("forward", None)
    report._undo.append(undo)


def _probe(m, orig, new, make_input):
    """None when new(x) agrees with orig(x) on a random x, else why not."""
    try:
        with torch.no_grad():
            x = make_input()
            ref = orig(x)
            got = new(x)
    except _lib.TkError as e:
        return "tk refused it: %s" % e.message
    if isinstance(ref, tuple):
        ref, got = ref[0], got[0]
    return _agree(got, ref)


# ---- norms ------------------------------------------------------------------------------------

def _is_rms_norm(m):
    return getattr(type(m), "kernel_layer_name", None) == "RMSNorm" or type(m).__name__.endswith("RMSNorm")


def _rms_norm(report, path, m):
    w = getattr(m, "weight", None)
    eps = getattr(m, "variance_epsilon", getattr(m, "eps", None))
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or eps is None:
        return "no 1-D weight and eps (variance_epsilon) to map onto rms_norm"
    orig = m.forward
    eps = float(eps)
    rms = _fn("rms_norm")

    def forward(hidden_states, *args, **kwargs):
        if args or kwargs or _grad_needed(m) or hidden_states.dtype != m.weight.dtype:
            return orig(hidden_states, *args, **kwargs)
        x = hidden_states.contiguous()
        out = torch.empty_like(x)
        rms(out, x, m.weight, eps)
        return out

    why = _probe(m, orig, forward, lambda: torch.randn(2, 5, w.shape[0], dtype=w.dtype, device=w.device))
    if why:
        return "its forward is not tk's rms_norm (%s)" % why
    _set_forward(report, m, forward)
    report.replaced.append((path, type(m).__name__, "rms_norm"))


def _layer_norm(report, path, m):
    if len(m.normalized_shape) != 1 or m.weight is None:
        return "layer_norm maps one normalized dimension with a weight"
    orig = m.forward
    ln = _fn("layer_norm")

    def forward(x):
        if _grad_needed(m) or x.dtype != m.weight.dtype:
            return orig(x)
        x = x.contiguous()
        out = torch.empty_like(x)
        ln(out, x, m.weight, m.bias, float(m.eps))
        return out

    w = m.weight
    why = _probe(m, orig, forward, lambda: torch.randn(2, 5, w.shape[0], dtype=w.dtype, device=w.device))
    if why:
        return "its forward is not tk's layer_norm (%s)" % why
    _set_forward(report, m, forward)
    report.replaced.append((path, type(m).__name__, "layer_norm"))


# ---- gated MLP --------------------------------------------------------------------------------

_GATED = (("silu", "silu_and_mul"), ("gelu", "gelu_and_mul"), ("gelu_tanh", "gelu_tanh_and_mul"))


def _is_gated_mlp(m):
    return all(isinstance(getattr(m, n, None), torch.nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")) \
        and callable(getattr(m, "act_fn", None))


def _mlp(report, path, m):
    w = m.gate_proj.weight
    act = None
    with torch.no_grad():
        t = torch.linspace(-6, 6, 97, dtype=w.dtype, device=w.device)
        ref = m.act_fn(t)
        for unary, gated in _GATED:
            got = torch.empty_like(t)
            try:
                _fn(unary)(got, t)
            except _lib.TkError as e:
                return "tk cannot run %s here: %s" % (unary, e.message)
            if _agree(got, ref) is None:
                act = gated
                break
    if act is None:
        return "its act_fn (%s) is none of tk's gated activations (silu, gelu, gelu_tanh)" % type(m.act_fn).__name__
    orig = m.forward
    gated_fn = _fn(act)

    def forward(x, *args, **kwargs):
        if args or kwargs or _grad_needed(m):
            return orig(x, *args, **kwargs)
        gu = torch.cat([m.gate_proj(x), m.up_proj(x)], -1)
        h = torch.empty(*gu.shape[:-1], gu.shape[-1] // 2, dtype=gu.dtype, device=gu.device)
        gated_fn(h, gu)
        return m.down_proj(h)

    why = _probe(m, orig, forward, lambda: torch.randn(2, 3, w.shape[1], dtype=w.dtype, device=w.device))
    if why:
        return "its forward is not down_proj(%s(gate_proj(x), up_proj(x))) (%s)" % (act, why)
    _set_forward(report, m, forward)
    report.replaced.append((path, type(m).__name__, act))


# ---- rotary embedding -------------------------------------------------------------------------

_active = threading.local()


def _in_kernelized_attention():
    return getattr(_active, "depth", 0) > 0


def _tk_rotary(q, k, cos, sin):
    """HF's apply_rotary_pos_emb for q, k [B, H, S, D] and cos, sin [B, S, D] (halves duplicated), as
    tk's rotary_embedding over [B, S, H, D] copies with one cache row per token."""
    B, _, S, D = q.shape
    half = D // 2
    cs = torch.cat([cos[..., :half], sin[..., :half]], -1).expand(B, S, D).reshape(B * S, D).contiguous()
    pos = torch.arange(B * S, device=q.device).view(B, S)
    qt = q.transpose(1, 2).contiguous()
    kt = k.transpose(1, 2).contiguous()
    _fn("rotary_embedding")(qt, kt, pos, cs, 1)
    return qt.transpose(1, 2), kt.transpose(1, 2)


def _rotary_usable(q, k, cos, sin, unsqueeze_dim, rest, kwargs):
    return (not rest and not kwargs and unsqueeze_dim == 1 and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3
            and cos.shape == sin.shape and cos.shape[-1] == q.shape[-1] == k.shape[-1] and q.shape[-1] % 2 == 0
            and cos.shape[-2] == q.shape[-2] == k.shape[-2] and cos.shape[0] in (1, q.shape[0])
            and q.dtype == k.dtype and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)))


def _wrap_rotary(modname):
    """Wraps <modname>.apply_rotary_pos_emb once; returns the wrapper (None if the module has none)."""
    mod = sys.modules.get(modname)
    orig = getattr(mod, "apply_rotary_pos_emb", None)
    if orig is None:
        return None
    if getattr(orig, "_tk_wrapper", False):
        return orig

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, *rest, **kwargs):
        if _in_kernelized_attention() and _rotary_usable(q, k, cos, sin, unsqueeze_dim, rest, kwargs):
            try:
                return _tk_rotary(q, k, cos, sin)
            except _lib.UnsupportedError as e:  # no installed kernel takes this call
                log.debug("tk rotary: %s; using the original", e.message)
        return orig(q, k, cos, sin, unsqueeze_dim, *rest, **kwargs)

    apply_rotary_pos_emb._tk_wrapper = True
    apply_rotary_pos_emb.__wrapped__ = orig
    apply_rotary_pos_emb.__doc__ = orig.__doc__
    mod.apply_rotary_pos_emb = apply_rotary_pos_emb
    return apply_rotary_pos_emb


def _check_rotary(fn, dtype, device, D):
    """None when fn (the wrapper, inside a kernelized attention) matches fn.__wrapped__."""
    g = torch.Generator().manual_seed(0)
    B, H, S = 2, 3, 5
    q = torch.randn(B, H, S, D, generator=g).to(dtype).to(device)
    k = torch.randn(B, 1, S, D, generator=g).to(dtype).to(device)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]]).float()
    emb = torch.cat([pos[..., None] * inv, pos[..., None] * inv], -1)
    cos, sin = emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)
    with torch.no_grad():
        ref = fn.__wrapped__(q, k, cos, sin)
        _active.depth = getattr(_active, "depth", 0) + 1
        try:
            got = fn(q, k, cos, sin)
        except _lib.TkError as e:
            return "tk refused it: %s" % e.message
        finally:
            _active.depth -= 1
    return _agree(got[0], ref[0]) or _agree(got[1], ref[1])


def _enter_attention(report, m):
    orig = m.forward

    def forward(*args, **kwargs):
        _active.depth = getattr(_active, "depth", 0) + 1
        try:
            return orig(*args, **kwargs)
        finally:
            _active.depth -= 1
    _set_forward(report, m, forward)


# ---- attention --------------------------------------------------------------------------------

def tk_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention interface: query [B, Hq, S, D], key/value [B, Hkv, Sk, D]; returns
    ([B, S, Hq, D], None). Calls with a mask, dropout or autograd go to transformers' sdpa."""
    sdpa_attention_forward = _sdpa[0]
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    softcap = kwargs.get("softcap") or 0.0
    if (attention_mask is not None or dropout or (torch.is_grad_enabled() and module.training)
            or kwargs.get("s_aux") is not None or query.dtype not in _TOL or key.dtype != query.dtype
            or query.shape[1] % key.shape[1] != 0):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    q = query.transpose(1, 2).contiguous()
    k = key.transpose(1, 2).contiguous()
    v = value.transpose(1, 2).contiguous()
    out = torch.empty_like(q)
    causal = int(bool(is_causal) and q.shape[1] > 1)
    try:
        _fn("attention")(out, q, k, v, scale=float(scaling or 0.0), causal=causal, softcap=float(softcap))
    except _lib.UnsupportedError as e:
        # no installed kernel takes this call (a head dim, dtype or length outside every kernel's
        # constraints): transformers' sdpa computes it instead, and the log says so once per reason
        if e.message not in _attention_fallbacks:
            _attention_fallbacks.add(e.message)
            log.warning("tk attention: %s; using sdpa for such calls", e.message)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    return out, None


_attention_fallbacks = set()


_sdpa = [None]  # transformers' sdpa_attention_forward, imported once (an import in a forward breaks dynamo)


def _register_attention():
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    _sdpa[0] = sdpa_attention_forward
    AttentionInterface.register("tk", tk_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register("tk", sdpa_mask)


def _attention(report, model):
    cfg = getattr(model, "config", None)
    prev = getattr(cfg, "_attn_implementation", None)
    if cfg is None or not hasattr(model, "set_attn_implementation"):
        report.kept.append(("", type(model).__name__, "attention: not a transformers PreTrainedModel"))
        return
    if getattr(model, "_can_set_attn_implementation", lambda: True)() is False:
        report.kept.append(("", type(model).__name__, "attention: the model does not use transformers' "
                            "AttentionInterface"))
        return
    _register_attention()
    try:
        model.set_attn_implementation("tk")
    except Exception as e:  # transformers refused it
        report.kept.append(("", type(model).__name__, "attention: set_attn_implementation('tk') failed: %s" % e))
        return
    if getattr(model.config, "_attn_implementation", None) != "tk":
        report.kept.append(("", type(model).__name__, "attention: the model kept attn_implementation=%r" %
                            model.config._attn_implementation))
        return
    report._undo.append(lambda: model.set_attn_implementation(prev or "sdpa"))
    report.replaced.append(("", type(model).__name__, "attention (AttentionInterface 'tk', prev %s)" % prev))


# ---- the walk ---------------------------------------------------------------------------------

_OPS_OF = {"norm": ("rms_norm", "layer_norm"), "mlp": ("silu", "gelu", "gelu_tanh") + tuple(g for _, g in _GATED),
           "rotary": ("rotary_embedding",), "attention": ("attention",)}


def _install_packages(model, layers):
    """On CUDA an op needs an installed package that implements it (on the CPU tk's reference runs
    anyway): get the packages tk ships for the ops kernelize may use. A failure is logged, and the
    layers whose check then fails keep their forward."""
    if not any(p.is_cuda for p in model.parameters()):
        return
    from .hub import get_kernel
    pkgs = []
    for kind in layers:
        for op in _OPS_OF[kind]:
            pkg = _ops._spec(op).package
            if pkg and pkg not in pkgs:
                pkgs.append(pkg)
    for pkg in pkgs:
        try:
            get_kernel(pkg)
        except _lib.TkError as e:
            log.warning("tk.kernelize: cannot install %s: %s", pkg, e)

_LAYERS = ("norm", "mlp", "rotary", "attention")


def kernelize(model, *, mode="inference", layers=_LAYERS, verbose=True):
    """Replaces the forward of `model`'s layers by tk ops (see the module doc) and returns a
    KernelizeReport. layers: which kinds to replace, of "norm", "mlp", "rotary", "attention".
    verbose: log the report (logger "tk.kernelize", and a warning naming the layers kept)."""
    if mode != "inference":
        raise ValueError("tk.kernelize: mode=%r is not supported: tk's ops have no autograd formulas yet, so only "
                         "mode='inference' exists (replaced layers fall back to their original forward when "
                         "autograd needs them)" % (mode,))
    bad = set(layers) - set(_LAYERS)
    if bad:
        raise ValueError("tk.kernelize: unknown layer kinds %s (known: %s)" % (sorted(bad), ", ".join(_LAYERS)))
    report = KernelizeReport(model)
    for kind in layers:  # generated now, so a traced forward (torch.compile) only looks them up
        for op in _OPS_OF[kind]:
            _fn(op)
    _install_packages(model, layers)
    rotary_checked = {}
    for path, m in model.named_modules():
        name = type(m).__name__
        why = None
        if "norm" in layers and _is_rms_norm(m):
            why = _rms_norm(report, path, m)
        elif "norm" in layers and isinstance(m, torch.nn.LayerNorm):
            why = _layer_norm(report, path, m)
        elif "mlp" in layers and _is_gated_mlp(m):
            why = _mlp(report, path, m)
        elif "rotary" in layers and name.endswith("Attention") and hasattr(m, "q_proj"):
            modname = type(m).__module__
            if modname not in rotary_checked:
                fn = _wrap_rotary(modname)
                w = m.q_proj.weight
                hd = getattr(m, "head_dim", None)
                if fn is None:
                    rotary_checked[modname] = "its module has no apply_rotary_pos_emb"
                elif not hd:
                    rotary_checked[modname] = "no head_dim attribute"
                else:
                    rotary_checked[modname] = _check_rotary(fn, w.dtype, w.device, hd)
                    if rotary_checked[modname]:
                        rotary_checked[modname] = "apply_rotary_pos_emb is not tk's rotary_embedding (%s)" % (
                            rotary_checked[modname])
            why = rotary_checked[modname]
            if why is None:
                _enter_attention(report, m)
                report.replaced.append((path, name, "rotary_embedding"))
        elif name.endswith(("Norm", "MLP")) or ("norm" in name.lower() and not list(m.children())):
            # (attention layers are the model's business: AttentionInterface, below)
            why = "no tk mapping for %s" % name
        if why:
            report.kept.append((path, name, why))
    if "attention" in layers:
        _attention(report, model)
    if verbose:
        log.info("%s", report)
        if report.kept:
            log.warning("tk.kernelize kept %d original layers: %s", len(report.kept),
                        "; ".join("%s (%s): %s" % k for k in report.kept))
    return report
