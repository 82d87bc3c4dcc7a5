"""The weight-only FP8 (e4m3) GEMV of decode steps of 1..cfg.fp8_gemv_max_tokens tokens:
y = x @ W^T (+ b) with W = float(weight) * weight_scale per output row and group of `group`
K-columns (kernels/fp8_reference.py states the arithmetic), x unquantized.

    fp8_gemv(x [M, K], weight e4m3 [N, K], weight_scale float32 [N, KG], group, bias, silu, cfg) -> [M, N]

A program holds BLOCK_N whole e4m3 rows in registers (cfg.fp8_gemv_tile weights), loaded before
the PDL wait as kernels/gemv.py's bf16 GEMV does, so the next projection's weights stream in while
the one before drains. A row is held as [chunks, CH] with CH contiguous columns (16: one 16-byte
load a thread) inside one scale group: the products of a chunk are summed inside the thread (fp32
FMAs, no shuffles), the chunk's sum is multiplied by its group's scale, and only the sum over the
chunks crosses threads, once per row. (The session-32 kernel held [rows, groups, 128] with a
runtime K: masked byte loads, a cross-thread sum per group, 255 registers and spills; its sm90
SASS had ~24 instructions a weight, this one ~4. benchmarks/ab_fp8_gemv.py on an H100: a layer's
four projections at 1 token 85.0 us against 87.5 (floor 75.0), at 2 tokens 124.6 against 142.3.)

e4m3 -> fp32 is the compiler's conversion (sm90: e4m3x2 -> f16x2, then f16 -> f32). Moving the
bits instead (byte s.eeee.mmm -> fp16 s.0eeee.mmm0000000, the value times 2^-8 exactly, then
f16 -> f32) took twice the instructions a weight and was 1.2x slower (benchmarks/RESULTS.md).

x (KernelConfig.fp8_gemv_x_rows_max): blocks of at most that many rows load x once a row, as
[chunks, rows, CH] pointers beside the weights', so that x arrives in the weights' own layout (16
columns a thread); loaded once as [chunks, CH], it comes 8 columns a thread (16-byte loads of bf16)
and the compiler exchanges halves between neighbouring threads (SHFL + two FSEL a value). The copies
come from L1. Larger blocks keep the one load, whose exchange their rows share. With
KernelConfig.fp8_gemv_x_once (on), a 1-token program of several rounds loads
and exchanges x once after its PDL wait for all its rounds, instead of once a round (this takes
precedence over the copy a row).

Rounds (KernelConfig.fp8_gemv_rounds, bounded as kernels/gemv.py's gemv_rounds): a program takes its
tile as that many blocks of rows in turn, the next block's loads issued before the products of the one
before, as the bf16 GEMV does.

add_norm: the residual add + RMSNorm before the projection in the prologue, as kernels/gemv.py
does it (every program normalizes the rows from h and the residual, program 0 writes h + residual
out of place); the sum of squares runs over the [chunks, CH] layout of x here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import (DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, loads_fence,
                                          silu_mul, uses_pdl)
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.gemv import gemv_rounds
from model_wrapper.kernels.norm import add_rms_norm_row


@triton.jit
def _chunk_sums(w, x):
    """[chunks, rows, CH] e4m3 times x [chunks, 1 or rows, CH] fp32 -> [chunks, rows] fp32."""
    return tl.sum(w.to(tl.float32) * x, axis=2)


@triton.jit
def _x_chunks(x_row, K: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr):
    """One token's x (x_row: its first column) as fp32 [chunks, 1, CH], chunks past K zero."""
    ch = tl.arange(0, NCH)
    x = tl.load(x_row + ch[:, None] * CH + tl.arange(0, CH)[None, :], mask=(ch * CH < K)[:, None], other=0.0)
    return x.to(tl.float32)[:, None, :]


@triton.jit
def _row_dots(w, x, s, PER_GROUP: tl.constexpr):
    """The rows' dot products with x, scaled: per chunk (s [chunks, rows], a scale per group) before
    the sum over chunks, or once after it (s [rows], a scale per row) -> [rows] fp32."""
    part = _chunk_sums(w, x)
    if PER_GROUP:
        dots = tl.sum(part * s, axis=0)
    else:
        dots = tl.sum(part, axis=0) * s
    return dots


@triton.jit
def _block_load(w_ptr, s_ptr, b_ptr, rows, N, stride_w, stride_s, K: tl.constexpr, GROUP: tl.constexpr,
                CH: tl.constexpr, NCH: tl.constexpr, SILU: tl.constexpr, HAS_BIAS: tl.constexpr):
    """What a block of rows reads before its products: w, wu [NCH, BLOCK_N, CH] e4m3 (wu: the up rows
    with SILU, else w), their scales s, su ([NCH, BLOCK_N] a chunk's group scale, or [BLOCK_N] one a
    row) and the bias b, bu (0.0 where absent). Rows past N read row 0 (they are not stored)."""
    safe = tl.where(rows < N, rows, 0).to(tl.int64)
    ch = tl.arange(0, NCH)
    cols = ch[:, None] * CH + tl.arange(0, CH)[None, :]  # [NCH, CH]
    ch_ok = ch * CH < K
    # [NCH, BLOCK_N, CH], chunks first: the compiler then spreads a warp's threads over chunks and
    # gives a thread several rows of the same chunks, which share its x values (converted once)
    w_at = w_ptr + safe[None, :, None] * stride_w + cols[:, None, :]
    if NCH * CH == K:
        w = tl.load(w_at)
        wu = w
        if SILU:
            wu = tl.load(w_at + N * stride_w)
    else:
        w = tl.load(w_at, mask=ch_ok[:, None, None], other=0.0)
        wu = w
        if SILU:
            wu = tl.load(w_at + N * stride_w, mask=ch_ok[:, None, None], other=0.0)
    su, b, bu = 0.0, 0.0, 0.0
    if GROUP < K:  # the scale of each chunk's group: [NCH, BLOCK_N]
        s_at = s_ptr + safe[None, :] * stride_s + (ch * CH // GROUP)[:, None]
        s = tl.load(s_at, mask=ch_ok[:, None], other=0.0)
        if SILU:
            su = tl.load(s_at + N * stride_s, mask=ch_ok[:, None], other=0.0)
    else:  # one scale a row
        s = tl.load(s_ptr + safe * stride_s)
        if SILU:
            su = tl.load(s_ptr + (safe + N) * stride_s)
    if HAS_BIAS:
        b = tl.load(b_ptr + safe).to(tl.float32)
        if SILU:
            bu = tl.load(b_ptr + N + safe).to(tl.float32)
    return w, wu, s, su, b, bu


@triton.jit
def _block_out(x_ptr, o_ptr, r_ptr, ro_ptr, nw, eps, rows, N, stride_x, stride_o, stride_r, stride_ro, w, wu, s, su,
               b, bu, K: tl.constexpr, GROUP: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr, M: tl.constexpr,
               HAS_BIAS: tl.constexpr, SILU: tl.constexpr, NORM: tl.constexpr, STORE_R, XROWS: tl.constexpr,
               xpre, XONCE: tl.constexpr):
    """A block's products with each of the M tokens' x (NORM: nw * RMSNorm(x + r), with h + r stored to
    ro where STORE_R), scaled, its bias and SiLU epilogue, stored to its rows of o."""
    PER_GROUP: tl.constexpr = GROUP < K
    ch = tl.arange(0, NCH)
    cols = ch[:, None] * CH + tl.arange(0, CH)[None, :]  # [NCH, CH]
    dtype = o_ptr.dtype.element_ty
    for m in tl.static_range(M):
        if NORM:
            x = add_rms_norm_row(x_ptr + m * stride_x, r_ptr + m * stride_r, ro_ptr + m * stride_ro, nw, cols, K, eps,
                                 STORE_R, False).to(tl.float32)[:, None, :]
        elif XONCE:
            x = xpre
        else:
            if XROWS:
                # x as [chunks, rows, CH], each row's copy loaded (from L1) in the weights' own layout: no exchange
                # of x's halves between threads (SHFL + FSEL) before the products
                zr = (rows * 0)[None, :, None]
                x = tl.load(x_ptr + m * stride_x + cols[:, None, :] + zr, mask=(ch * CH < K)[:, None, None],
                            other=0.0).to(tl.float32)
            else:
                x = _x_chunks(x_ptr + m * stride_x, K, CH, NCH)
        acc = _row_dots(w, x, s, PER_GROUP)
        if HAS_BIAS:
            acc += b
        if SILU:
            up = _row_dots(wu, x, su, PER_GROUP)
            if HAS_BIAS:
                up += bu
            acc = silu_mul(acc.to(dtype), up.to(dtype))
        tl.store(o_ptr + m * stride_o + rows, acc.to(dtype), mask=rows < N)


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, r_ptr, nw_ptr, ro_ptr, eps, N, stride_x, stride_w, stride_s,
                     stride_o, stride_r, stride_ro, K: tl.constexpr, GROUP: tl.constexpr, CH: tl.constexpr,
                     NCH: tl.constexpr, M: tl.constexpr, BLOCK_N: tl.constexpr, ROUNDS: tl.constexpr,
                     HAS_BIAS: tl.constexpr, SILU: tl.constexpr, NORM: tl.constexpr, PDL: tl.constexpr,
                     FENCE: tl.constexpr, XROWS: tl.constexpr, XONCE: tl.constexpr):
    # chunks [NCH] (K / CH padded to a power of 2) x CH columns; CH divides K and the group, so a
    # chunk is all in or all out (the mask is constant along it: 16-byte loads) and has one scale.
    # SILU as in kernels/gemv.py: gate rows [0, N), up rows [N, 2N) of the weight, scales and bias.
    # A program takes ROUNDS blocks of BLOCK_N rows in turn, as kernels/gemv.py's (FENCE likewise).
    rows = tl.program_id(0) * ROUNDS * BLOCK_N + tl.arange(0, BLOCK_N)
    blk = _block_load(w_ptr, s_ptr, b_ptr, rows, N, stride_w, stride_s, K, GROUP, CH, NCH, SILU, HAS_BIAS)
    nw = 0.0
    if NORM:  # x is h; the operand is nw * RMSNorm(h + r) (module docstring)
        ch = tl.arange(0, NCH)
        nw = tl.load(nw_ptr + ch[:, None] * CH + tl.arange(0, CH)[None, :], mask=(ch * CH < K)[:, None], other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete (the weights were read before it)
    xpre = 0.0
    if XONCE:  # one token's x for every round (module docstring)
        xpre = _x_chunks(x_ptr, K, CH, NCH)
    for j in tl.static_range(ROUNDS):
        nxt = blk
        if j + 1 < ROUNDS:
            nxt = _block_load(w_ptr, s_ptr, b_ptr, rows + BLOCK_N, N, stride_w, stride_s, K, GROUP, CH, NCH, SILU,
                              HAS_BIAS)
            if FENCE:
                loads_fence()
        w, wu, s, su, b, bu = blk
        _block_out(x_ptr, o_ptr, r_ptr, ro_ptr, nw, eps, rows, N, stride_x, stride_o, stride_r, stride_ro, w, wu, s,
                   su, b, bu, K, GROUP, CH, NCH, M, HAS_BIAS, SILU, NORM, (tl.program_id(0) == 0) & (j == 0), XROWS,
                   xpre, XONCE)
        blk = nxt
        rows += BLOCK_N


def gemv_chunk(K: int, group: int, most: int = 16) -> int:
    """Columns a thread sums alone: the largest power of 2 up to `most` dividing K and (with
    several groups a row) the group, so that a chunk is whole and has one scale."""
    step = min(most, K & -K)
    if group < K:
        step = min(step, group & -group)
    return step


def gemv_padded_k(K: int, group: int, cfg: KernelConfig = DEFAULT) -> int:
    """A row as a program holds it: K / chunk chunks padded to a power of 2, times the chunk."""
    ch = gemv_chunk(K, group, cfg.fp8_gemv_chunk)
    return triton.next_power_of_2(K // ch) * ch


def gemv_x_once(M: int, rounds: int, norm: bool, cfg: KernelConfig = DEFAULT) -> bool:
    """The kernel's XONCE: one token's x loaded once for a program's rounds (cfg.fp8_gemv_x_once), without the norm
    prologue."""
    return cfg.fp8_gemv_x_once and M == 1 and rounds > 1 and not norm


def gemv_x_rows(block_n: int, norm: bool, cfg: KernelConfig = DEFAULT) -> bool:
    """The kernel's XROWS: x loaded a copy for each row of a block of at most cfg.fp8_gemv_x_rows_max rows, in the
    weights' layout (module docstring), without the norm prologue."""
    return not norm and 0 < block_n <= cfg.fp8_gemv_x_rows_max


def gemv_block_n(M: int, K: int, group: int, silu: bool, cfg: KernelConfig = DEFAULT, rounds: int = 1) -> int:
    """Rows of a block: cfg.fp8_gemv_tile weight-tokens (rows x padded row x tokens; gate_up's rows
    count twice, gate and up) split into `rounds` blocks, a power of 2, at least 1. Per token: each
    token's x and sums take registers beside the weights' (at 2 tokens a full tile spilled on sm90)."""
    per_row = gemv_padded_k(K, group, cfg) * (2 if silu else 1) * max(M, 1)
    return triton.next_power_of_2(max(1, cfg.fp8_gemv_tile // rounds // per_row) + 1) // 2


def fp8_gemv(x, weight, weight_scale, group, bias=None, silu=False, cfg: KernelConfig = DEFAULT,
             add_norm: tuple | None = None) -> torch.Tensor:
    """x [M, K] (M <= a few tokens, unit column stride) -> [M, N] (silu: [M, N // 2]) in x's dtype.
    add_norm (residual [M, K], norm_weight [K], eps, residual_out [M, K]) as kernels/gemv.gemv's:
    the product is of norm_weight * RMSNorm(x + residual), x + residual goes to residual_out."""
    M, K = x.shape
    N = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if not M:
        return out
    ch = gemv_chunk(K, group, cfg.fp8_gemv_chunk)
    nch = triton.next_power_of_2(K // ch)
    rounds = gemv_rounds(M, K, add_norm is not None, cfg.fp8_gemv_rounds, cfg)
    block_n = gemv_block_n(M, K, group, silu, cfg, rounds)
    pdl = uses_pdl(x.device, cfg)
    r, nw, eps, r_out = add_norm if add_norm is not None else (x, x, 0.0, x)
    _fp8_gemv_kernel[(triton.cdiv(N, block_n * rounds),)](
        x, weight, weight_scale, x if bias is None else bias, out, r, nw, r_out, eps, N, x.stride(0), weight.stride(0),
        weight_scale.stride(0), out.stride(0), r.stride(0), r_out.stride(0), K=K, GROUP=min(group, K), CH=ch,
        NCH=nch, M=M, BLOCK_N=block_n, ROUNDS=rounds, HAS_BIAS=bias is not None, SILU=silu, NORM=add_norm is not None,
        PDL=pdl, FENCE=x.is_cuda and rounds > 1, XROWS=gemv_x_rows(block_n, add_norm is not None, cfg),
        XONCE=gemv_x_once(M, rounds, add_norm is not None, cfg), num_warps=cfg.fp8_gemv_warps, **launch_args(pdl))
    return out
