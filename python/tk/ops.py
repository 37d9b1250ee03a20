"""ops.py: every tk op as a Python function, generated from tk_ops_json().

The names, the parameter order and the defaults come from the library's op registry at run time, so
an op added to tk appears here with no change to this file. Each function takes the op's arguments
positionally or by name (outputs first, as in tk.h and in Hugging Face kernels' `gelu_fast(out, x)`),
writes the outputs in place and returns them (one tensor, or a tuple when the op has several).

With torch installed, each op is also a torch.library custom op `torch.ops.tk.<name>` that mutates its
output arguments and has a fake (meta) implementation, so torch.compile(fullgraph=True) keeps a call to
it in the graph: the generated functions go through it while torch traces, and straight to tk_op_run
in eager mode (the custom op's Python dispatch costs more than a small op). A torch call runs the op on the tensors' device: the CPU reference for host tensors,
the best installed kernel on torch's current CUDA stream for CUDA tensors. Other frameworks' tensors
go through DLPack (see _tensor.py) and CUDA ones run on the legacy default stream.

Ops that packages declare (kernel.json "ops") are here too, once the package is installed (or its
directory added with add_package): tk.ops.scale_add(out, x, y, 2.0). They have no CPU reference, so
host tensors get an UnsupportedError after their shapes and dtypes are checked.

Usage:  tk.ops.silu_and_mul(out, x);  tk.ops.rms_norm(out, x, weight, 1e-5);  tk.ops.names()
"""
import ctypes
import keyword
import threading

from . import _lib, _tensor

__all__ = ["names", "signature", "run", "add_package"]

_lock = threading.Lock()
_specs = None      # name -> OpSpec
_specs_ctx = None  # the context _specs was read from
_funcs = {}        # name -> generated function
_torch_ops = {}    # name -> torch.ops.tk.<name>


class Param:
    __slots__ = ("name", "pyname", "kind", "out", "optional", "default", "cname", "shape")

    def __init__(self, j):
        self.name = j["name"]
        self.pyname = self.name + "_" if keyword.iskeyword(self.name) or not self.name.isidentifier() else self.name
        self.kind = j["kind"]  # "tensor", "i64", "f64"
        self.out = j.get("role") == "out"
        self.optional = bool(j.get("optional"))
        self.shape = j.get("shape", "")
        self.default = j.get("default")
        self.cname = self.name.encode()


class OpSpec:
    """An op's signature, as tk_ops_json() gives it."""

    def __init__(self, j):
        self.name = j["name"]
        self.family = j.get("family")
        self.summary = j.get("summary", "")
        self.signature = j.get("signature", self.name)
        self.package = j.get("package")  # a package tk ships that implements it, or None
        self.declared_by = j.get("declared_by")  # the package that declares it, None for tk's own ops
        self.params = [Param(p) for p in j["params"]]
        self.outs = [p for p in self.params if p.kind == "tensor" and p.out]
        self.cname = self.name.encode()


def _load(refresh=False):
    """name -> OpSpec of every op with a signature: tk's own, then those packages declare. refresh:
    read tk_ops_json again (a package installed or added since declares more)."""
    global _specs, _specs_ctx
    ctx = _lib.current_context()
    # the cache belongs to one context: another one (a new TK_HOME, another thread's) has its own
    # installed packages and so its own declared ops
    if _specs is not None and _specs_ctx is ctx and not refresh:
        return _specs
    with _lock:
        if _specs is None or _specs_ctx is not ctx or refresh:
            specs = {}
            for j in ctx.ops_json():
                if "params" in j:
                    specs[j["name"]] = OpSpec(j)
            _specs, _specs_ctx = specs, ctx
    return _specs


def _find(name):
    s = _load().get(name)
    return s if s is not None else _load(refresh=True).get(name)


_add_package = _lib._fn("tk_ops_add_package", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)


def add_package(path, ctx=None):
    """Adds the op declarations and kernels of a package directory (checked as `tk check` does, never
    installed or signed) to the context's ops: its ops appear here, and tk_op_run tries its kernels
    first for CUDA tensors."""
    import os
    ctx = ctx or _lib.current_context()
    rc = _add_package(ctx.handle, os.fsencode(path))
    if rc != 0:
        raise _lib.error(rc)
    _load(refresh=True)


def names():
    """The names of every op with a signature, in registry order: tk's own, then those that installed
    packages declare."""
    return list(_load())


def signature(name):
    """The op's signature as `tk ops` prints it."""
    return _spec(name).signature


def _spec(name):
    s = _find(name)
    if s is None:
        # tk's own message, with its "did you mean" hint
        rc = _lib.tk_op_run(_lib.current_context().handle, name.encode(), None, 0, None, None)
        raise _lib.error(rc if rc else _lib.TK_ERR_NOT_FOUND)
    return s


# ---- running an op through tk_op_run ----------------------------------------------------------

def _run_values(spec, values, ctx=None):
    """Runs spec with values in parameter order (None: an optional argument left out). Returns the
    implementation that ran ("cpu-reference", "org/name:kernel")."""
    n = len(spec.params)
    if len(values) > n:
        raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "%s: takes %d arguments, got %d\nHINT: the signature "
                                        "is %s" % (spec.name, n, len(values), spec.signature))
    args = (_lib.Arg * n)()
    keep = []
    nargs = 0
    device = None
    for p, v in zip(spec.params, values):
        if v is None:
            continue  # tk applies the default or reports the missing argument
        a = args[nargs]
        a.name = p.cname
        if p.kind == "tensor":
            d = _tensor.describe(v, p.name)
            keep.append(d)
            a.kind = _lib.TK_ARG_TENSOR
            a.t = d.pointer()
            if device is None:
                device = (d.device, _tensor.is_torch(v))
        elif p.kind == "i64":
            a.kind = _lib.TK_ARG_I64
            try:
                iv = int(v)
                ok = iv == float(v) and -2 ** 63 <= iv < 2 ** 63
            except (TypeError, ValueError, OverflowError):
                ok = False
            if not ok:
                _bad_scalar(spec, p, v, "a 64-bit integer")
            a.i = iv
        else:
            a.kind = _lib.TK_ARG_F64
            try:
                a.f = float(v)
            except (TypeError, ValueError):
                _bad_scalar(spec, p, v, "a number")
        nargs += 1
    stream = None
    if device is not None and device[0][0] == _lib.TK_DEV_CUDA and device[1]:
        stream = _tensor.cuda_stream(device[0][1])
    ctx = ctx or _lib.current_context()
    impl = ctypes.c_char_p()
    rc = _lib.tk_op_run(ctx.handle, spec.cname, args, nargs, stream, ctypes.byref(impl))
    if rc != 0:
        raise _lib.error(rc)
    return impl.value.decode() if impl.value else None


def _bad_scalar(spec, p, v, want):
    raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "%s: '%s' must be %s, got %r" % (spec.name, p.name, want, v))


def run(name, *args, **kwargs):
    """Runs op `name` with tk's parameter names and order; returns the implementation that ran."""
    spec = _spec(name)
    return _run_values(spec, _bind(spec, args, kwargs))


def _bind(spec, args, kwargs):
    values = list(args) + [None] * (len(spec.params) - len(args))
    for k, v in kwargs.items():
        idx = next((i for i, p in enumerate(spec.params) if k in (p.name, p.pyname)), None)
        if idx is None:
            raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "%s: no parameter named '%s' (parameters: %s)" % (
                spec.name, k, ", ".join(p.name for p in spec.params)))
        if idx < len(args):
            raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "%s: argument '%s' given twice" % (spec.name, k))
        values[idx] = v
    return values


# ---- torch.library ----------------------------------------------------------------------------

def _last_required(spec):
    return max([i for i, p in enumerate(spec.params) if not p.optional], default=-1)


def _schema(spec):
    # Defaults only after the last required parameter (a schema has no required argument after a
    # default one); an optional tensor before it is "Tensor?" without a default (None is passed).
    parts = []
    alias = 0
    last = _last_required(spec)
    for i, p in enumerate(spec.params):
        dflt = p.optional and i > last
        if p.kind == "tensor":
            if p.out:
                t = "Tensor(a%d!)" % alias
                alias += 1
            else:
                t = "Tensor"
            parts.append("%s%s %s%s" % (t, "?" if p.optional else "", p.pyname, "=None" if dflt else ""))
        elif p.kind == "i64":
            d = "=%d" % int(p.default) if dflt and p.default is not None else ""
            parts.append("int %s%s" % (p.pyname, d))
        else:
            d = "=%r" % float(p.default) if dflt and p.default is not None else ""
            parts.append("float %s%s" % (p.pyname, d))
    return "(%s) -> ()" % ", ".join(parts)


def _register_torch(spec):
    """torch.ops.tk.<name>: a custom op whose real implementation is tk_op_run and whose fake one does
    nothing (every output is an argument it mutates, so there are no shapes to infer)."""
    torch = _tensor.torch
    qualname = "tk::" + spec.name
    try:
        op = torch.library.custom_op(qualname, lambda *a: _run_values(spec, a) and None,
                                     mutates_args=tuple(p.pyname for p in spec.outs), schema=_schema(spec))
        op.register_fake(lambda *a: None)
    except RuntimeError:
        # registered already in this process (a reloaded module): use it as it is
        pass
    return getattr(torch.ops.tk, spec.name)


# ---- the generated Python functions -----------------------------------------------------------

_REQUIRED = object()


def function(name):
    """The Python function of op `name` (generated once)."""
    f = _funcs.get(name)
    if f is not None:
        return f
    spec = _spec(name)
    with _lock:
        f = _funcs.get(name)
        if f is None:
            f = _funcs[name] = _generate(spec)
    return f


def _generate(spec):
    ps = spec.params
    decl = []
    seen_default = False
    for p in ps:
        if p.optional:
            d = "None" if p.kind == "tensor" or p.default is None else repr(
                int(p.default) if p.kind == "i64" else float(p.default))
            decl.append("%s=%s" % (p.pyname, d))
            seen_default = True
        else:
            # a required parameter after an optional one: tk reports it if it is left out
            decl.append("%s=_REQUIRED" % p.pyname if seen_default else p.pyname)
    names = ", ".join(p.pyname for p in ps)
    tensors = ", ".join(p.pyname for p in ps if p.kind == "tensor")
    outs = [p.pyname for p in spec.outs]
    ret = outs[0] if len(outs) == 1 else "(%s)" % ", ".join(outs) + ("," if len(outs) == 1 else "")
    if not outs:
        ret = "None"
    g = {"_REQUIRED": _REQUIRED, "_via_torch_op": _tensor.via_torch_op, "_plain": _plain(spec), "_top": None}
    if _tensor.torch is not None:
        g["_top"] = _register_torch(spec)
    req = [p.pyname for i, p in enumerate(ps) if not p.optional and seen_before(ps, i)]
    check = "".join("    if {n} is _REQUIRED: _missing({n!r})\n".format(n=n) for n in req)
    g["_missing"] = _missing(spec)
    src = ("def {name}({decl}):\n" + check +
           "    if _via_torch_op({tensors}):\n"
           "        _top({names})\n"
           "    else:\n"
           "        _plain({names})\n"
           "    return {ret}\n").format(name=spec.name, decl=", ".join(decl), tensors=tensors, names=names, ret=ret)
    exec(compile(src, "<tk op %s>" % spec.name, "exec"), g)
    f = g[spec.name]
    f.__doc__ = "%s\n\n%s\n\nOutputs are written in place and returned.\n" % (spec.signature, spec.summary)
    f.__module__ = __name__
    f.__qualname__ = spec.name
    f.tk_spec = spec
    return f


def seen_before(ps, i):
    """1 when an optional parameter comes before parameter i (i then has the _REQUIRED default)."""
    return any(p.optional for p in ps[:i])


def _missing(spec):
    def missing(name):
        raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "%s: missing argument '%s'\nHINT: the signature is %s"
                                        % (spec.name, name, spec.signature))
    return missing


def _plain(spec):
    def run_plain(*values):
        _run_values(spec, [None if v is _REQUIRED else v for v in values])
    return run_plain


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    if _find(name) is None:
        raise AttributeError("tk.ops has no op '%s' ('tk ops' lists them)" % name)
    return function(name)


def __dir__():
    return sorted(list(globals()) + names())
