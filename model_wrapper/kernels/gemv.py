"""GEMV: x [T, K] @ W^T (+ b) for steps of 1..cfg.gemv_max_tokens tokens (decode at batch 1 and 2,
or one request's two speculative tokens), optionally with SiLU-and-mul of gate_up in its epilogue.

A program holds cfg.gemv_tile weights (BLOCK_N whole rows) in registers: it loads them first,
then waits for the kernel that wrote x (PDL), so the weights of the next projection stream in
while the one before drains (benchmarks/ab_gemv.py: at 1-2 tokens near the copy bandwidth,
ahead of cuBLAS). fp32 sums, one rounding.

add_norm (KernelConfig.gemv_add_norm): x is the previous block's output h and the GEMV's operand
is weight * RMSNorm(h + residual), computed in the prologue by every program (its K columns of
h and residual, 2 x 8 KB at hidden 4096, from L2) with kernels/norm.add_rms_norm_row, the
standalone kernel's arithmetic; program 0 also writes h + residual to residual_out, a buffer
no program reads (out of place: no program can read a residual another already overwrote).
That removes the add + RMSNorm kernel before qkv and gate_up at 1-2 token steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, silu_mul, uses_pdl
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.norm import add_rms_norm_row


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, o_ptr, r_ptr, nw_ptr, ro_ptr, eps, N, stride_x, stride_w, stride_o, stride_r,
                 stride_ro, K: tl.constexpr, KP: tl.constexpr, M: tl.constexpr, BLOCK_N: tl.constexpr,
                 HAS_BIAS: tl.constexpr, SILU: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr):
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
    if NORM:  # NORM: x is h; the operand is nw * RMSNorm(h + r) (module docstring)
        nw = tl.load(nw_ptr + cols, mask=cols < K, other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete
    dtype = o_ptr.dtype.element_ty
    for m in tl.static_range(M):
        if NORM:
            x = add_rms_norm_row(x_ptr + m * stride_x, r_ptr + m * stride_r, ro_ptr + m * stride_ro, nw, cols, K, eps,
                                 tl.program_id(0) == 0, True).to(tl.float32)
        else:
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
         cfg: KernelConfig = DEFAULT, add_norm: tuple | None = None) -> torch.Tensor:
    """x [T, K] @ weight[N, K]^T (+ bias [N]) -> [T, N] in x's dtype (fp32 sums, one rounding);
    for the shapes gemv_fits accepts. silu: weight is gate_up [2n, K] (bias [2n]) and the result
    is silu_and_mul of that product, [T, n], without the [T, 2n] intermediate.
    add_norm (residual [T, K], norm_weight [K], eps, residual_out [T, K]): x is h and the product
    is of norm_weight * RMSNorm(h + residual); h + residual is written to residual_out (neither
    h nor residual changes). Every [T, K] tensor with unit column stride."""
    T, K = x.shape
    N = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty(T, N, dtype=x.dtype, device=x.device)
    kp = triton.next_power_of_2(K)
    block_n = max(1, cfg.gemv_tile // kp // (2 if silu else 1))  # weights a program holds: gemv_tile
    pdl = uses_pdl(x.device, cfg)
    r, nw, eps, r_out = add_norm if add_norm is not None else (x, x, 0.0, x)
    _gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, x if bias is None else bias, out, r, nw, r_out, eps, N, x.stride(0), weight.stride(0),
        out.stride(0), r.stride(0), r_out.stride(0), K=K, KP=kp, M=T, BLOCK_N=block_n, HAS_BIAS=bias is not None,
        SILU=silu, NORM=add_norm is not None, PDL=pdl, num_warps=cfg.gemv_warps, **launch_args(pdl))
    return out
