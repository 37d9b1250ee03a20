"""An op that a package declares (kernel.json "ops"), through the Python bridge: tests/data/opdecl
declares scale_add(out, x, y, alpha = 1) and implements it for f32. Installed from a registry
published here, or added as a package directory, it is a tk.ops function with its parameter names
and default, a torch.ops.tk op, and its calls are checked (shapes, dtypes) against the declared
signature. It has no CPU reference: host tensors get an UnsupportedError that says so. On a GPU the
package's kernel runs and is compared with alpha * x + y (skipped without one)."""
import inspect
import os
import shutil
import subprocess
import tempfile

from harness import ROOT, TK, Skip, close, need_torch

torch = need_torch()

import tk  # noqa: E402

PKG = os.path.join(ROOT, "tests", "data", "opdecl")


def _install():
    """Publishes tests/data/opdecl to a scratch registry and installs it into this test's TK_HOME."""
    d = tempfile.mkdtemp(prefix="tk-opdecl-")
    key, reg = os.path.join(d, "k.key"), os.path.join(d, "reg")
    env = dict(os.environ, TK_HOME=os.path.join(d, "pubhome"))
    subprocess.run([TK, "keygen", key], check=True, capture_output=True, env=env)
    subprocess.run([TK, "publish", PKG, "--to", reg, "--key", key, "-q"], check=True, capture_output=True, env=env)
    env = dict(os.environ, TK_ENDPOINT="file://" + reg)
    subprocess.run([TK, "trust", "add", "test-org", open(key + ".pub").read().strip(), "-q"], check=True,
                   capture_output=True, env=env)
    subprocess.run([TK, "get", "test-org/scale-add", "-q"], check=True, capture_output=True, env=env)
    return d


def _tensors(device="cpu", dtype=torch.float32, shape=(4, 8)):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g).to(device, dtype)
    y = torch.randn(*shape, generator=g).to(device, dtype)
    return torch.empty_like(x), x, y


def _expect(exc, text, f, *args):
    try:
        f(*args)
    except exc as e:
        assert text in str(e), "%r lacks %r" % (str(e), text)
        return
    raise AssertionError("no %s (%s)" % (exc.__name__, text))


def test_installed_declared_op_is_a_function():
    tk.ops.names()  # read (and cached) before the package is installed
    d = _install()
    try:
        # get_kernel reads the ops again for an op it does not know (the installed package declares it)
        m = tk.get_kernel("test-org/scale-add")
        assert m.ops == ["scale_add"] and not m.other_ops, (m.ops, m.other_ops)
        assert "scale_add" in tk.ops.names()
        f = tk.ops.scale_add
        assert [p.name for p in inspect.signature(f).parameters.values()] == ["out", "x", "y", "alpha"]
        assert inspect.signature(f).parameters["alpha"].default == 1.0
        assert "T[..., n]" in tk.ops.signature("scale_add")
        assert f.tk_spec.declared_by == "test-org/scale-add"
        assert hasattr(torch.ops.tk, "scale_add")
        out, x, y = _tensors()
        # checked against the declared signature before anything runs
        _expect(tk.InvalidArgumentError, "'y' has shape [4, 6], want [..., n] with n = 8", f, out, x, y[:, :6])
        _expect(tk.InvalidArgumentError, "has dtype bf16, want f32 or f16", f, *_tensors(dtype=torch.bfloat16))
        _expect(tk.InvalidArgumentError, "'y' has dtype f16, want f32 (the dtype of 'x')", f, out, x, y.half())
        # the shapes fit: no CPU reference, named as missing
        _expect(tk.UnsupportedError, "no CPU reference for op scale_add (declared by test-org/scale-add)", f, out, x,
                y, 2.0)
    finally:
        shutil.rmtree(d, ignore_errors=True)
        # not reset here: the next test, in another home and context, must not see scale_add


def test_package_directory_adds_its_op():
    assert "scale_add" not in tk.ops.names()
    try:
        tk.ops.add_package(PKG)
        assert "scale_add" in tk.ops.names()
        out, x, y = _tensors()
        _expect(tk.UnsupportedError, "no CPU reference for op scale_add", tk.ops.scale_add, out, x, y)
        _expect(tk.NotFoundError, "is not a directory", tk.ops.add_package, os.path.join(PKG, "nope"))
    finally:
        tk.ops._specs = None


def test_declared_op_runs_its_kernel_on_cuda():
    if not torch.cuda.is_available() or tk.device_count() < 1:
        raise Skip("no CUDA device")
    d = _install()
    try:
        out, x, y = _tensors("cuda")
        impl = tk.ops.run("scale_add", out, x, y, 0.5)
        assert impl == "test-org/scale-add:scale_add_f32", impl
        close(out, 0.5 * x + y, "f32", "scale_add")
    finally:
        shutil.rmtree(d, ignore_errors=True)
        tk.ops._specs = None
