"""silu_and_mul [T, 2N] -> [T, N]: silu(gate) * up in one pass (fp32 math, one rounding), instead
of torch's silu, then mul (three passes over the activations). Called by FlashInferKernels.silu_mul
after a gate_up GEMM that did not fuse it (kernels/gemv.py, kernels/gemm.py fuse it where they run).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, silu_mul, uses_pdl
from model_wrapper.kernels.config import KernelConfig

_BLOCK = 1024  # columns per program


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n, stride_x, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the GEMM that wrote x is complete
    g = tl.load(x_ptr + row * stride_x + col, mask=m)
    u = tl.load(x_ptr + row * stride_x + n + col, mask=m)
    tl.store(out_ptr + row * stride_o + col, silu_mul(g, u).to(out_ptr.dtype.element_ty), mask=m)


def silu_and_mul(x: torch.Tensor, cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """x [T, 2N] (rows contiguous) -> [T, N]."""
    T, n2 = x.shape
    n = n2 // 2
    out = torch.empty(T, n, dtype=x.dtype, device=x.device)
    if T:
        block = _BLOCK
        pdl = uses_pdl(x.device, cfg)
        _silu_and_mul_kernel[(T, triton.cdiv(n, block))](x, out, n, x.stride(0), out.stride(0), BLOCK=block, PDL=pdl,
                                                         **launch_args(pdl))
    return out
