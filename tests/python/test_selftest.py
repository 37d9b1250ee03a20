"""tk.selftest, tk.selftest_results, tk.selftest_records and get_kernel(..., selftest=True) from Python
(docs/selftest.md). Without a GPU: the errors (NoDeviceError with tk's message and hint; the install
of get_kernel stands), the plan through the ctypes struct (the C layout of tk_selftest_opts, embedded
tk_get_opts included), and records written as a GPU run writes them, read back. With a GPU: the shipped
activation package passes and get_kernel(selftest=True) carries the report."""
import os
import sqlite3
import time

from harness import ROOT, Skip

import tk  # noqa: E402
from tk import _lib  # noqa: E402


def _has_gpu():
    try:
        return tk.device_count() > 0
    except tk.TkError:
        return False


def test_no_gpu_errors():
    if _has_gpu():
        raise Skip("this machine has a GPU (test_gpu_report covers it)")
    try:
        tk.selftest("kernels-community/activation")
        raise AssertionError("tk.selftest without a GPU did not raise")
    except tk.NoDeviceError as e:
        assert "self-test needs the GPU" in e.message and e.hint, (e.message, e.hint)
        assert e.status == -15
    try:
        tk.get_kernel("kernels-community/activation", selftest=True)
        raise AssertionError("get_kernel(selftest=True) without a GPU did not raise")
    except tk.NoDeviceError:
        pass
    # the install stood: get_kernel without selftest finds it, and its .selftest is None
    m = tk.get_kernel("kernels-community/activation")
    assert m.selftest is None
    try:
        tk.selftest_results()
        raise AssertionError("selftest_results without a GPU did not raise")
    except tk.NoDeviceError:
        pass
    assert tk.selftest_records() == []
    for bad in (-1, "0", True):
        try:
            tk.selftest("kernels-community/activation", device=bad)
            raise AssertionError("device=%r accepted" % (bad,))
        except tk.InvalidArgumentError:
            pass


def test_plan_through_the_struct():
    # plan_only through SelftestOpts: a wrong field order or a short embedded tk_get_opts would shift
    # plan_only/arch and this would run (and fail) instead of planning
    o = _lib.SelftestOpts()
    o.version = 1
    o.get.version = 2
    o.plan_only = 1
    o.arch = b"sm_80"
    import ctypes
    out = ctypes.c_void_p()
    ctx = _lib.current_context()
    rc = _lib.tk_selftest(ctypes.byref(out), ctx.handle, os.path.join(ROOT, "tests/data/selftest/broken").encode(),
                          ctypes.byref(o))
    assert rc == 0, _lib.tk_last_error()
    import json
    r = json.loads(_lib.take_string(out))
    assert r["plan"] is True and r["arch"] == "sm_80", r
    assert sorted(k["kernel"] for k in r["kernels"]) == ["silu_skip_last_row_f32", "silu_trap_f32",
                                                         "silu_wrong_element_f32"], r
    assert all(k["status"] == "planned" and k["cases"] > 0 for k in r["kernels"]), r
    assert ctypes.sizeof(_lib.GetOpts2) == ctypes.sizeof(ctypes.c_uint) * 4 + ctypes.sizeof(ctypes.c_void_p) * 3


def test_records_read_back():
    tk.get_kernel("kernels-community/activation")
    # a record as a GPU run writes it (cache/kcache.c's table), then the API's view of it
    db = os.path.join(os.environ["TK_HOME"], "cache", "cache.db")
    tk.selftest_records()  # opens (creates) cache.db
    c = sqlite3.connect(db)
    c.execute("INSERT INTO selftest VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
              ("ab" * 32, "silu_f32", "GPU-00000000-0000-0000-0000-000000000042", "570.86.15/12080", tk.version(),
               "kernels-community/activation@" + "0" * 40, "silu", "failed",
               '{"summary": "case \'silu f32 [3, 7]\': out[1, 3] got 2 want 1", "got": 2, "want": 1}',
               "NVIDIA H100 80GB HBM3", 0, int(time.time()), 0.01))
    c.commit()
    c.close()
    (r,) = tk.selftest_records("kernels-community/activation")
    assert r["status"] == "failed" and r["kernel"] == "silu_f32" and r["commit"] == "0" * 40, r
    assert r["detail"]["got"] == 2 and "summary" in r["detail"], r
    assert tk.selftest_records("kernels-community/softmax") == []


def test_gpu_report():
    if not _has_gpu():
        raise Skip("no CUDA device")
    m = tk.get_kernel("kernels-community/activation", selftest=True)
    assert m.selftest["ok"] is True and m.selftest["counts"]["failed"] == 0, m.selftest
    r = tk.selftest(os.path.join(ROOT, "tests/data/selftest/broken"), timeout=2)
    st = {k["kernel"]: k["status"] for k in r["kernels"]}
    assert st == {"silu_wrong_element_f32": "failed", "silu_skip_last_row_f32": "failed",
                  "silu_trap_f32": "crashed"}, st
    res = tk.selftest_results("kernels-community/activation")
    assert res["packages"][0]["never_tested"] == 0, res
