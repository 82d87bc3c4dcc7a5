"""The weight-only FP8 (e4m3) GEMV of decode steps of 1..cfg.fp8_gemv_max_tokens tokens (gemv_max_tokens):
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

Rows of K columns that are not a power of 2 (down: K = 14336): by default the chunks are padded to a
power of 2 (1024 chunks of 16 for 896: 2048 columns of masked loads, 181 sm90 registers a thread, 2
programs an SM). fp8_gemv_segments holds such a row as up to three power-of-2 segments of chunks
(512 + 256 + 128; K / CH's set bits), each its own tile loaded before the PDL wait, their sums added
after it (127 registers; the sum over a row's chunks then runs in another order: fp32 rounding). Rows
wider than fp8_gemv_wide_k take their own chunk, tile, warps and token bound (fp8_gemv_wide_*).

fp8_gemv_rounds (fp8_gemv_wide_rounds): a program takes that many blocks of BLOCK_N rows in turn,
issuing block j + 1's loads before block j's products, so that after the PDL wait its loads keep
streaming while it computes (with one block, every resident program computes at once after the
wait and none loads); its registers hold two blocks. Not with add_norm (one block).

add_norm: the residual add + RMSNorm before the projection in the prologue, as kernels/gemv.py
does it (every program normalizes the rows from h and the residual, program 0 writes h + residual
out of place); the sum of squares runs over the [chunks, CH] layout of x here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, silu_mul, uses_pdl
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.gemv import pow2_parts
from model_wrapper.kernels.norm import add_rms_norm_row


@triton.jit
def _loads_fence():
    """A CTA-scope fence: ptxas issues every load before it ahead of it (without it, it sinks the next
    block's loads into the products of the one before; kernels/moe_gemv.py found the same). CUDA only."""
    tl.inline_asm_elementwise("fence.acq_rel.cta; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _chunk_sums(w, x):
    """[chunks, rows, CH] e4m3 times x [chunks, 1, CH] fp32 -> [chunks, rows] fp32."""
    return tl.sum(w.to(tl.float32) * x, axis=2)


@triton.jit
def _row_dots(w, x, s, PER_GROUP: tl.constexpr):
    """The rows' dot products with x, scaled per chunk (s [chunks, rows], a scale per group) before the
    sum over chunks, or (PER_GROUP off) not scaled (the caller multiplies by the row's scale once,
    after the sum over the row's segments) -> [rows] fp32."""
    part = _chunk_sums(w, x)
    if PER_GROUP:
        dots = tl.sum(part * s, axis=0)
    else:
        dots = tl.sum(part, axis=0)
    return dots


@triton.jit
def _seg_cols(C0: tl.constexpr, NS: tl.constexpr, CH: tl.constexpr):
    """A segment's chunks [NS] (from chunk C0) and their columns [NS, CH]."""
    ch = C0 + tl.arange(0, NS)
    return ch, ch[:, None] * CH + tl.arange(0, CH)[None, :]


@triton.jit
def _seg_load(w_ptr, s_ptr, safe, N, stride_w, stride_s, K: tl.constexpr, GROUP: tl.constexpr, C0: tl.constexpr,
              NS: tl.constexpr, CH: tl.constexpr, SILU: tl.constexpr, PER_GROUP: tl.constexpr):
    """One segment of the rows' weights: chunks [C0, C0 + NS) -> w, wu [NS, BLOCK_N, CH] (wu: the up
    rows with SILU, else w) and (PER_GROUP) the chunks' group scales s, su [NS, BLOCK_N] (else 0).
    Chunks at or past K // CH (the padded layout's last segment) load zeros."""
    ch, cols = _seg_cols(C0, NS, CH)
    # [NS, BLOCK_N, CH], chunks first: the compiler then spreads a warp's threads over chunks and
    # gives a thread several rows of the same chunks, which share its x values (converted once)
    w_at = w_ptr + safe[None, :, None] * stride_w + cols[:, None, :]
    if (C0 + NS) * CH <= K:  # a whole segment: no mask (16-byte loads)
        w = tl.load(w_at)
        wu = w
        if SILU:
            wu = tl.load(w_at + N * stride_w)
    else:
        ok = (ch * CH < K)[:, None, None]
        w = tl.load(w_at, mask=ok, other=0.0)
        wu = w
        if SILU:
            wu = tl.load(w_at + N * stride_w, mask=ok, other=0.0)
    s = 0.0
    su = 0.0
    if PER_GROUP:  # the scale of each chunk's group: [NS, BLOCK_N]
        s_at = s_ptr + safe[None, :] * stride_s + (ch * CH // GROUP)[:, None]
        s = tl.load(s_at, mask=(ch * CH < K)[:, None], other=0.0)
        if SILU:
            su = tl.load(s_at + N * stride_s, mask=(ch * CH < K)[:, None], other=0.0)
    return w, wu, s, su


@triton.jit
def _seg_dots(x_row, w, wu, s, su, K: tl.constexpr, C0: tl.constexpr, NS: tl.constexpr, CH: tl.constexpr,
              SILU: tl.constexpr, PER_GROUP: tl.constexpr):
    """One token's x over a segment's chunks times its weights -> the gate (or only) and up rows' dots
    [BLOCK_N] (_row_dots; up: the gate's dots again without SILU)."""
    ch, cols = _seg_cols(C0, NS, CH)
    if (C0 + NS) * CH <= K:
        x = tl.load(x_row + cols).to(tl.float32)[:, None, :]
    else:
        x = tl.load(x_row + cols, mask=(ch * CH < K)[:, None], other=0.0).to(tl.float32)[:, None, :]
    acc = _row_dots(w, x, s, PER_GROUP)
    up = acc
    if SILU:
        up = _row_dots(wu, x, su, PER_GROUP)
    return acc, up


@triton.jit
def _block_load(w_ptr, s_ptr, b_ptr, rows, N, stride_w, stride_s, K: tl.constexpr, GROUP: tl.constexpr,
                CH: tl.constexpr, NCH: tl.constexpr, NCH1: tl.constexpr, NCH2: tl.constexpr, SILU: tl.constexpr,
                HAS_BIAS: tl.constexpr):
    """Everything a block of rows reads before its products: each segment's weights and group scales
    (_seg_load; 0.0 for an absent segment), the rows' scales without groups, and the bias (0.0 where
    absent). Rows past N read row 0 (they are not stored)."""
    PER_GROUP: tl.constexpr = GROUP < K
    safe = tl.where(rows < N, rows, 0).to(tl.int64)
    w0, wu0, s0, su0 = _seg_load(w_ptr, s_ptr, safe, N, stride_w, stride_s, K, GROUP, 0, NCH, CH, SILU, PER_GROUP)
    w1, wu1, s1, su1 = 0.0, 0.0, 0.0, 0.0
    if NCH1:
        w1, wu1, s1, su1 = _seg_load(w_ptr, s_ptr, safe, N, stride_w, stride_s, K, GROUP, NCH, NCH1, CH, SILU,
                                     PER_GROUP)
    w2, wu2, s2, su2 = 0.0, 0.0, 0.0, 0.0
    if NCH2:
        w2, wu2, s2, su2 = _seg_load(w_ptr, s_ptr, safe, N, stride_w, stride_s, K, GROUP, NCH + NCH1, NCH2, CH,
                                     SILU, PER_GROUP)
    s, su, b, bu = 0.0, 0.0, 0.0, 0.0
    if not PER_GROUP:  # one scale a row
        s = tl.load(s_ptr + safe * stride_s)
        if SILU:
            su = tl.load(s_ptr + (safe + N) * stride_s)
    if HAS_BIAS:
        b = tl.load(b_ptr + safe).to(tl.float32)
        if SILU:
            bu = tl.load(b_ptr + N + safe).to(tl.float32)
    return w0, wu0, s0, su0, w1, wu1, s1, su1, w2, wu2, s2, su2, s, su, b, bu


@triton.jit
def _block_out(x_ptr, o_ptr, r_ptr, ro_ptr, nw, eps, rows, N, stride_x, stride_o, stride_r, stride_ro,
               w0, wu0, s0, su0, w1, wu1, s1, su1, w2, wu2, s2, su2, s, su, b, bu, K: tl.constexpr,
               GROUP: tl.constexpr, CH: tl.constexpr, NCH: tl.constexpr, NCH1: tl.constexpr, NCH2: tl.constexpr,
               M: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, NORM: tl.constexpr, STORE_R):
    """A block's products with each of the M tokens' x (NORM: nw * RMSNorm(x + r), h + r stored to
    ro where STORE_R), its scales, bias and SiLU epilogue, stored to its rows of o."""
    PER_GROUP: tl.constexpr = GROUP < K
    dtype = o_ptr.dtype.element_ty
    for m in tl.static_range(M):
        if NORM:
            ch, cols = _seg_cols(0, NCH, CH)
            xn = add_rms_norm_row(x_ptr + m * stride_x, r_ptr + m * stride_r, ro_ptr + m * stride_ro, nw, cols, K,
                                  eps, STORE_R, False).to(tl.float32)[:, None, :]
            acc = _row_dots(w0, xn, s0, PER_GROUP)
            up = acc
            if SILU:
                up = _row_dots(wu0, xn, su0, PER_GROUP)
        else:
            acc, up = _seg_dots(x_ptr + m * stride_x, w0, wu0, s0, su0, K, 0, NCH, CH, SILU, PER_GROUP)
            if NCH1:
                a1, u1 = _seg_dots(x_ptr + m * stride_x, w1, wu1, s1, su1, K, NCH, NCH1, CH, SILU, PER_GROUP)
                acc += a1
                up += u1
            if NCH2:
                a2, u2 = _seg_dots(x_ptr + m * stride_x, w2, wu2, s2, su2, K, NCH + NCH1, NCH2, CH, SILU,
                                   PER_GROUP)
                acc += a2
                up += u2
        if not PER_GROUP:
            acc = acc * s
            if SILU:
                up = up * su
        if HAS_BIAS:
            acc += b
        if SILU:
            if HAS_BIAS:
                up += bu
            acc = silu_mul(acc.to(dtype), up.to(dtype))
        tl.store(o_ptr + m * stride_o + rows, acc.to(dtype), mask=rows < N)


@triton.jit
def _fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, r_ptr, nw_ptr, ro_ptr, eps, N, stride_x, stride_w, stride_s,
                     stride_o, stride_r, stride_ro, K: tl.constexpr, GROUP: tl.constexpr, CH: tl.constexpr,
                     NCH: tl.constexpr, NCH1: tl.constexpr, NCH2: tl.constexpr, M: tl.constexpr,
                     BLOCK_N: tl.constexpr, ROUNDS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
                     NORM: tl.constexpr, PDL: tl.constexpr, FENCE: tl.constexpr):
    # A row is up to three segments of NCH, NCH1, NCH2 chunks (powers of 2; NCH1 / NCH2 0: absent) of
    # CH columns. Unpadded (gemv_segments): they add up to K / CH. Padded: one segment, K / CH chunks
    # padded to a power of 2, the chunks past K masked. CH divides K and the group, so a chunk is all
    # in or all out (the mask is constant along it: 16-byte loads) and has one scale. SILU as in
    # kernels/gemv.py: gate rows [0, N), up rows [N, 2N) of the weight, scales and bias. NORM: one
    # segment (the prologue normalizes the row as one tile). A program takes ROUNDS blocks of BLOCK_N
    # rows in turn: block j + 1's loads are issued before block j's products (registers: two blocks),
    # so that after the PDL wait its loads stream while it computes; the first block loads before it.
    # FENCE (CUDA): a fence after those loads keeps them ahead of the products.
    first = tl.program_id(0) * ROUNDS * BLOCK_N
    rows = first + tl.arange(0, BLOCK_N)
    blk = _block_load(w_ptr, s_ptr, b_ptr, rows, N, stride_w, stride_s, K, GROUP, CH, NCH, NCH1, NCH2, SILU,
                      HAS_BIAS)
    nw = 0.0
    if NORM:  # x is h; the operand is nw * RMSNorm(h + r) (module docstring)
        ch, cols = _seg_cols(0, NCH, CH)
        nw = tl.load(nw_ptr + cols, mask=(ch * CH < K)[:, None], other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x is complete (the weights were read before it)
    for j in tl.static_range(ROUNDS):
        nxt = blk
        if j + 1 < ROUNDS:
            nxt = _block_load(w_ptr, s_ptr, b_ptr, rows + BLOCK_N, N, stride_w, stride_s, K, GROUP, CH, NCH, NCH1,
                              NCH2, SILU, HAS_BIAS)
            if FENCE:
                _loads_fence()
        w0, wu0, s0, su0, w1, wu1, s1, su1, w2, wu2, s2, su2, s, su, b, bu = blk
        _block_out(x_ptr, o_ptr, r_ptr, ro_ptr, nw, eps, rows, N, stride_x, stride_o, stride_r, stride_ro,
                   w0, wu0, s0, su0, w1, wu1, s1, su1, w2, wu2, s2, su2, s, su, b, bu, K, GROUP, CH, NCH, NCH1, NCH2,
                   M, HAS_BIAS, SILU, NORM, (tl.program_id(0) == 0) & (j == 0))
        blk = nxt
        rows += BLOCK_N


def gemv_chunk(K: int, group: int, most: int = 16) -> int:
    """Columns a thread sums alone: the largest power of 2 up to `most` dividing K and (with
    several groups a row) the group, so that a chunk is whole and has one scale."""
    step = min(most, K & -K)
    if group < K:
        step = min(step, group & -group)
    return step


def _wide(K: int, cfg: KernelConfig) -> bool:
    return K > cfg.fp8_gemv_wide_k


def gemv_max_tokens(K: int, cfg: KernelConfig = DEFAULT) -> int:
    """The most tokens a step may have for this GEMV on rows of K columns (fp8_gemv_max_tokens;
    rows wider than fp8_gemv_wide_k: fp8_gemv_wide_max_tokens)."""
    return cfg.fp8_gemv_wide_max_tokens if _wide(K, cfg) else cfg.fp8_gemv_max_tokens


def gemv_padded_k(K: int, group: int, cfg: KernelConfig = DEFAULT) -> int:
    """A row as the padded layout holds it: K / chunk chunks padded to a power of 2, times the chunk
    (the most columns a program may hold a row: fp8.path_for's bound against fp8_gemv_max_k)."""
    ch = gemv_chunk(K, group, cfg.fp8_gemv_wide_chunk if _wide(K, cfg) else cfg.fp8_gemv_chunk)
    return triton.next_power_of_2(K // ch) * ch


def gemv_plan(M: int, K: int, group: int, silu: bool, norm: bool = False, cfg: KernelConfig = DEFAULT) -> dict:
    """How fp8_gemv launches on M tokens and rows of K columns: the kernel's CH, NCH, NCH1, NCH2 and
    BLOCK_N, and num_warps. Rows wider than fp8_gemv_wide_k take the wide chunk / tile / warps.
    Segments (fp8_gemv_segments, not with the norm prologue): K / CH chunks as up to three powers
    of 2 (14336 / 16 = 512 + 256 + 128), no padded columns; else one segment of K / CH chunks
    padded to a power of 2. BLOCK_N: the tile (weight-tokens: rows x held row x tokens; gate_up's
    rows count twice, gate and up) over a row, a power of 2, at least 1. Per token: each token's x
    and sums take registers beside the weights' (at 2 tokens a full tile spilled on sm90)."""
    wide = _wide(K, cfg)
    ch = gemv_chunk(K, group, cfg.fp8_gemv_wide_chunk if wide else cfg.fp8_gemv_chunk)
    tile = cfg.fp8_gemv_wide_tile if wide else cfg.fp8_gemv_tile
    segs = pow2_parts(K // ch) if cfg.fp8_gemv_segments and not norm else None
    segs = segs or (triton.next_power_of_2(K // ch),)
    segs = tuple(segs) + (0,) * (3 - len(segs))
    per_row = sum(segs) * ch * (2 if silu else 1) * max(M, 1)
    block_n = triton.next_power_of_2(max(1, tile // per_row) + 1) // 2
    return dict(CH=ch, NCH=segs[0], NCH1=segs[1], NCH2=segs[2], BLOCK_N=block_n,
                ROUNDS=1 if norm else (cfg.fp8_gemv_wide_rounds if wide else cfg.fp8_gemv_rounds),
                num_warps=cfg.fp8_gemv_wide_warps if wide else cfg.fp8_gemv_warps)


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
    plan = gemv_plan(M, K, group, silu, add_norm is not None, cfg)
    pdl = uses_pdl(x.device, cfg)
    r, nw, eps, r_out = add_norm if add_norm is not None else (x, x, 0.0, x)
    _fp8_gemv_kernel[(triton.cdiv(N, plan["BLOCK_N"] * plan["ROUNDS"]),)](
        x, weight, weight_scale, x if bias is None else bias, out, r, nw, r_out, eps, N, x.stride(0), weight.stride(0),
        weight_scale.stride(0), out.stride(0), r.stride(0), r_out.stride(0), K=K, GROUP=min(group, K), M=M,
        HAS_BIAS=bias is not None, SILU=silu, NORM=add_norm is not None, PDL=pdl,
        FENCE=x.is_cuda and plan["ROUNDS"] > 1, **plan, **launch_args(pdl))
    return out
