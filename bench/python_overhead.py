"""Per-call cost of a tk op from Python on tiny CPU tensors (gelu_fast on 10x10 f32), so the figure is
the overhead of the path, not compute: tk_op_run alone (validation, dispatch, the CPU reference),
describing the tensors, the whole package function (eager torch tensors, numpy through DLPack), the
torch.library op (the path torch.compile uses), and PyTorch's own gelu for scale.

usage: PYTHONPATH=python python bench/python_overhead.py   (prints Markdown table rows)
"""
import os
import statistics
import tempfile
import time

import torch

os.environ.setdefault("TK_HOME", tempfile.mkdtemp())
import tk  # noqa: E402
from tk import _lib, _tensor  # noqa: E402


def per_call_us(f, n=5000):
    for _ in range(200):
        f()
    runs = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n):
            f()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


act = tk.get_kernel("kernels-community/activation")
torch.set_num_threads(1)
x = torch.randn(10, 10)
y = torch.empty_like(x)
xn, yn = x.numpy(), y.numpy()
dy, dx = _tensor.describe(y, "out"), _tensor.describe(x, "input")
args = (_lib.Arg * 2)(_lib.Arg(0, b"out", dy.pointer(), 0, 0), _lib.Arg(0, b"input", dx.pointer(), 0, 0))
h = tk.current_context().handle
cases = [
    ("tk_op_run alone (ctypes call, prebuilt arguments)", lambda: _lib.tk_op_run(h, b"gelu_fast", args, 2, None, None)),
    ("describing the two torch tensors", lambda: (_tensor.describe(y, "out"), _tensor.describe(x, "input"))),
    ("activation.gelu_fast(y, x), torch tensors, eager", lambda: act.gelu_fast(y, x)),
    ("activation.gelu_fast(yn, xn), numpy arrays (DLPack)", lambda: act.gelu_fast(yn, xn)),
    ("torch.ops.tk.gelu_fast(y, x) (the torch.compile path)", lambda: torch.ops.tk.gelu_fast(y, x)),
    ("torch.ops.aten.gelu.out(x, approximate='tanh', out=y)", lambda: torch.ops.aten.gelu.out(x, approximate="tanh", out=y)),
]
for name, f in cases:
    print("| %s | %.1f us |" % (name, per_call_us(f)))
