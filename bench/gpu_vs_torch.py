#!/usr/bin/env python3
"""gpu_vs_torch.py — tk's kernels against PyTorch in one process: ctypes over libtk plus torch.

On a GPU (scripts/gpu-check.sh runs it from the bundle):
  python3 bench/gpu_vs_torch.py --lib build-gpu/libtk.so.0 --csv bench.csv --json bench.json
measures, each as a ratio in one run, with the largest error against a float32 torch reference:
  - the ceiling: a device-to-device copy (bytes read + written)
  - memory-bound ops, GB/s of tk vs the torch equivalent vs the copy: activations, norms, rotary,
    softmax, cross-entropy, argmax, paged_kv_append, attention_decode, casted embedding, casted
    linear at M = 1 (a GEMV; torch: F.linear on the dequantised bf16 weight)
  - attention prefill TFLOP/s (bf16, causal and not, D 64/128, S 1k-16k) and its backward vs
    F.scaled_dot_product_attention; fused_linear_cross_entropy vs F.linear + F.cross_entropy
  - tk's host overhead per tk_op_run (a tiny op, no sync between calls) vs torch's per call
Times: CUDA events, a warm-up (JIT compile, autotune), then the median of --reps runs rotating over
input sets larger than L2. Outputs are compared with a float32 reference; a relative error above the
dtype's bound marks the row MISMATCH and the exit status 1.

Without a GPU, --cpu-check runs the same bindings and the same torch equivalents on small CPU tensors
(tk runs its CPU references): it checks the ctypes structs, every op's argument names and the torch
formulas, not speed (tests/cli/gpu_bench.sh runs it in `make test`).
"""
import argparse
import csv
import ctypes
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

# ---- the ctypes binding (include/tk.h) ------------------------------------------------------------

TK_DEV_CPU, TK_DEV_CUDA = 1, 2
TK_ARG_TENSOR, TK_ARG_I64, TK_ARG_F64 = 0, 1, 2
DTYPES = {  # torch dtype -> (DLPack code, bits)
    torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16), torch.float64: (2, 64),
    torch.int32: (0, 32), torch.int64: (0, 64), torch.int8: (0, 8), torch.uint8: (1, 8),
    torch.float8_e4m3fn: (10, 8), torch.float8_e5m2: (12, 8),
}


class Dtype(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32), ("dtype", Dtype),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class Arg(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("t", ctypes.POINTER(Tensor)),
                ("i", ctypes.c_int64), ("f", ctypes.c_double)]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64)


class CtxOpts(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("home", ctypes.c_char_p), ("endpoint", ctypes.c_char_p),
                ("token", ctypes.c_char_p), ("offline", ctypes.c_int), ("log", LOG_FN),
                ("log_user", ctypes.c_void_p), ("progress", PROGRESS_FN), ("progress_user", ctypes.c_void_p)]


class TkError(RuntimeError):
    pass


class TK:
    """A tk context over libtk.so through ctypes. op(name, **args) runs tk_op_run: tensors by name,
    ints and floats as scalars; returns the implementation that ran ("org/name:kernel")."""

    def __init__(self, lib, home, verbose=False):
        self.lib = ctypes.CDLL(lib)
        L = self.lib
        L.tk_ctx_new.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(CtxOpts)]
        L.tk_ctx_free.argtypes = [ctypes.c_void_p]
        L.tk_ctx_endpoint.argtypes = [ctypes.c_void_p]
        L.tk_ctx_endpoint.restype = ctypes.c_char_p
        L.tk_last_error.restype = ctypes.c_char_p
        L.tk_status_str.argtypes = [ctypes.c_int]
        L.tk_status_str.restype = ctypes.c_char_p
        L.tk_version_string.restype = ctypes.c_char_p
        L.tk_pkg_get.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        L.tk_pkg_free.argtypes = [ctypes.c_void_p]
        L.tk_op_run.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(Arg), ctypes.c_size_t,
                                ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)]
        self._log = LOG_FN(self._on_log)
        self.verbose = verbose
        o = CtxOpts(1, home.encode(), None, None, -1, self._log, None, PROGRESS_FN(), None)
        self.ctx = ctypes.c_void_p()
        self._check(L.tk_ctx_new(ctypes.byref(self.ctx), ctypes.byref(o)), "tk_ctx_new")
        self.endpoint = L.tk_ctx_endpoint(self.ctx).decode()
        self.version = L.tk_version_string().decode()

    def _on_log(self, user, level, msg):
        if self.verbose or level >= 2:
            print(f"tk[{level}]: {msg.decode(errors='replace')}", file=sys.stderr)

    def _check(self, rc, what):
        if rc != 0:
            raise TkError(f"{what}: {self.lib.tk_status_str(rc).decode()}: {self.lib.tk_last_error().decode()}")

    def get(self, ref):
        p = ctypes.c_void_p()
        self._check(self.lib.tk_pkg_get(ctypes.byref(p), self.ctx, ref.encode(), None), f"tk_pkg_get {ref}")
        self.lib.tk_pkg_free(p)

    @staticmethod
    def tensor(x):
        if not x.is_contiguous():
            raise ValueError("tk takes contiguous tensors")
        code, bits = DTYPES[x.dtype]
        shape = (ctypes.c_int64 * max(x.dim(), 1))(*x.shape)
        dev = Device(TK_DEV_CUDA, x.device.index or 0) if x.is_cuda else Device(TK_DEV_CPU, 0)
        t = Tensor(ctypes.c_void_p(x.data_ptr()), dev, x.dim(), Dtype(code, bits, 1), shape, None, 0)
        t._keep = (shape, x)
        return t

    def prepare(self, op, **kw):
        """The argument array for op (built once, reused by timing loops)."""
        tensors, args = [], []
        for name, v in kw.items():
            if isinstance(v, torch.Tensor):
                t = self.tensor(v)
                tensors.append(t)
                args.append(Arg(TK_ARG_TENSOR, name.encode(), ctypes.pointer(t), 0, 0.0))
            elif isinstance(v, bool) or isinstance(v, int):
                args.append(Arg(TK_ARG_I64, name.encode(), None, int(v), 0.0))
            else:
                args.append(Arg(TK_ARG_F64, name.encode(), None, 0, float(v)))
        arr = (Arg * len(args))(*args)
        return (op.encode(), arr, len(args), tensors)

    def run(self, prepared):
        op, arr, n, _ = prepared
        impl = ctypes.c_char_p()
        rc = self.lib.tk_op_run(self.ctx, op, arr, n, None, ctypes.byref(impl))
        self._check(rc, f"tk_op_run {op.decode()}")
        return impl.value.decode() if impl.value else "?"

    def op(self, op, **kw):
        return self.run(self.prepare(op, **kw))

    def close(self):
        if self.ctx:
            self.lib.tk_ctx_free(self.ctx)
            self.ctx = None


# ---- measuring --------------------------------------------------------------------------------------

def timed(fn, sets, reps, cuda):
    """Median microseconds of fn(set) over reps runs, rotating over sets, after a warm-up of each."""
    for s in sets:
        fn(s)
    if not cuda:
        t = []
        for r in range(reps):
            t0 = time.perf_counter()
            fn(sets[r % len(sets)])
            t.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(t)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for r in range(reps):
        ev[r][0].record()
        fn(sets[r % len(sets)])
        ev[r][1].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)


def rel_err(got, ref):
    """max |got - ref| / max |ref| over finite reference elements (inf where got has a NaN ref lacks)."""
    got, ref = got.detach().double().flatten(), ref.detach().double().flatten()
    fin = torch.isfinite(ref)
    if bool((~torch.isfinite(got[fin])).any()):
        return math.inf
    if not bool(fin.any()):
        return 0.0
    d = (got[fin] - ref[fin]).abs().max().item()
    return d / max(ref[fin].abs().max().item(), 1e-30)


TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


class Bench:
    def __init__(self, tk, dev, reps, l2_bytes, quick):
        self.tk, self.dev, self.reps, self.l2, self.quick = tk, dev, reps, l2_bytes, quick
        self.cuda = dev.type == "cuda"
        self.rows = []
        self.copy_gbs = None

    def nsets(self, bytes_per_set):
        """Input sets to rotate so the working set exceeds twice the L2 (at least 2)."""
        return max(2, min(8, math.ceil(2 * self.l2 / max(bytes_per_set, 1))))

    def add(self, op, shape, dtype, impl, tk_us, torch_us, work, unit, err, tol, note="", torch_err=None,
            torch_tol=None):
        rate = (lambda us: work / us / 1e3) if unit == "GB/s" else (lambda us: work / us / 1e6)
        tk_rate = rate(tk_us) if tk_us else None
        row = {"op": op, "shape": shape, "dtype": str(dtype).replace("torch.", ""), "impl": impl,
               "tk_us": round(tk_us, 2) if tk_us else None, "torch_us": round(torch_us, 2) if torch_us else None,
               "unit": unit, "tk_rate": round(tk_rate, 1) if tk_rate else None,
               "torch_rate": round(rate(torch_us), 1) if torch_us else None,
               "tk_vs_torch": round(torch_us / tk_us, 3) if tk_us and torch_us else None,
               "pct_of_copy": round(100 * tk_rate / self.copy_gbs, 1) if unit == "GB/s" and self.copy_gbs and tk_rate else None,
               "max_rel_err": err, "torch_rel_err": torch_err,
               "status": "ok" if err is not None and err <= tol else "MISMATCH", "note": note}
        if row["status"] == "ok" and torch_err is not None and torch_err > (tol if torch_tol is None else torch_tol):
            row["status"] = "TORCH-FORMULA-MISMATCH"  # the torch equivalent itself is off: fix the bench
        self.rows.append(row)
        print(f"  {op:28s} {shape:30s} {row['dtype']:8s} tk {row['tk_rate'] or '-':>8} {unit:7s} torch "
              f"{row['torch_rate'] or '-':>8}  x{row['tk_vs_torch'] or '-':<6} err {err:.2e} (torch "
              f"{'-' if torch_err is None else format(torch_err, '.2e')}) {row['status']} {impl}",
              flush=True)

    # one op: tk over sets, torch over sets, error on set 0 against ref(set 0)
    def one(self, op, shape, dtype, make, tk_kw, torch_fn, ref_fn, out_of, work, unit="GB/s", note="", nsets=None,
            tol=None):
        sets = [make() for _ in range(nsets or (1 if not self.cuda else self.nsets(work)))]
        prepared = [self.tk.prepare(op, **tk_kw(s)) for s in sets]
        impl = self.tk.run(prepared[0])
        err = rel_err(out_of(sets[0]), ref_fn(sets[0]))
        # the torch equivalent is checked against the same reference, on a fresh set (in-place ops)
        fresh = make()
        r = torch_fn(fresh)
        torch_err = rel_err(r if isinstance(r, torch.Tensor) else out_of(fresh), ref_fn(fresh))
        del fresh, r
        tk_us = torch_us = None
        if self.cuda:
            tk_us = timed(lambda p: self.tk.run(p), prepared, self.reps, True)
            torch_us = timed(torch_fn, sets, self.reps, True)
        tol = TOL[dtype] if tol is None else tol
        # torch computes in the input dtype where tk accumulates in fp32: its bound is the dtype's
        self.add(op, shape, dtype, impl, tk_us, torch_us, work, unit, err, tol, note, torch_err, max(tol, TOL[dtype]))


def rnd(shape, dtype, dev, lo=-1.0, hi=1.0):
    return (torch.rand(shape, device=dev, dtype=torch.float32) * (hi - lo) + lo).to(dtype)


# ---- the benchmarks ----------------------------------------------------------------------------------

def bench_copy(b):
    n = (256 << 20) if b.quick else (1 << 30)
    x = torch.empty(n, dtype=torch.uint8, device=b.dev)
    y = torch.empty_like(x)
    us = timed(lambda _: y.copy_(x), [0], b.reps, True)
    b.copy_gbs = 2 * n / us / 1e3
    b.rows.append({"op": "copy (ceiling)", "shape": f"[{n}] u8", "dtype": "u8", "impl": "torch copy_",
                   "tk_us": None, "torch_us": round(us, 2), "unit": "GB/s", "tk_rate": None,
                   "torch_rate": round(b.copy_gbs, 1), "tk_vs_torch": None, "pct_of_copy": 100.0,
                   "max_rel_err": 0.0, "status": "ok", "note": "bytes read + written"})
    print(f"  copy ceiling: {b.copy_gbs:.0f} GB/s ({us:.0f} us for {2 * n >> 20} MiB moved)", flush=True)


def bench_memory_bound(b, dt):
    dev, cpu = b.dev, not b.cuda
    T, D = (16, 96) if cpu else (16384, 14336 if not b.quick else 4096)
    e = dt.itemsize
    # activations: out = act(x[:, :D]) * x[:, D:]
    for op, act in (("silu_and_mul", F.silu), ("gelu_and_mul", F.gelu)):
        b.one(op, f"[{T}, 2*{D}]", dt, lambda: {"x": rnd((T, 2 * D), dt, dev, -4, 4), "out": torch.empty(T, D, dtype=dt, device=dev)},
              lambda s: {"out": s["out"], "input": s["x"]},
              lambda s: act(s["x"][:, :D]) * s["x"][:, D:],
              lambda s: act(s["x"][:, :D].float()) * s["x"][:, D:].float(),
              lambda s: s["out"], 3 * T * D * e)
    # norms
    R, H = (8, 80) if cpu else (32768, 8192 if not b.quick else 4096)
    eps = 1e-6

    def mk_norm():
        return {"x": rnd((R, H), dt, dev, -3, 3), "r": rnd((R, H), dt, dev, -3, 3), "w": rnd((H,), dt, dev, 0.5, 1.5),
                "bias": rnd((H,), dt, dev), "out": torch.empty(R, H, dtype=dt, device=dev)}
    b.one("rms_norm", f"[{R}, {H}]", dt, mk_norm, lambda s: {"out": s["out"], "input": s["x"], "weight": s["w"], "eps": eps},
          lambda s: F.rms_norm(s["x"], (H,), s["w"], eps),
          lambda s: F.rms_norm(s["x"].float(), (H,), s["w"].float(), eps), lambda s: s["out"], 2 * R * H * e)
    b.one("layer_norm", f"[{R}, {H}]", dt, mk_norm,
          lambda s: {"out": s["out"], "input": s["x"], "weight": s["w"], "bias": s["bias"], "eps": 1e-5},
          lambda s: F.layer_norm(s["x"], (H,), s["w"], s["bias"], 1e-5),
          lambda s: F.layer_norm(s["x"].float(), (H,), s["w"].float(), s["bias"].float(), 1e-5), lambda s: s["out"],
          2 * R * H * e)

    # fused_add_rms_norm, in place: residual += input; input = rms_norm(residual) * w. Each timed run
    # changes its inputs; the error is checked on a fresh set first.
    def mk_fused():
        s = mk_norm()
        s["x0"], s["r0"] = s["x"].clone(), s["r"].clone()
        return s

    def fused_ref(s):
        r = s["x0"].float() + s["r0"].float()
        return F.rms_norm(r.to(dt).float(), (H,), s["w"].float(), eps)

    def fused_torch(s):
        s["r"].add_(s["x"])
        s["x"].copy_(F.rms_norm(s["r"], (H,), s["w"], eps))
    b.one("fused_add_rms_norm", f"[{R}, {H}]", dt, mk_fused,
          lambda s: {"input": s["x"], "residual": s["r"], "weight": s["w"], "eps": eps},
          fused_torch, fused_ref, lambda s: s["x"], 4 * R * H * e, note="in place; torch: add_ + rms_norm + copy_")

    # rotary (NeoX), in place on query and key
    Tk, Hq, Hk, Dh, P = (6, 4, 2, 64, 32) if cpu else (16384, 32, 8, 128, 32768)

    def mk_rope():
        pos = torch.randint(0, P, (Tk,), device=dev, dtype=torch.int64)
        inv = 1.0 / (10000 ** (torch.arange(0, Dh, 2, device=dev, dtype=torch.float64) / Dh))
        ang = torch.arange(P, device=dev, dtype=torch.float64)[:, None] * inv[None, :]
        cache = torch.cat([ang.cos(), ang.sin()], dim=1).to(dt)
        q, k = rnd((Tk, Hq, Dh), dt, dev, -2, 2), rnd((Tk, Hk, Dh), dt, dev, -2, 2)
        return {"q": q, "k": k, "q0": q.clone(), "pos": pos, "cache": cache}

    def rope(x, pos, cache):
        c, s_ = cache[pos].float().chunk(2, dim=-1)
        c, s_ = c[:, None, :], s_[:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * c - x2 * s_, x2 * c + x1 * s_], dim=-1)

    def rope_torch(s):
        s["q"].copy_(rope(s["q"], s["pos"], s["cache"]))
        s["k"].copy_(rope(s["k"], s["pos"], s["cache"]))
    b.one("rotary_embedding", f"q [{Tk}, {Hq}, {Dh}] k [{Tk}, {Hk}, {Dh}]", dt, mk_rope,
          lambda s: {"query": s["q"], "key": s["k"], "positions": s["pos"], "cos_sin_cache": s["cache"], "is_neox": 1},
          rope_torch, lambda s: rope(s["q0"], s["pos"], s["cache"]), lambda s: s["q"], 2 * Tk * (Hq + Hk) * Dh * e,
          note="in place; torch: eager formula")

    # softmax / log_softmax
    Rs, V = (8, 300) if cpu else (8192, 32768 if not b.quick else 8192)
    for op, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        b.one(op, f"[{Rs}, {V}]", dt, lambda: {"x": rnd((Rs, V), dt, dev, -8, 8), "out": torch.empty(Rs, V, dtype=dt, device=dev)},
              lambda s: {"out": s["out"], "input": s["x"]}, lambda s, fn=fn: fn(s["x"], -1),
              lambda s, fn=fn: fn(s["x"].float(), -1), lambda s: s["out"], 2 * Rs * V * e)
    # argmax
    b.one("argmax", f"[{Rs}, {V}]", dt, lambda: {"x": rnd((Rs, V), dt, dev, -8, 8), "out": torch.empty(Rs, dtype=torch.int64, device=dev)},
          lambda s: {"out": s["out"], "input": s["x"]}, lambda s: torch.argmax(s["x"], -1),
          lambda s: torch.argmax(s["x"], -1).double(), lambda s: s["out"].double(), Rs * V * e, tol=0.0)
    # cross-entropy (mean, loss only)
    N, Vc = (8, 500) if cpu else (8192, 128256 if not b.quick else 32000)

    def mk_ce():
        return {"x": rnd((N, Vc), dt, dev, -6, 6), "t": torch.randint(0, Vc, (N,), device=dev),
                "loss": torch.empty((), dtype=torch.float32, device=dev)}
    b.one("cross_entropy", f"[{N}, {Vc}]", dt, mk_ce, lambda s: {"logits": s["x"], "target": s["t"], "loss": s["loss"]},
          lambda s: F.cross_entropy(s["x"], s["t"]), lambda s: F.cross_entropy(s["x"].float(), s["t"]),
          lambda s: s["loss"], N * Vc * e, tol=1e-4, note="mean, loss only")


def bench_paged(b, dt):
    dev, cpu = b.dev, not b.cuda
    # paged_kv_append: k, v [T, H, D] into caches [nb, bs, H, D] at slots
    T, H, D, bs = (10, 2, 64, 16) if cpu else (65536, 8, 128, 16)
    nb = (2 * T) // bs + 4

    def mk_app():
        slots = torch.randperm(nb * bs, device=dev)[:T].to(torch.int64)
        return {"kc": torch.zeros(nb, bs, H, D, dtype=dt, device=dev), "vc": torch.zeros(nb, bs, H, D, dtype=dt, device=dev),
                "k": rnd((T, H, D), dt, dev), "v": rnd((T, H, D), dt, dev), "slots": slots}

    def app_torch(s):
        s["kc"].view(-1, H, D)[s["slots"]] = s["k"]
        s["vc"].view(-1, H, D)[s["slots"]] = s["v"]

    def app_ref(s):
        kc = torch.zeros(nb * bs, H, D, dtype=torch.float32, device=dev)
        kc[s["slots"]] = s["k"].float()
        return kc
    b.one("paged_kv_append", f"T {T} H {H} D {D} page {bs}", dt, mk_app,
          lambda s: {"k_cache": s["kc"], "v_cache": s["vc"], "k": s["k"], "v": s["v"], "slot_mapping": s["slots"]},
          app_torch, app_ref, lambda s: s["kc"].view(-1, H, D), 4 * T * H * D * dt.itemsize, tol=0.0,
          note="torch: index_put")

    # attention_decode: q [B, 1, Hq, D], paged caches; torch: SDPA over contiguous K/V (no paging)
    B, Hq, Hkv, D, L, bs = (2, 4, 2, 64, 40, 16) if cpu else (64, 32, 8, 128, 4096, 16)
    mb = (L + bs - 1) // bs

    def mk_dec():
        nblk = B * mb + 1
        perm = torch.randperm(nblk, device=dev)[:B * mb].to(torch.int32).view(B, mb)
        kc, vc = rnd((nblk, bs, Hkv, D), dt, dev, -2, 2), rnd((nblk, bs, Hkv, D), dt, dev)
        kk = kc[perm.long()].reshape(B, mb * bs, Hkv, D)[:, :L].transpose(1, 2).contiguous()  # [B, Hkv, L, D]
        vv = vc[perm.long()].reshape(B, mb * bs, Hkv, D)[:, :L].transpose(1, 2).contiguous()
        return {"q": rnd((B, 1, Hq, D), dt, dev, -1.5, 1.5), "kc": kc, "vc": vc, "bt": perm,
                "sl": torch.full((B,), L, dtype=torch.int32, device=dev), "out": torch.empty(B, 1, Hq, D, dtype=dt, device=dev),
                "kk": kk, "vv": vv}

    def dec_torch(s, f32=False):
        q, k, v = s["q"].transpose(1, 2), s["kk"], s["vv"]
        if f32:
            q, k, v = q.float(), k.float(), v.float()
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2)
    b.one("attention_decode", f"B {B} Hq {Hq} Hkv {Hkv} D {D} L {L}", dt, mk_dec,
          lambda s: {"out": s["out"], "q": s["q"], "k_cache": s["kc"], "v_cache": s["vc"], "block_table": s["bt"],
                     "seq_lens": s["sl"]},
          dec_torch, lambda s: dec_torch(s, True), lambda s: s["out"], 2 * B * L * Hkv * D * dt.itemsize,
          note="bytes: KV read; torch: SDPA on contiguous K/V")


def bench_casted(b, dt):
    dev, cpu = b.dev, not b.cuda
    # embedding: out[i] = w[ids[i]] * scale[ids[i]], i8 table
    T, V, D = (12, 50, 64) if cpu else (65536, 128256, 4096)

    def mk_emb():
        w = torch.randint(-127, 128, (V, D), device=dev, dtype=torch.int8)
        return {"ids": torch.randint(0, V, (T,), device=dev, dtype=torch.int32), "w": w,
                "scale": torch.rand(V, device=dev) * 0.02, "out": torch.empty(T, D, dtype=dt, device=dev)}
    b.one("casted_embedding", f"ids {T} table [{V}, {D}] i8", dt, mk_emb,
          lambda s: {"out": s["out"], "ids": s["ids"], "weight": s["w"], "scale": s["scale"]},
          lambda s: (s["w"][s["ids"]].float() * s["scale"][s["ids"], None]).to(dt),
          lambda s: s["w"][s["ids"]].float() * s["scale"][s["ids"], None], lambda s: s["out"],
          T * D * (1 + dt.itemsize), note="torch: gather + scale")
    # linear at M = 1 (GEMV): out = (x @ w^T) * scale; torch: F.linear with the dequantised bf16 weight
    N, K = (48, 64) if cpu else (14336, 4096)

    def mk_lin():
        w = torch.randint(-127, 128, (N, K), device=dev, dtype=torch.int8)
        sc = torch.rand(N, device=dev) * 0.01
        return {"x": rnd((1, K), dt, dev), "w": w, "scale": sc, "wd": (w.float() * sc[:, None]).to(dt),
                "out": torch.empty(1, N, dtype=dt, device=dev)}
    b.one("casted_linear", f"M 1 N {N} K {K} i8", dt, mk_lin,
          lambda s: {"out": s["out"], "x": s["x"], "weight": s["w"], "scale": s["scale"]},
          lambda s: F.linear(s["x"], s["wd"]), lambda s: (s["x"].float() @ s["w"].float().t()) * s["scale"],
          lambda s: s["out"], N * K, note="bytes: i8 weight; torch reads the bf16 weight (2x)")


def attn_flops(B, H, Sq, Sk, D, causal):
    f = 4 * B * H * Sq * Sk * D
    return f / 2 if causal else f


def bench_attention(b, dt):
    dev, cpu = b.dev, not b.cuda
    if cpu:
        cases = [(1, 2, 2, 48, 64, 1), (1, 2, 1, 40, 64, 0)]
    else:
        cases = [(B, 32, 32, S, D, c) for (B, S) in ((16, 1024), (4, 4096), (1, 16384)) for D in (64, 128)
                 for c in (0, 1)]
        if b.quick:
            cases = [(4, 32, 32, 4096, 128, c) for c in (0, 1)]
    for (B, Hq, Hkv, S, D, causal) in cases:
        def mk():
            return {"q": rnd((B, S, Hq, D), dt, dev, -2, 2), "k": rnd((B, S, Hkv, D), dt, dev, -2, 2),
                    "v": rnd((B, S, Hkv, D), dt, dev), "out": torch.empty(B, S, Hq, D, dtype=dt, device=dev),
                    "lse": torch.empty(B, Hq, S, dtype=torch.float32, device=dev)}

        def sdpa(s, f32=False, causal=causal):
            q, k, v = (s[n].transpose(1, 2) for n in ("q", "k", "v"))
            if f32:
                q, k, v = q.float(), k.float(), v.float()
            return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=Hq != Hkv).transpose(1, 2)
        b.one("attention", f"B {B} S {S} H {Hq} D {D} causal {causal}", dt, mk,
              lambda s, causal=causal: {"out": s["out"], "q": s["q"], "k": s["k"], "v": s["v"], "lse": s["lse"],
                                        "causal": causal},
              sdpa, lambda s: sdpa(s, True) if cpu or S <= 4096 else sdpa(s), lambda s: s["out"],
              attn_flops(B, Hq, S, S, D, causal), unit="TFLOP/s", nsets=1 if not cpu else None,
              note="torch: F.scaled_dot_product_attention (its default backend)")


def bench_attention_backward(b, dt):
    dev, cpu = b.dev, not b.cuda
    cases = [(1, 2, 32, 64, 1)] if cpu else ([(4, 32, 4096, 128, 1), (4, 32, 4096, 128, 0), (8, 32, 2048, 64, 1)]
                                             if not b.quick else [(4, 32, 2048, 128, 1)])
    for (B, H, S, D, causal) in cases:
        q, k, v = (rnd((B, S, H, D), dt, dev, -2, 2) for _ in range(3))
        dout = rnd((B, S, H, D), dt, dev)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, S, dtype=torch.float32, device=dev)
        b.tk.op("attention", out=out, q=q, k=k, v=v, lse=lse, causal=causal)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        prep = b.tk.prepare("attention_backward", dq=dq, dk=dk, dv=dv, dout=dout, q=q, k=k, v=v, out=out, lse=lse,
                            causal=causal)
        impl = b.tk.run(prep)
        qt, kt, vt = (x.detach().transpose(1, 2).float().requires_grad_() for x in (q, k, v))
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
        gq, = torch.autograd.grad(o, (qt,), dout.transpose(1, 2).float())
        err = rel_err(dq, gq.transpose(1, 2))
        tk_us = torch_us = None
        if b.cuda:
            tk_us = timed(lambda p: b.tk.run(p), [prep], b.reps, True)
            qn, kn, vn = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            on = F.scaled_dot_product_attention(qn, kn, vn, is_causal=bool(causal))
            dn = dout.transpose(1, 2)
            torch_us = timed(lambda _: torch.autograd.grad(on, (qn, kn, vn), dn, retain_graph=True), [0], b.reps, True)
        b.add("attention_backward", f"B {B} S {S} H {H} D {D} causal {causal}", dt, impl, tk_us, torch_us,
              2.5 * attn_flops(B, H, S, S, D, causal), "TFLOP/s", err, 2 * TOL[dt] if dt != torch.float32 else 1e-4,
              "flops 2.5x forward; torch: SDPA backward; err on dq")


def bench_fused_ce(b, dt):
    dev, cpu = b.dev, not b.cuda
    N, Hd, V = (8, 64, 300) if cpu else ((4096, 4096, 128256) if not b.quick else (2048, 2048, 32000))
    h, w = rnd((N, Hd), dt, dev), rnd((V, Hd), dt, dev, -0.05, 0.05)
    t = torch.randint(0, V, (N,), device=dev)
    loss = torch.empty((), dtype=torch.float32, device=dev)
    gh, gw = torch.empty_like(h), torch.zeros(V, Hd, dtype=torch.float32, device=dev)
    prep = b.tk.prepare("fused_linear_cross_entropy", hidden=h, weight=w, target=t, loss=loss, grad_hidden=gh,
                        grad_weight=gw)
    impl = b.tk.run(prep)
    hf, wf = h.float().requires_grad_(), w.float().requires_grad_()
    lf = F.cross_entropy(F.linear(hf, wf), t)
    ghr, = torch.autograd.grad(lf, (hf,))
    err = max(rel_err(loss, lf), rel_err(gh, ghr))
    tk_us = torch_us = None
    if b.cuda:
        def tkf(p):
            gw.zero_()  # grad_weight accumulates (fp32, like .grad)
            b.tk.run(p)
        tk_us = timed(tkf, [prep], b.reps, True)
        hn, wn = h.detach().requires_grad_(), w.detach().requires_grad_()

        def tf(_):
            ln = F.cross_entropy(F.linear(hn, wn).float(), t)
            torch.autograd.grad(ln, (hn, wn))
        torch_us = timed(tf, [0], b.reps, True)
    b.add("fused_linear_cross_entropy", f"N {N} H {Hd} V {V}", dt, impl, tk_us, torch_us, 6 * N * Hd * V, "TFLOP/s",
          err, 2 * TOL[dt] if dt != torch.float32 else 1e-4, "loss + grad_hidden + grad_weight; torch: linear + CE + autograd")


def bench_overhead(b, dt):
    """Host time per tk_op_run on a tiny op (kernel time negligible), against torch's per op call."""
    x = rnd((1, 64), dt, b.dev)
    out = torch.empty(1, 32, dtype=dt, device=b.dev)
    prep = b.tk.prepare("silu_and_mul", out=out, input=x)
    impl = b.tk.run(prep)
    n = 2000 if b.cuda else 200
    for _ in range(50):
        b.tk.run(prep)
    if b.cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        b.tk.run(prep)
    if b.cuda:
        torch.cuda.synchronize()
    tk_us = (time.perf_counter() - t0) * 1e6 / n
    t0 = time.perf_counter()
    for _ in range(n):
        F.silu(x[:, :32]) * x[:, 32:]
    if b.cuda:
        torch.cuda.synchronize()
    torch_us = (time.perf_counter() - t0) * 1e6 / n
    b.rows.append({"op": "host overhead per call", "shape": "silu_and_mul [1, 64]", "dtype": str(dt).replace("torch.", ""),
                   "impl": impl, "tk_us": round(tk_us, 2), "torch_us": round(torch_us, 2), "unit": "us/call",
                   "tk_rate": None, "torch_rate": None, "tk_vs_torch": round(torch_us / tk_us, 3), "pct_of_copy": None,
                   "max_rel_err": 0.0, "status": "ok", "note": "wall clock, no sync between calls; torch: 2 ops"})
    print(f"  host overhead: tk_op_run {tk_us:.1f} us/call, torch silu*mul {torch_us:.1f} us/call ({impl})", flush=True)


PACKAGES = ["activation", "rmsnorm", "rotary", "softmax", "sampling", "cross-entropy", "flash-attn", "casted"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", required=True, help="path to libtk.so.0")
    ap.add_argument("--home", help="TK_HOME to use (default: a fresh temporary one)")
    ap.add_argument("--csv", help="write every row here")
    ap.add_argument("--json", help="write every row (and the device) here")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cpu-check", action="store_true", help="no GPU: small CPU tensors, check bindings and formulas")
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a first look)")
    ap.add_argument("--only", help="comma-separated groups: copy,memory,paged,casted,attention,backward,fused_ce,overhead")
    ap.add_argument("-v", "--verbose", action="store_true", help="print tk's debug log")
    a = ap.parse_args()
    cuda = not a.cpu_check
    if cuda and not torch.cuda.is_available():
        print("gpu_vs_torch: torch sees no CUDA device\nHINT: run on a GPU machine, or --cpu-check here", file=sys.stderr)
        return 2
    if not os.path.exists(a.lib):
        print(f"gpu_vs_torch: {a.lib} does not exist\nHINT: make gpu-bundle (or make) first", file=sys.stderr)
        return 2
    home = a.home or tempfile.mkdtemp(prefix="tk-bench-")
    tk = TK(a.lib, home, a.verbose)
    dev = torch.device("cuda:0" if cuda else "cpu")
    torch.manual_seed(0)
    info = {"tk": tk.version, "endpoint": tk.endpoint, "torch": torch.__version__, "device": "cpu"}
    l2 = 50 << 20
    if cuda:
        p = torch.cuda.get_device_properties(0)
        l2 = getattr(p, "L2_cache_size", l2) or l2
        info.update(device=p.name, sms=p.multi_processor_count, l2_bytes=l2, cuda=torch.version.cuda)
        for pkg in PACKAGES:
            tk.get(f"kernels-community/{pkg}")
    print(f"tk {tk.version} ({a.lib}), registry {tk.endpoint}; torch {torch.__version__}; device {info['device']}",
          flush=True)
    b = Bench(tk, dev, a.reps, l2, a.quick)
    groups = set((a.only or "copy,memory,paged,casted,attention,backward,fused_ce,overhead").split(","))
    dts = [torch.bfloat16] if cuda else [torch.float32, torch.bfloat16]
    failures = []

    def guarded(name, fn, *args):
        if name not in groups:
            return
        try:
            fn(b, *args)
        except (TkError, RuntimeError, ValueError) as e:  # one group's failure does not hide the others
            failures.append(f"{name}: {e}")
            print(f"  {name}: ERROR {e}", file=sys.stderr, flush=True)
    if cuda:
        guarded("copy", bench_copy)
    for dt in dts:
        guarded("memory", bench_memory_bound, dt)
        guarded("paged", bench_paged, dt)
        guarded("casted", bench_casted, dt)
        guarded("attention", bench_attention, dt)
        guarded("backward", bench_attention_backward, dt)
        guarded("fused_ce", bench_fused_ce, dt)
    guarded("overhead", bench_overhead, dts[-1])
    tk.close()
    bad = [r for r in b.rows if r["status"] != "ok"]
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            fields = list(dict.fromkeys(k for r in b.rows for k in r)) or ["op"]  # rows differ (torch_rel_err)
            w = csv.DictWriter(f, fieldnames=fields, restval="")
            w.writeheader()
            w.writerows(b.rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "rows": b.rows, "errors": failures}, f, indent=1)
    # the table (last lines of the output)
    print(f"\n| op | shape | tk | torch | tk/torch speed | % of copy | max rel err (torch's) | status |")
    for r in b.rows:
        unit = r["unit"]
        tkv = f"{r['tk_rate']} {unit}" if r["tk_rate"] else (f"{r['tk_us']} us" if r["tk_us"] else "-")
        tov = f"{r['torch_rate']} {unit}" if r["torch_rate"] else (f"{r['torch_us']} us" if r["torch_us"] else "-")
        print(f"| {r['op']} | {r['shape']} {r['dtype']} | {tkv} | {tov} | {r['tk_vs_torch'] or '-'} | "
              f"{r['pct_of_copy'] or '-'} | {r['max_rel_err']:.2e} ({'-' if r.get('torch_rel_err') is None else format(r['torch_rel_err'], '.1e')}) | {r['status']} |")
    print(f"{len(b.rows)} rows, {len(bad)} mismatches, {len(failures)} errors"
          f"{' (cpu check: bindings and formulas only, no timing)' if not cuda else ''}")
    return 1 if bad or failures else 0


if __name__ == "__main__":
    sys.exit(main())
