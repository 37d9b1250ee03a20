#!/usr/bin/env python3
"""The PyTorch oracle of tests/test_ops_layers.c: torch.nn.functional.linear on the test's values.

    oracle_linear.py DIR

DIR/cases.txt has one case a line: "I M N K DTYPE TRANSPOSED HAS_BIAS". For each it reads DIR/I.x.bin
[M, K], DIR/I.w.bin ([N, K], or [K, N] when TRANSPOSED=1) and DIR/I.b.bin [N] as little-endian
float32 (values already representable in DTYPE: f32, f16 or bf16), computes the linear in DTYPE on
the CPU and writes the result as float32 to DIR/I.out.bin. TRANSPOSED=1 is transformers' Conv1D:
x @ w + b, i.e. linear(x, w.T, b). One process for all cases: importing torch takes seconds.
"""
import sys

import torch


def run(d, i, m, n, k, dtype, tr, has_bias):
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]

    def load(name, shape):
        t = torch.frombuffer(bytearray(open(f"{d}/{i}.{name}", "rb").read()), dtype=torch.float32)
        return t.reshape(shape).to(dt)

    x = load("x.bin", (m, k))
    w = load("w.bin", (k, n) if tr else (n, k))
    b = load("b.bin", (n,)) if has_bias else None
    y = torch.nn.functional.linear(x, w.t() if tr else w, b)
    assert y.dtype == dt and tuple(y.shape) == (m, n)
    open(f"{d}/{i}.out.bin", "wb").write(y.to(torch.float32).contiguous().numpy().tobytes())


def main():
    d = sys.argv[1]
    for line in open(f"{d}/cases.txt"):
        i, m, n, k, dtype, tr, has_bias = line.split()
        run(d, i, int(m), int(n), int(k), dtype, int(tr), int(has_bias))


if __name__ == "__main__":
    main()
