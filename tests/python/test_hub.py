"""get_kernel and friends from Python, against the real default registry (file:// under build/) and a
registry published here with a key tk does not trust; and errors as Python exceptions carrying tk's
message and hint. Each test runs in its own TK_HOME (run.py)."""
import json
import os
import shutil
import subprocess
import tempfile

from harness import ROOT, TK, Skip, need_torch, tk_json

torch = need_torch()
import numpy as np  # noqa: E402

import tk  # noqa: E402


def test_seed_example():
    # the Hugging Face kernels example, verbatim except for the import line
    from tk import get_kernel
    x = torch.randn((10, 10), dtype=torch.float16)
    y = torch.empty_like(x)
    activation = get_kernel("kernels-community/activation")
    activation.gelu_fast(y, x)
    xf = x.float()
    ref = 0.5 * xf * (1 + torch.tanh(0.7978845608028654 * xf * (1 + 0.044715 * xf * xf)))
    assert (y.float() - ref).abs().max() <= 2e-3 * ref.abs().max() + 1e-3
    # installed and verified as `tk get` would: the C tool sees it, at the same commit
    info = tk_json("info", "kernels-community/activation")
    assert info["commit"] == activation.commit and info["version"] == activation.version
    assert subprocess.run([TK, "verify", "kernels-community/activation"], capture_output=True).returncode == 0


def test_version_revision_has_kernel_list_lock():
    a1 = tk.get_kernel("kernels-community/activation", version=1)
    a2 = tk.get_kernel("kernels-community/activation", revision=a1.commit)
    assert a1.commit == a2.commit and a1.major == 1
    assert tk.has_kernel("kernels-community/softmax")
    assert not tk.has_kernel("kernels-community/no-such-package")
    assert not tk.has_kernel("kernels-community/activation", version=99)
    assert tk.has_kernel("kernels-community/activation", version=1)
    assert tk.has_kernel("kernels-community/activation", revision=a1.commit)
    assert tk.has_kernel("kernels-community/activation", revision="v1")
    assert not tk.has_kernel("kernels-community/activation", revision="0" * 40)
    # has_kernel installs nothing: softmax was only asked about
    names = sorted(p["name"] for p in tk.list_installed())
    assert names == ["kernels-community/activation"], names
    tk.get_kernel("kernels-community/softmax")
    names = sorted(p["name"] for p in tk.list_installed())
    assert names == ["kernels-community/activation", "kernels-community/softmax"], names
    # the same list the C tool prints
    assert sorted(p["name"] for p in tk_json("list")) == names
    d = tempfile.mkdtemp()
    try:
        path = tk.lock(os.path.join(d, "tk.lock"))
        lock = json.load(open(path))
        text = json.dumps(lock)
        assert a1.commit in text and a1.manifest_sha256 in text, text
        # a fresh home installs exactly the locked commits
        home2 = os.path.join(d, "home2")
        with tk.Context(home=home2) as ctx:
            got = tk.install_locked(path, context=ctx)
            assert sorted(got) == names, got
            assert sorted(p["name"] for p in tk.list_installed(context=ctx)) == names
    finally:
        shutil.rmtree(d)


def test_bad_references():
    for bad, exc, text in (("kernels-community/activation@1", tk.InvalidArgumentError, "repo_id must be"),
                           ("kernels-community/nope", tk.NotFoundError, "nope")):
        try:
            tk.get_kernel(bad)
            raise AssertionError("%s was accepted" % bad)
        except exc as e:
            assert text in str(e), str(e)
            assert isinstance(e, tk.TkError) and e.status < 0 and e.status_name
    try:
        tk.get_kernel("kernels-community/activation", version="latest")
        raise AssertionError("version='latest' was accepted")
    except tk.InvalidArgumentError as e:
        assert "integer majors" in e.hint


def test_untrusted_signer():
    d = tempfile.mkdtemp()
    try:
        key = os.path.join(d, "k.pem")
        subprocess.run([TK, "keygen", key], check=True, capture_output=True)
        pkg = os.path.join(d, "pkg")
        shutil.copytree(os.path.join(ROOT, "kernels-src", "activation"), pkg)
        kj = json.load(open(os.path.join(pkg, "kernel.json")))
        kj["name"] = "acme/activation"
        json.dump(kj, open(os.path.join(pkg, "kernel.json"), "w"))
        reg = os.path.join(d, "reg")
        subprocess.run([TK, "publish", pkg, "--to", reg, "--key", key, "-q"], check=True, capture_output=True,
                       env=dict(os.environ, TK_HOME=os.path.join(d, "pubhome")))
        with tk.Context(endpoint="file://" + reg) as ctx:
            try:
                tk.get_kernel("acme/activation", context=ctx)
                raise AssertionError("an untrusted signer was accepted")
            except tk.UntrustedError as e:
                assert "not trusted for org 'acme'" in e.message, e.message
                assert e.hint and "tk trust add acme" in e.hint, e.hint
                assert e.status == -5 and e.status_name
            assert tk.list_installed(context=ctx) == []  # nothing installed
            m = tk.get_kernel("acme/activation", trust=True, context=ctx)
            x = torch.randn(3, 8)
            y = torch.empty(3, 4)
            m.silu_and_mul(y, x)
            assert torch.allclose(y, torch.nn.functional.silu(x[:, :4]) * x[:, 4:], atol=1e-6)
    finally:
        shutil.rmtree(d)


def test_op_errors_are_exceptions():
    act = tk.get_kernel("kernels-community/activation")
    norm = tk.get_kernel("kernels-community/rmsnorm")
    cases = [
        (lambda: act.silu_and_mul(torch.empty(4, 4), torch.randn(4, 7)), tk.InvalidArgumentError,
         "silu_and_mul: 'input' has shape [4, 7]"),
        (lambda: act.gelu(torch.empty(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)),
         tk.InvalidArgumentError, "has dtype i32, want f32, f16 or bf16"),
        (lambda: act.gelu(torch.empty(4, dtype=torch.float16), torch.randn(4)), tk.InvalidArgumentError,
         "want f32 (the dtype of"),
        (lambda: norm.rms_norm(torch.empty(2, 8), torch.randn(2, 8), torch.ones(7)), tk.InvalidArgumentError,
         "rms_norm: 'weight'"),
        (lambda: act.gelu(torch.empty(4, dtype=torch.complex64), torch.randn(4)), tk.InvalidArgumentError,
         "tk has no name for"),
        (lambda: act.gelu(torch.empty(4), [1.0, 2.0]), tk.InvalidArgumentError, "not a tensor"),
        # a bad scalar: tk's check (numpy, eager torch), torch's schema check (torch.ops.tk)
        (lambda: act.fatrelu_and_mul(np.zeros((2, 2), np.float32), np.ones((2, 4), np.float32), "x"),
         tk.InvalidArgumentError, "'threshold' must be a number"),
        (lambda: act.fatrelu_and_mul(torch.empty(2, 2), torch.randn(2, 4), "x"), tk.InvalidArgumentError,
         "'threshold' must be a number"),
        (lambda: torch.ops.tk.fatrelu_and_mul(torch.empty(2, 2), torch.randn(2, 4), "x"), RuntimeError,
         "argument 'threshold'"),
        (lambda: torch.ops.tk.silu_and_mul(torch.empty(4, 4), torch.randn(4, 7)), tk.InvalidArgumentError,
         "silu_and_mul: 'input' has shape [4, 7]"),
        (lambda: tk.ops.run("silu_and_mull", torch.empty(1)), tk.NotFoundError, "did you mean 'silu_and_mul'"),
        (lambda: tk.ops.silu_and_mul(torch.empty(2, 2)), TypeError, "missing 1 required positional argument"),
        (lambda: tk.ops.run("silu_and_mul", torch.empty(2, 2)), tk.InvalidArgumentError, "missing argument 'input'"),
        (lambda: tk.ops.silu_and_mul(torch.empty(2, 2), torch.randn(2, 4), bogus=1), TypeError, "bogus"),
        (lambda: tk.ops.run("silu_and_mul", torch.empty(2, 2), torch.randn(2, 4), bogus=1),
         tk.InvalidArgumentError, "no parameter named 'bogus'"),
    ]
    if torch.cuda.is_available():
        cases.append((lambda: act.gelu(torch.empty(4, device="cuda"), torch.randn(4)), tk.InvalidArgumentError,
                      "is on cpu but"))
    for i, (f, exc, text) in enumerate(cases):
        try:
            f()
            raise AssertionError("case %d: no error (want %s)" % (i, text))
        except exc as e:
            assert text in str(e), "case %d: %r lacks %r" % (i, str(e), text)
    # the missing-argument hint carries the signature
    try:
        tk.ops.run("silu_and_mul", torch.empty(2, 2))
    except tk.InvalidArgumentError as e:
        assert e.hint and "silu_and_mul(out:" in e.hint, e.hint
    # a failed call leaves the output as it was
    y = torch.full((4, 4), 7.0)
    try:
        act.silu_and_mul(y, torch.randn(4, 7))
    except tk.InvalidArgumentError:
        pass
    assert torch.equal(y, torch.full((4, 4), 7.0))


def test_no_gpu_error():
    """Without a GPU, tk's own CUDA path reports 'no device' as NoDeviceError: loading the package's
    kernels for a device needs a driver."""
    if tk.device_count() > 0:
        raise Skip("a GPU is present: the no-device error cannot happen here")
    # torch cannot make CUDA tensors without a GPU, so describe a CUDA tensor through DLPack's layout
    import ctypes
    from tk import _lib
    buf = (ctypes.c_float * 8)()
    shape = (ctypes.c_int64 * 1)(8)
    t = _lib.Tensor(ctypes.cast(buf, ctypes.c_void_p), _lib.Device(_lib.TK_DEV_CUDA, 0), 1, _lib.Dtype(2, 32, 1),
                    shape, None, 0)
    args = (_lib.Arg * 2)(_lib.Arg(0, b"out", ctypes.pointer(t), 0, 0), _lib.Arg(0, b"input", ctypes.pointer(t), 0, 0))
    tk.get_kernel("kernels-community/activation")
    rc = _lib.tk_op_run(tk.current_context().handle, b"gelu", args, 2, None, None)
    e = _lib.error(rc)
    assert isinstance(e, (tk.NoDeviceError, tk.UnsupportedError)), (type(e), str(e))
    assert e.message, str(e)


def test_meta_tensors_go_through_the_fake_op():
    """Tensors without memory (meta) take the torch.ops path, whose fake implementation runs."""
    act = tk.get_kernel("kernels-community/activation")
    y = torch.empty(4, 8, device="meta")
    assert act.silu_and_mul(y, torch.empty(4, 16, device="meta")) is y


def test_dlpack_numpy():
    """Non-torch tensors through DLPack: numpy arrays, zero-copy in and out."""
    act = tk.get_kernel("kernels-community/activation")
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    y = np.zeros((4, 8), np.float32)
    r = act.silu_and_mul(y, x)
    assert r is y
    a, b = x[:, :8].astype(np.float64), x[:, 8:]
    assert np.abs(y - a / (1 + np.exp(-a)) * b).max() < 1e-5
    # strided numpy views work too (tk reads strides)
    big = np.linspace(-3, 3, 128, dtype=np.float32).reshape(8, 16)
    out = np.zeros((4, 16), np.float32)
    act.gelu_quick(out, big[::2])
    v = big[::2].astype(np.float64)
    assert np.abs(out - v / (1 + np.exp(-1.702 * v))).max() < 1e-5
    try:
        ro = np.zeros((4, 8), np.float32)
        ro.flags.writeable = False
        act.silu_and_mul(ro, x)
        raise AssertionError("a read-only output was accepted")
    except tk.InvalidArgumentError as e:
        assert "__dlpack__" in str(e)


def test_new_ops_need_no_code():
    """The functions come from tk_ops_json: every op the library lists is in tk.ops with its parameter
    names and defaults in order."""
    import inspect
    listed = tk.current_context().ops_json()
    std = [o for o in listed if o.get("standard")]
    assert tk.ops.names() == [o["name"] for o in std]
    for o in std:
        f = getattr(tk.ops, o["name"])
        ps = list(inspect.signature(f).parameters.values())
        assert [p.name.rstrip("_") for p in ps] == [p["name"] for p in o["params"]], o["name"]
        for p, j in zip(ps, o["params"]):
            if j["kind"] != "tensor" and j.get("optional"):
                assert float(p.default) == float(j["default"]), (o["name"], p.name)
        assert hasattr(torch.ops.tk, o["name"])


def test_layers_like_hf_kernels():
    """activation.layers.SiluAndMul()(x) as Hugging Face kernels' layers: out-of-place modules over the
    package's elementwise ops, named as the Hub's activation package names them."""
    act = tk.get_kernel("kernels-community/activation")
    for name in ("SiluAndMul", "MulAndSilu", "GeluAndMul", "GeluTanhAndMul", "FatreluAndMul", "FastGELU",
                 "NewGELU", "QuickGELU"):
        assert issubclass(getattr(act.layers, name), torch.nn.Module), name
    x = torch.randn(3, 5, 16, dtype=torch.bfloat16)
    y = act.layers.SiluAndMul()(x)
    assert y.shape == (3, 5, 8) and y.dtype == torch.bfloat16
    xf = x.float()
    assert (y.float() - torch.nn.functional.silu(xf[..., :8]) * xf[..., 8:]).abs().max() < 5e-2
    z = act.layers.FatreluAndMul(threshold=0.5)(x)
    ref = torch.where(xf[..., :8] > 0.5, xf[..., :8], torch.zeros(())) * xf[..., 8:]
    assert (z.float() - ref).abs().max() < 5e-2
    q = act.layers.QuickGELU()(xf)
    assert q.shape == xf.shape and (q - xf * torch.sigmoid(1.702 * xf)).abs().max() < 1e-5
    assert sorted(vars(tk.get_kernel("kernels-community/softmax").layers)) == ["LogSoftmax", "Softmax"]


def test_threads_each_get_a_context():
    """Calls from several threads at once: each thread has its own tk context (tk.h: one thread per
    context), and every result is right."""
    import threading
    act = tk.get_kernel("kernels-community/activation")
    errors, ctxs = [], []  # the contexts themselves: kept alive, their ids cannot be reused

    def work(seed):
        try:
            g = torch.Generator().manual_seed(seed)
            for _ in range(50):
                x = torch.randn(7, 64, generator=g)
                y = torch.empty(7, 32)
                act.silu_and_mul(y, x)
                if not torch.allclose(y, torch.nn.functional.silu(x[:, :32]) * x[:, 32:], atol=1e-6):
                    errors.append("thread %d: wrong result" % seed)
            ctxs.append(tk.current_context())
        except Exception as e:  # reported below
            errors.append("thread %d: %r" % (seed, e))
    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert len(set(map(id, ctxs))) == 4, ctxs
