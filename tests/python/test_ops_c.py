"""Every op of every package in kernels-src/, called from Python on CPU torch tensors, against the same
op run by the C tool (`tk run-op`, which calls tk_op_run from C) on the same input bytes: every tensor
must come out bit for bit the same, in f32, f16 and bf16. Then again with every tensor a
non-contiguous view (rows padded): tk's CPU references take strided tensors, and the fast CPU
implementations padded rows (the same arithmetic), so the results must be the same bytes, or the call
must be refused with an error that says 'contiguous'.

The shapes per op are in op_cases.txt; an op that a package implements and that file lacks is tried
with a default shape and skipped (with a note to add it) if `tk run-op` cannot derive its shapes."""
import glob
import json
import os
import shlex
import subprocess

from harness import ROOT, TK, Skip, fnv1a64, need_torch, run_op_inputs, tensor_bytes

torch = need_torch()
import tk  # noqa: E402

DTYPES = ("f32", "f16", "bf16")


def _package_ops():
    """op -> package name, from the manifests of kernels-src/ (what the default registry serves)."""
    m = {}
    for f in sorted(glob.glob(os.path.join(ROOT, "kernels-src", "*", "kernel.json"))):
        j = json.load(open(f))
        for k in j.get("kernels", []):
            m.setdefault(k["op"], j["name"])
    return m


def _cases():
    """op -> list of `tk run-op` argument lists (one per line of op_cases.txt)."""
    cases = {}
    for line in open(os.path.join(os.path.dirname(__file__), "op_cases.txt")):
        line = line.strip()
        if line and not line.startswith("#"):
            cases.setdefault(line.split()[0], []).append(shlex.split(line)[1:])
    return cases


PKG_OPS = _package_ops()
CASES = _cases()
PARAMS = {"test_op_matches_c": ["%s%s:%s" % (op, "#%d" % i if i else "", dt) for op in PKG_OPS
                                for i in range(len(CASES.get(op, [None]))) for dt in DTYPES]}


def _parse(args):
    named_dtypes, int_args, scalars = {}, {}, {}
    for flag, val in zip(args[::2], args[1::2]):
        if flag == "--dtype" and "=" in val:
            k, v = val.split("=", 1)
            named_dtypes[k] = v
        elif flag == "--arg":
            k, v = val.split("=", 1)
            # a tensor's value (every element: ids, or a float table such as alphas_cumprod=0.5)
            int_args[k] = float(v) if "." in v or "e" in v else int(v)
            scalars[k] = float(v) if "." in v or "e" in v else int(v)
    return named_dtypes, int_args, scalars


def _padded(x):
    """x as a non-contiguous view with the same values: rows of the last dimension padded by 3."""
    if x.dim() == 0 or x.numel() == 0:
        return x
    big = torch.zeros(*x.shape[:-1], x.shape[-1] + 3, dtype=x.dtype)
    v = big[..., : x.shape[-1]]
    v.copy_(x)
    return v


def test_op_matches_c(case):
    op, dt = case.split(":")
    op, _, i = op.partition("#")
    args = CASES[op][int(i or 0)] if op in CASES else None
    missing = args is None
    if missing:
        args = ["--shape", "4,64"]
    p = subprocess.run([TK, "--json", "run-op", op] + args + ["--dtype", dt, "--seed", "5"], capture_output=True,
                       text=True)
    if p.returncode != 0:
        if missing:
            raise Skip("%s: no shapes in tests/python/op_cases.txt and tk run-op cannot derive them; add a line" % op)
        raise AssertionError("tk run-op %s failed: %s" % (op, p.stderr))
    res = json.loads(p.stdout)
    assert res["impl"].startswith("cpu-"), res["impl"]  # the reference or a fast CPU implementation
    ops_json = {o["name"]: o for o in tk.current_context().ops_json()}
    named_dtypes, int_args, scalars = _parse(args)
    tensor_names = {t["name"] for t in res["tensors"]}
    scalars = {k: v for k, v in scalars.items() if k not in tensor_names}

    # the op through the package's module, as a user would call it
    mod = tk.get_kernel(PKG_OPS[op])
    fn = getattr(mod, op)
    for variant in ("contiguous", "strided"):
        ts = run_op_inputs(op, ops_json, res, dt, named_dtypes, int_args, 5)
        for t in res["tensors"]:  # the recreated inputs are the C tool's bytes
            if t["role"] == "in":
                assert fnv1a64(tensor_bytes(ts[t["name"]])) == t["fnv1a64"], \
                    "%s: input '%s' is not what tk run-op made" % (op, t["name"])
        if variant == "strided":
            ts = {k: _padded(v) for k, v in ts.items()}
            if all(v.is_contiguous() for v in ts.values()):
                continue
        try:
            fn(**ts, **scalars)
        except tk.TkError as e:
            if variant == "strided" and "contiguous" in str(e):
                continue  # refused clearly
            raise
        for t in res["tensors"]:
            got = fnv1a64(tensor_bytes(ts[t["name"]]))
            assert got == t["fnv1a64"], "%s %s (%s): '%s' differs from tk run-op's (fnv1a64 %s, want %s)" % (
                op, dt, variant, t["name"], got, t["fnv1a64"])


def test_every_package_op_is_callable():
    """Every op of every package in the default registry is a function of its get_kernel module."""
    pkgs = sorted(set(PKG_OPS.values()))
    assert len(pkgs) >= 8, pkgs
    for name in pkgs:
        mod = tk.get_kernel(name)
        want = sorted(op for op, p in PKG_OPS.items() if p == name)
        for op in want:
            assert callable(getattr(mod, op, None)), "%s: op %s is not in %r" % (name, op, mod)
        assert mod.commit and len(mod.commit) == 40 and mod.name == name
