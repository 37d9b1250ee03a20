"""The package as users install it: a wheel built from python/ bundles libtk.so.0, installs with pip
into a fresh directory, and works there with no checkout on the path; and without a library, import
fails with an error that says what to do. Built from a copy of python/, so the checkout is not written."""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from harness import B, ROOT, Skip

SEED = r"""
import os, sys, torch
import tk
from tk import get_kernel
assert tk.library_path.startswith(os.environ["SITE"]), tk.library_path
x = torch.randn((10, 10), dtype=torch.float16)
y = torch.empty_like(x)
activation = get_kernel("kernels-community/activation")
activation.gelu_fast(y, x)
xf = x.float()
ref = 0.5 * xf * (1 + torch.tanh(0.7978845608028654 * xf * (1 + 0.044715 * xf * xf)))
assert (y.float() - ref).abs().max() < 1e-2
print("ok", tk.__version__, activation.version)
"""


def _pip_ok():
    try:
        import setuptools  # noqa: F401
    except ImportError:
        raise Skip("setuptools is not in the test venv (scripts/setup.sh --test installs it)")


def test_wheel_installs_and_runs():
    _pip_ok()
    d = tempfile.mkdtemp()
    try:
        src = os.path.join(d, "src")
        shutil.copytree(os.path.join(ROOT, "python"), os.path.join(src, "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "_lib"))
        os.makedirs(os.path.join(src, "include"))
        shutil.copy(os.path.join(ROOT, "include", "tk.h"), os.path.join(src, "include"))
        env = dict(os.environ, TK_LIBRARY=os.path.join(B, "libtk.so.0"), PIP_DISABLE_PIP_VERSION_CHECK="1")
        wheels = os.path.join(d, "wheels")
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                            wheels, os.path.join(src, "python")], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        (whl,) = os.listdir(wheels)
        assert whl.startswith("tk_kernels-") and "linux" in whl, whl  # platform-tagged: it holds a .so
        names = zipfile.ZipFile(os.path.join(wheels, whl)).namelist()
        assert "tk/_lib/libtk.so.0" in names and "tk/ops.py" in names, names
        site = os.path.join(d, "site")
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site,
                            os.path.join(wheels, whl)], capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        env = {k: v for k, v in os.environ.items() if k not in ("TK_LIBRARY", "PYTHONPATH", "TK_BUILD")}
        env.update(PYTHONPATH=site, SITE=site, TK_HOME=os.path.join(d, "home"))
        p = subprocess.run([sys.executable, "-c", SEED], capture_output=True, text=True, env=env, cwd=d)
        assert p.returncode == 0 and p.stdout.startswith("ok"), p.stdout + p.stderr
    finally:
        shutil.rmtree(d)


def test_missing_library_is_a_clear_import_error():
    d = tempfile.mkdtemp()
    try:
        env = dict(os.environ, TK_LIBRARY=os.path.join(d, "nope", "libtk.so.0"), PYTHONPATH=os.path.join(ROOT, "python"))
        p = subprocess.run([sys.executable, "-c", "import tk"], capture_output=True, text=True, env=env, cwd=d)
        assert p.returncode != 0
        assert "cannot load libtk.so.0" in p.stderr and "HINT: build it with 'make lib'" in p.stderr, p.stderr
    finally:
        shutil.rmtree(d)
