"""GEMV: x [T, K] @ W^T (+ b) for steps of 1..cfg.gemv_max_tokens tokens (decode at batch 1 and 2,
or one request's two speculative tokens), optionally with SiLU-and-mul of gate_up in its epilogue.

A program holds cfg.gemv_tile weights (BLOCK_N whole rows) in registers: it loads them first,
then waits for the kernel that wrote x (PDL), so the weights of the next projection stream in
while the one before drains (benchmarks/ab_gemv.py: at 1-2 tokens near the copy bandwidth,
ahead of cuBLAS). fp32 sums, one rounding.

Rounds (KernelConfig.gemv_rounds, at 1-token steps over rows of up to gemv_rounds_max_k columns): a
program takes its gemv_tile weights as that many blocks of rows in turn, block j + 1's loads issued
before block j's products (its registers hold two blocks). With one block, every program resident
after the PDL wait computes at once and none loads; with several, the next blocks' loads stream
while the first ones compute (H100, benchmarks/ab_gemv.py --per-projection: the small projections'
fixed cost a call).

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

from model_wrapper.kernels.common import (DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, loads_fence,
                                          silu_mul, uses_pdl)
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.norm import add_rms_norm_row


@triton.jit
def _block_load(w_ptr, b_ptr, rows, N, stride_w, K: tl.constexpr, KP: tl.constexpr, SILU: tl.constexpr,
                HAS_BIAS: tl.constexpr):
    """What a block of rows reads before its products: w, wu [BLOCK_N, KP] (wu: the up rows with SILU,
    else w; columns past K and rows past N zeros) and the bias b, bu (0.0 where absent)."""
    live = rows < N
    cols = tl.arange(0, KP)
    wm = live[:, None] & (cols < K)[None, :]
    w_rows = w_ptr + rows[:, None].to(tl.int64) * stride_w + cols[None, :]
    w = tl.load(w_rows, mask=wm, other=0.0)
    wu, b, bu = w, 0.0, 0.0
    if SILU:
        wu = tl.load(w_rows + N * stride_w, mask=wm, other=0.0)
    if HAS_BIAS:
        b = tl.load(b_ptr + rows, mask=live, other=0.0).to(tl.float32)
        if SILU:
            bu = tl.load(b_ptr + N + rows, mask=live, other=0.0).to(tl.float32)
    return w, wu, b, bu


@triton.jit
def _block_out(x_ptr, o_ptr, r_ptr, ro_ptr, nw, eps, rows, N, stride_x, stride_o, stride_r, stride_ro, w, wu, b, bu,
               K: tl.constexpr, KP: tl.constexpr, M: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
               NORM: tl.constexpr, STORE_R):
    """A block's products with each of the M tokens' x (NORM: nw * RMSNorm(x + r), with h + r stored to
    ro where STORE_R), its bias and SiLU epilogue, stored to its rows of o."""
    cols = tl.arange(0, KP)
    dtype = o_ptr.dtype.element_ty
    for m in tl.static_range(M):
        if NORM:
            x = add_rms_norm_row(x_ptr + m * stride_x, r_ptr + m * stride_r, ro_ptr + m * stride_ro, nw, cols, K, eps,
                                 STORE_R, True).to(tl.float32)
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
        tl.store(o_ptr + m * stride_o + rows, acc.to(dtype), mask=rows < N)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, o_ptr, r_ptr, nw_ptr, ro_ptr, eps, N, stride_x, stride_w, stride_o, stride_r,
                 stride_ro, K: tl.constexpr, KP: tl.constexpr, M: tl.constexpr, BLOCK_N: tl.constexpr,
                 ROUNDS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, NORM: tl.constexpr,
                 PDL: tl.constexpr, FENCE: tl.constexpr):
    # SILU: W is gate_up [2N, K]; output column n is silu(x @ W[n]) * (x @ W[N + n]), each product
    # rounded to the output dtype first (as the unfused GEMM, then silu_and_mul). A program takes
    # ROUNDS blocks of BLOCK_N rows in turn (module docstring); FENCE (CUDA): a fence after block
    # j + 1's loads keeps them ahead of block j's products.
    rows = tl.program_id(0) * ROUNDS * BLOCK_N + tl.arange(0, BLOCK_N)
    blk = _block_load(w_ptr, b_ptr, rows, N, stride_w, K, KP, SILU, HAS_BIAS)
    nw = 0.0
    if NORM:  # NORM: x is h; the operand is nw * RMSNorm(h + r) (module docstring)
        cols = tl.arange(0, KP)
        nw = tl.load(nw_ptr + cols, mask=cols < K, other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete
    for j in tl.static_range(ROUNDS):
        nxt = blk
        if j + 1 < ROUNDS:
            nxt = _block_load(w_ptr, b_ptr, rows + BLOCK_N, N, stride_w, K, KP, SILU, HAS_BIAS)
            if FENCE:
                loads_fence()
        w, wu, b, bu = blk
        _block_out(x_ptr, o_ptr, r_ptr, ro_ptr, nw, eps, rows, N, stride_x, stride_o, stride_r, stride_ro, w, wu, b,
                   bu, K, KP, M, HAS_BIAS, SILU, NORM, (tl.program_id(0) == 0) & (j == 0))
        blk = nxt
        rows += BLOCK_N


def gemv_fits(x: torch.Tensor, weight: torch.Tensor, cfg: KernelConfig = DEFAULT) -> bool:
    """Whether gemv takes x @ weight^T: 1..cfg.gemv_max_tokens rows of a 16- or 32-bit float, unit
    column strides, rows of at most cfg.gemv_max_k."""
    return (x.dim() == 2 and 0 < x.shape[0] <= cfg.gemv_max_tokens and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16, torch.float32) and x.stride(-1) == 1
            and weight.stride(-1) == 1 and x.shape[1] == weight.shape[1] <= cfg.gemv_max_k)


def gemv_rounds(T: int, K: int, norm: bool, rounds: int, cfg: KernelConfig = DEFAULT) -> int:
    """Row blocks a program takes in turn (`rounds`: cfg.gemv_rounds or fp8_gemv_rounds) at a step of
    T tokens over rows of K columns: at steps of up to cfg.gemv_rounds_max_tokens tokens, rows of up
    to cfg.gemv_rounds_max_k columns, without the norm prologue; else 1."""
    return rounds if T <= cfg.gemv_rounds_max_tokens and K <= cfg.gemv_rounds_max_k and not norm else 1


def gemv_warps(T: int, cfg: KernelConfig = DEFAULT) -> int:
    """Warps a program at a step of T tokens: cfg.gemv_warps at 1, cfg.gemv_multi_token_warps beyond."""
    return cfg.gemv_warps if T <= 1 else cfg.gemv_multi_token_warps


def gemv_plan(T: int, K: int, silu: bool, norm: bool = False, cfg: KernelConfig = DEFAULT) -> dict:
    """The kernel's KP (K padded to a power of 2), ROUNDS (gemv_rounds) and BLOCK_N: cfg.gemv_tile
    weights a program (gate and up rows counted), split into ROUNDS blocks, over KP; at least 1."""
    kp = triton.next_power_of_2(K)
    rounds = gemv_rounds(T, K, norm, cfg.gemv_rounds, cfg)
    return dict(KP=kp, ROUNDS=rounds, BLOCK_N=max(1, cfg.gemv_tile // rounds // kp // (2 if silu else 1)))


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
    plan = gemv_plan(T, K, silu, add_norm is not None, cfg)
    pdl = uses_pdl(x.device, cfg)
    r, nw, eps, r_out = add_norm if add_norm is not None else (x, x, 0.0, x)
    _gemv_kernel[(triton.cdiv(N, plan["BLOCK_N"] * plan["ROUNDS"]),)](
        x, weight, x if bias is None else bias, out, r, nw, r_out, eps, N, x.stride(0), weight.stride(0),
        out.stride(0), r.stride(0), r_out.stride(0), K=K, M=T, HAS_BIAS=bias is not None, SILU=silu,
        NORM=add_norm is not None, PDL=pdl, FENCE=x.is_cuda and plan["ROUNDS"] > 1, num_warps=gemv_warps(T, cfg),
        **plan, **launch_args(pdl))
    return out
