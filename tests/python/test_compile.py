"""torch.compile(fullgraph=True) of functions that call tk ops: the ops are torch.library custom ops
(torch.ops.tk.*) with fake implementations, so dynamo keeps them in one graph (fullgraph=True raises
on any graph break) and the compiled function gives the eager result. On CPU."""
from harness import need_torch

torch = need_torch()
import tk  # noqa: E402


def _mlp(act, norm):
    def f(x, w):
        h = torch.empty(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype)
        act.silu_and_mul(h, x)                  # the get_kernel module's function
        out = torch.empty_like(h)
        norm.rms_norm(out, h, w, 1e-5)
        y = torch.empty_like(out)
        torch.ops.tk.gelu_fast(y, out)          # the custom op itself
        return y * 2 + 1
    return f


def test_compile_records_one_graph_with_tk_ops():
    act = tk.get_kernel("kernels-community/activation")
    norm = tk.get_kernel("kernels-community/rmsnorm")
    f = _mlp(act, norm)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x, w = torch.randn(6, 64), torch.randn(32)
    got = torch.compile(f, fullgraph=True, backend=backend)(x, w)
    assert len(graphs) == 1, "%d graphs" % len(graphs)
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    for op in ("tk.silu_and_mul", "tk.rms_norm", "tk.gelu_fast"):
        assert any(op in t for t in targets), "%s not in the graph: %s" % (op, targets)
    assert torch.equal(got, f(x, w))


def test_compile_inductor_fullgraph():
    act = tk.get_kernel("kernels-community/activation")
    norm = tk.get_kernel("kernels-community/rmsnorm")
    f = _mlp(act, norm)
    x, w = torch.randn(6, 64), torch.randn(32)
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(x, w)
    ref = f(x, w)
    assert torch.allclose(got, ref, atol=1e-6, rtol=1e-6), (got - ref).abs().max()
