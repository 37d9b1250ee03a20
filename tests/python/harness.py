"""Helpers for the Python tests: Skip, the tk binary, a closeness check that names the worst element,
and the oracle that recreates `tk run-op`'s random inputs so an op called from Python can be compared
bit for bit with the same op run by the C tool (tk_op_run from C) on the same bytes."""
import json
import os
import subprocess

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B = os.path.join(ROOT, os.environ.get("TK_BUILD", "build"))
TK = os.path.join(B, "tk")


class Skip(Exception):
    pass


def need_torch():
    try:
        import torch
        return torch
    except ImportError:
        if os.environ.get("CI") == "true":
            raise AssertionError("torch is not installed in the test venv (CI=true: a failure, not a skip)")
        raise Skip("torch is not installed")


TOL = {"f32": (1e-5, 1e-5), "f16": (2e-3, 2e-3), "bf16": (1.6e-2, 1.6e-2)}


def close(got, ref, dt="f32", what="", atol=None, rtol=None):
    """|got-ref| <= atol + rtol*|ref| elementwise (computed in float64); raises naming the worst one."""
    import torch
    a, r = TOL[dt]
    atol = a if atol is None else atol
    rtol = r if rtol is None else rtol
    g = got.detach().to("cpu", torch.float64)
    f = ref.detach().to("cpu", torch.float64)
    assert g.shape == f.shape, "%s: shape %s, want %s" % (what, tuple(g.shape), tuple(f.shape))
    err = (g - f).abs() - (atol + rtol * f.abs())
    if g.numel() and err.max() > 0:
        i = int(err.argmax())
        raise AssertionError("%s [%s]: element %d is %.8g, want %.8g (|diff| %.3g > %.3g + %.3g*|ref|)" % (
            what, dt, i, g.flatten()[i], f.flatten()[i], abs(g.flatten()[i] - f.flatten()[i]), atol, rtol))


def tk_json(*args, env=None):
    p = subprocess.run([TK, "--json"] + list(args), capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError("tk %s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()))
    return json.loads(p.stdout)


def fnv1a64(b):
    """FNV-1a over bytes (numpy for speed: fold 8 bytes at a time is not FNV, so this is bytewise)."""
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def tensor_bytes(t):
    import torch
    t = t.detach().contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().tobytes()
    if t.element_size() == 1 and t.dtype not in (torch.int8, torch.uint8):
        return t.view(torch.uint8).numpy().tobytes()
    return t.numpy().tobytes()


# ---- tk run-op's inputs, recreated -----------------------------------------------------------

G = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(seed, start, n):
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (np.arange(start + 1, start + n + 1, dtype=np.uint64) * G)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _torch_dtype(name):
    import torch
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
            "i8": torch.int8, "u8": torch.uint8, "i32": torch.int32, "i64": torch.int64,
            "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[name]


def run_op_inputs(op, ops_json, result, dtype, named_dtypes, int_args, seed):
    """The tensors `tk run-op` made for `result` (its --json output), as torch tensors by name, in the
    same order and with the same bytes: splitmix64 per element across the tensors in parameter order."""
    import torch
    params = {p["name"]: p for p in ops_json[op]["params"]}

    def pick(p):
        while p.get("dtype_like"):
            p = params[p["dtype_like"]]
        return dtype if dtype in p["dtypes"] else p["dtypes"][0]

    out = {}
    k0 = 0
    for t in result["tensors"]:
        p = params[t["name"]]
        dt = named_dtypes.get(t["name"]) or pick(p)
        shape = t["shape"]
        n = int(np.prod(shape)) if shape else 1
        r = _splitmix(seed, k0, n)
        k0 += n
        is_out = t["role"] == "out"
        if dt in ("i64", "i32", "i8", "u8") and dt in ("i64", "i32"):
            iv = np.zeros(n, np.int64) if is_out else (
                np.full(n, int_args[t["name"]], np.int64) if t["name"] in int_args else np.arange(n, dtype=np.int64))
            x = torch.from_numpy(iv.astype(np.int64 if dt == "i64" else np.int32))
        elif dt in ("i8", "u8"):
            if is_out:
                codes = np.zeros(n, np.uint8)
            elif dt == "i8":
                codes = ((r % np.uint64(255)).astype(np.int64) - 127).astype(np.uint8)
            else:
                codes = (r % np.uint64(256)).astype(np.uint8)
            x = torch.from_numpy(codes.view(np.int8 if dt == "i8" else np.uint8).copy())
        elif dt in ("fp8_e4m3", "fp8_e5m2"):
            codes = ((r & np.uint64(0x80)) | (r % np.uint64(0x40))).astype(np.uint8)
            x = torch.from_numpy(codes).view(_torch_dtype(dt))
        else:
            v = ((r >> np.uint64(11)).astype(np.float64) * 2.0 ** -53 * 6.0 - 3.0).astype(np.float32)
            if not is_out and t["name"] in int_args:  # --arg NAME=V on a float input: every element V
                v = np.full(n, int_args[t["name"]], np.float64 if dt == "f64" else np.float32)
            x = torch.from_numpy(v.astype(np.float64) if dt == "f64" else v).to(_torch_dtype(dt))
        out[t["name"]] = x.reshape(shape)
    return out
