"""One SmolLM2 gate_up-sized projection (1536 x 576, float32, one thread): torch's GEMM (F.linear) against the CPU
backend's packed few-rows kernel, by rows. Output: linear_ab.txt."""

import time

import torch

import testbed_kernels.cpu as ck

torch.set_num_threads(1)
W = torch.randn(1536, 576)
P = ck.pack_linear(W)


def median_ms(f) -> float:
    f()
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[2] * 1e3


for n in [64, 128, 129, 256, 512]:
    x = torch.randn(n, 576)
    a = median_ms(lambda: torch.nn.functional.linear(x, W))
    b = median_ms(lambda: torch.ops.testbed_cpu.linear_packed(x, P, 1536, None))
    print(f"{n} rows: torch {a:.3f} ms, packed {b:.3f} ms, ratio {a / b:.2f}")
