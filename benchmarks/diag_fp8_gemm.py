"""Diagnostic (python3 benchmarks/diag_fp8_gemm.py on a GPU): the activation quantization and the FP8 GEMMs.

1. quantize_fp8_per_token_group (Triton) against the torch reference on the GPU and on the CPU:
   how many elements differ, by how many e4m3 steps, and a few of them with the exact quotient;
2. the Triton block-scaled FP8 GEMM, cuBLASLt's row-wise GEMM and (where torch takes them) its
   block-scaled GEMM against a float64 product of the same quantized operands, beside the bf16
   rounding of that product.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from model_wrapper.kernels import fp8  # noqa: E402
from model_wrapper.kernels.fp8_reference import quantize_fp8_reference  # noqa: E402

torch.manual_seed(0)
M, N, K = 257, 4096, 4096
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
for group in (128, K):
    q, s = fp8.quantize_fp8_per_token_group(x, group)
    for where in ("cuda", "cpu"):
        rq, rs = quantize_fp8_reference(x.to(where), group)
        rq, rs = rq.cuda(), rs.cuda()
        diff = q.float() != rq.float()
        print(f"quantize group {group}: scales equal {torch.equal(s, rs)}, e4m3 values differing from the "
              f"torch reference on {where}: {int(diff.sum())} of {diff.numel()}", flush=True)
        if diff.any():
            idx = diff.nonzero()[:5]
            cols = idx[:, 1] // group
            for (r, c), g in zip(idx.tolist(), cols.tolist()):
                quot = x[r, c].double() / rs[r, g].double()
                print(f"   x={float(x[r, c]):+.6f} scale={float(rs[r, g]):.6e} x/scale={float(quot):+.6f} "
                      f"triton={float(q[r, c]):+.4f} torch={float(rq[r, c]):+.4f}", flush=True)

xq, xs = fp8.quantize_fp8_per_token_group(x, K)
w = (torch.randn(N, K, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
ws = torch.rand(N, 1, device="cuda") / 1000
exact = (xq.double() * xs.double()) @ (w.double() * ws.double()).t()
tri = fp8.fp8_gemm(x, w, ws, K).double()
cub = torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws.t().contiguous(), out_dtype=torch.bfloat16).double()
f = lambda a, e: float((a - e).abs().max() / e.abs().max())  # noqa: E731
print("channel: triton gemm", f(tri, exact), "cublas scaled_mm", f(cub, exact),
      "bf16 rounding of exact", f(exact.bfloat16().double(), exact))
wb = (torch.rand(N // 128, K // 128, device="cuda") / 1000)
ws2 = wb.repeat_interleave(128, 0)
xq2, xs2 = fp8.quantize_fp8_per_token_group(x, 128)
deq = lambda q, s: q.double() * s.double().repeat_interleave(128, 1)  # noqa: E731
exact2 = deq(xq2, xs2) @ deq(w, ws2).t()
tri2 = fp8.fp8_gemm(x, w, ws2, 128).double()
line = f"block: triton gemm {f(tri2, exact2)}  bf16 rounding of exact {f(exact2.bfloat16().double(), exact2)}"
if fp8._block_mm_works(x.device, N, K):
    line += f"  cublas block scaled_mm {f(fp8.fp8_scaled_mm_block(x, w, wb.t()).double(), exact2)}"
print(line)
