"""GEMV: x [T, K] @ W^T (+ b) for steps of 1..cfg.gemv_max_tokens tokens (decode at batch 1 and 2,
or one request's two speculative tokens), optionally with SiLU-and-mul of gate_up in its epilogue.

A program holds cfg.gemv_tile weights (BLOCK_N whole rows) in registers: it loads them first,
then waits for the kernel that wrote x (PDL), so the weights of the next projection stream in
while the one before drains (benchmarks/ab_gemv.py: at 1-2 tokens near the copy bandwidth,
ahead of cuBLAS). fp32 sums, one rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, silu_mul, uses_pdl
from model_wrapper.kernels.config import KernelConfig


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, o_ptr, N, stride_x, stride_w, stride_o, K: tl.constexpr, KP: tl.constexpr,
                 M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                 PDL: tl.constexpr):
    # SILU: W is gate_up [2N, K]; output column n is silu(x @ W[n]) * (x @ W[N + n]), each product
    # rounded to the output dtype first (as the unfused GEMM, then silu_and_mul)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, KP)
    live = rows < N
    wm = live[:, None] & (cols < K)[None, :]
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w + cols[None, :]
    w = tl.load(w_rows, mask=wm, other=0.0)
    if SILU:
        wu = tl.load(w_rows + N * stride_w, mask=wm, other=0.0)
    if HAS_BIAS:
        b = tl.load(b_ptr + rows, mask=live, other=0.0).to(tl.float32)
        if SILU:
            bu = tl.load(b_ptr + N + rows, mask=live, other=0.0).to(tl.float32)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete
    dtype = o_ptr.dtype.element_ty
    for m in tl.static_range(M):
        x = tl.load(x_ptr + m * stride_x + cols, mask=cols < K, other=0.0).to(tl.float32)
        acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
        if HAS_BIAS:
            acc += b
        if SILU:
            up = tl.sum(wu.to(tl.float32) * x[None, :], axis=1)
            if HAS_BIAS:
                up += bu
            acc = silu_mul(acc.to(dtype), up.to(dtype))
        tl.store(o_ptr + m * stride_o + rows, acc.to(dtype), mask=live)


def gemv_fits(x: torch.Tensor, weight: torch.Tensor, cfg: KernelConfig = DEFAULT) -> bool:
    """Whether gemv takes x @ weight^T: 1..cfg.gemv_max_tokens rows of a 16- or 32-bit float, unit
    column strides, rows of at most cfg.gemv_max_k."""
    return (x.dim() == 2 and 0 < x.shape[0] <= cfg.gemv_max_tokens and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.stride(-1) == 1
            and weight.stride(-1) == 1 and x.shape[1] == weight.shape[1] <= cfg.gemv_max_k)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, silu: bool = False,
         cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """x [T, K] @ weight[N, K]^T (+ bias [N]) -> [T, N] in x's dtype (fp32 sums, one rounding);
    for the shapes gemv_fits accepts. silu: weight is gate_up [2n, K] (bias [2n]) and the result
    is silu_and_mul of that product, [T, n], without the [T, 2n] intermediate."""
    T, K = x.shape
    N = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty(T, N, dtype=x.dtype, device=x.device)
    kp = triton.next_power_of_2(K)
    block_n = max(1, cfg.gemv_tile // kp // (2 if silu else 1))  # weights a program holds: gemv_tile
    pdl = uses_pdl(x.device, cfg)
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, x if bias is None else bias, out, N, x.stride(0), weight.stride(0), out.stride(0), K=K, KP=kp, M=T,
        BLOCK_N=block_n, HAS_BIAS=bias is not None, SILU=silu, PDL=pdl, num_warps=cfg.gemv_warps,
        **launch_args(pdl))
    return out
