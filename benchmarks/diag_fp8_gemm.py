"""Diagnostic: the Triton block-scaled FP8 GEMM and cuBLASLt (torch._scaled_mm) against a float64 product of
the same quantized operands (python3 benchmarks/diag_fp8_gemm.py on a GPU)."""
import torch, sys
sys.path.insert(0, ".")
from model_wrapper.kernels import fp8
torch.manual_seed(0)
M, N, K = 257, 4096, 4096
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
w = (torch.randn(N, K, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
ws = torch.rand(N, 1, device="cuda") / 1000
xq, xs = fp8.quantize_fp8_per_token_group(x, K)
exact = (xq.double() * xs.double()) @ (w.double() * ws.double()).t()
tri = fp8.fp8_gemm(x, w, ws, K).double()
cub = torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=ws.t().contiguous(), out_dtype=torch.bfloat16).double()
f = lambda a: float((a - exact).abs().max() / exact.abs().max())
print("channel: triton gemm", f(tri), "cublas scaled_mm", f(cub), "bf16 rounding of exact", f(exact.bfloat16().double()))
ws2 = torch.rand(N, K // 128, device="cuda") / 1000
xq2, xs2 = fp8.quantize_fp8_per_token_group(x, 128)
deq = lambda q, s: q.double() * s.double().repeat_interleave(128, 1)
exact2 = deq(xq2, xs2) @ deq(w, ws2).t()
tri2 = fp8.fp8_gemm(x, w, ws2, 128).double()
print("block: triton gemm", float((tri2 - exact2).abs().max() / exact2.abs().max()))
