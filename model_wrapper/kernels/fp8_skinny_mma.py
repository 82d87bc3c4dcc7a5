"""FP8 linears at 3-32 tokens (up to 64: KernelConfig.fp8_skinny_mma_max_tokens,
fp8_skinny_mma_row_max_tokens) on the e4m3 tensor cores
(W8A8): the "skinny_mma" path of kernels/fp8.py.

    fp8_skinny_mma(x, weight, weight_scale, group, bias=None, silu=False, cfg) -> [M, N] (silu: [M, N // 2])

The weight-only "skinny" kernel (kernels/fp8.py) upcasts every e4m3 weight to bf16 in registers
before a bf16 product: at 3-16 tokens that costs about as much as reading twice the bytes (16
tokens, H100: the four Llama-3-8B projections 133 us against bf16's 161, against a floor of 73).
Here the weights reach the tensor cores as they are stored: x is quantized first, as the prefill
paths quantize activations (fp8_act.quantize_fp8_per_token_group: the reference's scale = max(amax,
MIN_AMAX) / 448, IEEE division, round to nearest even; one small kernel), per token and 128 columns
for block weights (the block prefill path's operand), per token for a scale a weight row (per
channel / tensor: the row-wise prefill path's), then e4m3 is multiplied by e4m3 with fp32 sums:

    block:        y[t, n] = sum_g sx[t, g] * ws[n, g] * sum_{k in g} e4m3(x)[t, k] * weight[n, k]
    a scale a row: y[t, n] = sx[t] * ws[n] * sum_k e4m3(x)[t, k] * weight[n, k]

(ws[n, g]: the weight's scale of row n over the 128 columns of g; weight groups may be any multiple of
128.) The W rows are the MMA's M side (BLOCK_N a program), the tokens, padded to 16, its N side,
BLOCK_K columns a step: for block weights one product per 128 columns, scaled in fp32 before it joins
the sum; for a scale a row the products accumulate in place (in the tensor cores' FP8 accumulator,
which keeps fewer bits than fp32, as cuBLASLt's fast accumulation: a [28672, 4096] product measured
2.9e-3 off, inside bf16's output rounding but not fp16's; so fp8.path_for takes this path for a scale
a row with bf16 activations only), scaled once at the end. (Quantizing x
inside every program instead, a 128-column amax and divisions each K step, measured 1.3-9x slower
than the weight-only kernel: H100, session 39.) SiLU-and-mul for gate_up (gate rows and their up rows
in one program) as the other skinny kernels: each product rounded to x's dtype, then silu_mul.

This is the prefill paths' arithmetic (activations quantized) rather than the weight-only kernels'
(x unquantized), as vLLM's FP8 linears do at every size; the GEMV (1-2 tokens) stays weight-only.

The launch (session 45): sm90 builds wgmma e4m3 products only for tiles of 64 weight rows or more; a 32-row tile
becomes mma.sync products on fp16 conversions of both operands (and at 4 warps computes it twice), so rows are halved
only down to 64 programs (KernelConfig.fp8_skinny_mma_min_programs). One program a row tile left Llama-3-8B's o and
down at 64 programs streaming their whole K, and block weights wait on each 128-column product before scaling it, so
their K is split (split_k: fp8_skinny_mma_split_programs) and the last of a row tile's programs to finish (an atomic
count it resets) adds the parts' fp32 sums in split order, whichever program that is: the same sums run to run.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import (DEFAULT, device_counters, last_to_arrive, launch_args, max_shared_memory,
                                         skinny_rows, skinny_store, sm90, stages_that_fit, tma_fits, uses_pdl,
                                         weight_descriptor)
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.fp8_act import quantize_fp8_per_token_group
from model_wrapper.kernels.fp8_reference import QuantizedActivation

QGROUP = 128  # the activation's quantization group (columns): a K step
MAX_TOKENS = 64  # the token tile (BM) is M rounded up to 16, 32 or 64
MAX_SPLIT_TILES = 1 << 16  # row tiles a split launch may have: its counters (common.device_counters)


@triton.jit
def _fp8_skinny_mma_kernel(q_ptr, qs_ptr, w_ptr, s_ptr, b_ptr, o_ptr, M, N, K: tl.constexpr, stride_q, stride_qs,
                           stride_qg, stride_w, stride_s, stride_o, GROUP: tl.constexpr, PER_GROUP: tl.constexpr,
                           BM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                           SILU: tl.constexpr, PDL: tl.constexpr, SCALES_AHEAD: tl.constexpr = True,
                           ws_ptr=None, cnt_ptr=None, SPLIT: tl.constexpr = 1, SPLIT_COLS: tl.constexpr = 0,
                           w_desc=None, TMA_W: tl.constexpr = False):
    # PER_GROUP (block weights): x's scales per 128 columns, each 128-column sub-step its own product scaled by
    # x's and the weight's scales; else (a scale a weight row) one scale a token, the products summed in place
    # and scaled once at the end. SPLIT > 1: program (i, j) sums K columns [j * SPLIT_COLS, (j + 1) * SPLIT_COLS)
    # (whole K steps) of row tile i into ws, and the last of a tile's SPLIT programs to finish adds them in order.
    # TMA_W: the weight tiles through w_desc, a tensor descriptor of w [N (2N with SILU), K] with [ROWS, step] blocks
    # (rows past N: up's rows or the descriptor's zeros, never stored; columns past K: zeros)
    ROWS: tl.constexpr = BLOCK_N // 2 if SILU else BLOCK_N
    if SPLIT > 1:
        k_start = tl.program_id(1) * SPLIT_COLS
        k_end = tl.minimum(k_start + SPLIT_COLS, K)
    else:
        k_start = 0
        k_end = K
    # (PDL: waits for the quantize kernel that wrote x's e4m3 rows and scales)
    rows, live, w_rows, s_rows, toks, tok_ok = skinny_rows(w_ptr, s_ptr, stride_w, stride_s, N, M, ROWS, BM, PDL)
    acc = tl.zeros([ROWS, BM], dtype=tl.float32)
    up = tl.zeros([ROWS, BM], dtype=tl.float32)
    if PER_GROUP and SCALES_AHEAD:
        # x's and the weight's scales of a K step's 128-column groups ([BM, G], [ROWS, G]), loaded a step ahead: the
        # pipeliner stages the tiles' copies only, and a plain load used in its own step put a memory round trip in
        # every step (sm90 TTGIR, session 43)
        gs = tl.arange(0, BLOCK_K // 128)
        sx_next, sw_next, su_next = _group_scales(qs_ptr, s_rows, toks, tok_ok, k_start, gs, N, K, stride_qs,
                                                  stride_qg, stride_s, GROUP, SILU)
    for k in range(k_start, k_end, BLOCK_K):
        if PER_GROUP:
            if SCALES_AHEAD:
                sx_step, sw_step, su_step = sx_next, sw_next, su_next
                sx_next, sw_next, su_next = _group_scales(qs_ptr, s_rows, toks, tok_ok, k + BLOCK_K, gs, N, K,
                                                          stride_qs, stride_qg, stride_s, GROUP, SILU)
            for j in tl.static_range(BLOCK_K // 128):
                kk = k + j * 128 + tl.arange(0, 128)
                k_ok = kk < K
                xt = tl.trans(tl.load(q_ptr + toks[:, None] * stride_q + kk[None, :],
                                      mask=tok_ok[:, None] & k_ok[None, :], other=0.0))
                g_ok = k + j * 128 < K
                if SCALES_AHEAD:  # column j of the step's scales
                    scale = tl.sum(tl.where(gs[None, :] == j, sx_step, 0.0), axis=1)
                    sw = tl.sum(tl.where(gs[None, :] == j, sw_step, 0.0), axis=1)
                else:
                    scale = tl.load(qs_ptr + toks * stride_qs + (k + j * 128) // 128 * stride_qg, mask=tok_ok & g_ok,
                                    other=0.0)
                    sw = tl.load(s_rows + (k + j * 128) // GROUP, mask=g_ok, other=0.0)
                if TMA_W:
                    w = w_desc.load([tl.program_id(0) * ROWS, k + j * 128])
                else:
                    w = tl.load(w_rows + kk[None, :], mask=k_ok[None, :], other=0.0)
                acc += tl.dot(w, xt) * (sw[:, None] * scale[None, :])
                if SILU:
                    if TMA_W:
                        wu = w_desc.load([N + tl.program_id(0) * ROWS, k + j * 128])
                    else:
                        wu = tl.load(w_rows + N * stride_w + kk[None, :], mask=k_ok[None, :], other=0.0)
                    if SCALES_AHEAD:
                        su = tl.sum(tl.where(gs[None, :] == j, su_step, 0.0), axis=1)
                    else:
                        su = tl.load(s_rows + N * stride_s + (k + j * 128) // GROUP, mask=g_ok, other=0.0)
                    up += tl.dot(wu, xt) * (su[:, None] * scale[None, :])
        else:
            kk = k + tl.arange(0, BLOCK_K)
            k_ok = kk < K
            xt = tl.trans(tl.load(q_ptr + toks[:, None] * stride_q + kk[None, :], mask=tok_ok[:, None] & k_ok[None, :],
                                  other=0.0))
            if TMA_W:
                w = w_desc.load([tl.program_id(0) * ROWS, k])
            else:
                w = tl.load(w_rows + kk[None, :], mask=k_ok[None, :], other=0.0)
            acc = tl.dot(w, xt, acc)
            if SILU:
                if TMA_W:
                    wu = w_desc.load([N + tl.program_id(0) * ROWS, k])
                else:
                    wu = tl.load(w_rows + N * stride_w + kk[None, :], mask=k_ok[None, :], other=0.0)
                up = tl.dot(wu, xt, up)
    if not PER_GROUP:
        sx = tl.load(qs_ptr + toks * stride_qs, mask=tok_ok, other=0.0)[None, :]
        acc *= tl.load(s_rows)[:, None] * sx
        if SILU:
            up *= tl.load(s_rows + N * stride_s)[:, None] * sx
    if SPLIT > 1:
        # ws [SPLIT (x 2 with SILU: gate's, then up's), BM, N] fp32: this split's sums; the tile's last program to
        # arrive reads all SPLIT partials (through L2) and adds them in split order, whichever program that is
        slot = ws_ptr + toks[None, :] * N + rows[:, None]
        tl.store(slot + tl.program_id(1) * BM * N, acc, mask=live[:, None])
        if SILU:
            tl.store(slot + (SPLIT + tl.program_id(1)) * BM * N, up, mask=live[:, None])
        if last_to_arrive(cnt_ptr + tl.program_id(0), SPLIT):
            acc = tl.zeros([ROWS, BM], dtype=tl.float32)
            up = tl.zeros([ROWS, BM], dtype=tl.float32)
            for j in tl.static_range(SPLIT):
                acc += tl.load(slot + j * BM * N, mask=live[:, None], other=0.0, cache_modifier=".cg")
                if SILU:
                    up += tl.load(slot + (SPLIT + j) * BM * N, mask=live[:, None], other=0.0, cache_modifier=".cg")
            skinny_store(acc, up, b_ptr, o_ptr, rows, live, toks, tok_ok, N, stride_o, HAS_BIAS, SILU)
            tl.atomic_xchg(cnt_ptr + tl.program_id(0), 0)  # ready for the next launch (a graph replays this one)
    else:
        skinny_store(acc, up, b_ptr, o_ptr, rows, live, toks, tok_ok, N, stride_o, HAS_BIAS, SILU)


@triton.jit
def _group_scales(qs_ptr, s_rows, toks, tok_ok, k, gs, N, K, stride_qs, stride_qg, stride_s, GROUP: tl.constexpr,
                  SILU: tl.constexpr):
    """The scales of the 128-column groups gs of the K step at column k (0 past K): x's [BM, G], the weight rows'
    [ROWS, G] and (SILU) their up rows' (else the weight rows' again)."""
    col = k + gs * 128
    ok = col < K
    sx = tl.load(qs_ptr + toks[:, None] * stride_qs + (col // 128)[None, :] * stride_qg,
                 mask=tok_ok[:, None] & ok[None, :], other=0.0)
    sw = tl.load(s_rows[:, None] + (col // GROUP)[None, :], mask=ok[None, :], other=0.0)
    su = sw
    if SILU:
        su = tl.load(s_rows[:, None] + N * stride_s + (col // GROUP)[None, :], mask=ok[None, :], other=0.0)
    return sx, sw, su


def skinny_mma_fits(K: int, group: int) -> bool:
    """Whether the kernel takes a weight of K columns with scale group `group`: one scale a row (group >= K)
    or groups of a multiple of 128 columns (each K step inside one group); K a multiple of 16 (e4m3 rows
    of 16-byte aligned loads)."""
    return K % 16 == 0 and (group >= K or group % QGROUP == 0)


def skinny_mma_stages(cfg: KernelConfig, block_n: int, bm: int, block_k: int, shared: int) -> int:
    """cfg.fp8_skinny_mma_stages, fewer where that many K steps of e4m3 operands (block_n weight rows, gate's and
    up's together, and bm token rows of block_k bytes a step) would not fit `shared` bytes (max_shared_memory).
    At 64 tokens a scale a row, 5 steps of (128 + 64) x 256 bytes asked for 240 KiB and the launch failed
    (session 43); an sm89 GPU (99 KiB) holds 2-3 of the 16-token steps."""
    return stages_that_fit(cfg.fp8_skinny_mma_stages, (block_n + bm) * block_k, shared)


def fp8_skinny_mma(x, weight: torch.Tensor, weight_scale: torch.Tensor, group: int, bias: torch.Tensor | None = None,
                   silu: bool = False, cfg: KernelConfig = DEFAULT) -> torch.Tensor:
    """x [M, K] bf16 / fp16 (M <= MAX_TOKENS, unit column stride), weight e4m3 [N, K] with weight_scale [N, KG]
    (skinny_mma_fits) -> x @ W^T (+ bias) [M, N] in x's dtype, x quantized per token and 128 columns
    (silu: gate_up's silu(gate) * up, [M, N // 2]). x may also come quantized by its producer (a
    QuantizedActivation of act_group(K, group) columns a scale, fp8_act.add_rms_norm_fp8): the same
    operands without the quantize kernel."""
    K = weight.shape[1]
    M = x.rows if isinstance(x, QuantizedActivation) else x.shape[0]
    if M > MAX_TOKENS:
        raise ValueError(f"fp8_skinny_mma: at most {MAX_TOKENS} tokens, got {M}")
    if isinstance(x, QuantizedActivation):
        if x.group != act_group(K, group) or x.q.shape[1] != K:
            raise ValueError(f"fp8_skinny_mma: expected an activation of {K} columns quantized by "
                             f"{act_group(K, group)} columns a scale, got {x.q.shape[1]} columns by {x.group}")
        dtype, q, qs = x.dtype, x.q, x.scale
    else:
        dtype = x.dtype
        q, qs = quantize_fp8_per_token_group(x, act_group(K, group)) if M else (None, None)
    n_out = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty(M, n_out, dtype=dtype, device=weight.device)
    if not M:
        return out
    launch = skinny_mma_launch(M, n_out, K, group, silu, cfg, max_shared_memory(weight.device))
    pdl = uses_pdl(weight.device, cfg)
    ws = cnt = None
    if launch.split > 1:  # each part's fp32 sums (gate's, then up's), and the row tiles' counts
        ws = torch.empty((2 if silu else 1) * launch.split * launch.bm, n_out, dtype=torch.float32,
                         device=weight.device)
        cnt = device_counters("fp8_skinny_mma", MAX_SPLIT_TILES, weight.device)
    tma = ((cfg.fp8_skinny_mma_tma if group < K else cfg.fp8_skinny_mma_row_tma) and sm90(weight.device)
           and tma_fits(weight))
    _fp8_skinny_mma_kernel[(launch.tiles, launch.split)](
        q, qs, weight, weight_scale, out if bias is None else bias, out, M, n_out, K, q.stride(0), qs.stride(0),
        qs.stride(1), weight.stride(0), weight_scale.stride(0), out.stride(0), ws_ptr=ws, cnt_ptr=cnt,
        w_desc=weight_descriptor(weight, launch.rows, 128 if group < K else launch.block_k) if tma else None,
        TMA_W=tma, **launch.constexprs(K, group, silu, bias is not None, pdl, cfg), num_warps=launch.warps,
        num_stages=launch.stages, **launch_args(pdl))
    return out


class SkinnyMmaLaunch(NamedTuple):
    """fp8_skinny_mma's launch of one call (skinny_mma_launch)."""

    block_n: int  # weight rows a program (gate's and up's together with SILU)
    rows: int  # output rows a program
    bm: int  # the token tile
    block_k: int
    tiles: int  # row tiles: the grid's first axis
    split: int  # K parts: the grid's second axis
    split_cols: int  # K columns a part (whole K steps)
    warps: int
    stages: int

    def constexprs(self, K: int, group: int, silu: bool, has_bias: bool, pdl: bool, cfg: KernelConfig) -> dict:
        """The kernel's constexpr arguments but K (which the launch passes in place) for this launch."""
        return dict(GROUP=group, PER_GROUP=group < K, BM=self.bm, BLOCK_N=self.block_n, BLOCK_K=self.block_k,
                    HAS_BIAS=has_bias, SILU=silu, PDL=pdl, SCALES_AHEAD=cfg.fp8_skinny_mma_scales_ahead,
                    SPLIT=self.split, SPLIT_COLS=self.split_cols)


def skinny_mma_launch(M: int, n_out: int, K: int, group: int, silu: bool, cfg: KernelConfig,
                      shared: int) -> SkinnyMmaLaunch:
    """The launch of fp8_skinny_mma for M tokens, n_out output rows (SILU: gate_up's halves) over K columns of weights
    of scale group `group`, on a device of `shared` bytes of shared memory a program (max_shared_memory): rows a
    program halved from cfg.fp8_skinny_mma_block_n until cfg.fp8_skinny_mma_min_programs programs, not below
    cfg.fp8_skinny_mma_split_min_rows where K splits (64: the smallest wgmma tile), then K split (split_k)."""
    block_n = cfg.fp8_skinny_mma_block_n
    least = cfg.fp8_skinny_mma_split_min_rows if _split_programs(cfg, group < K) else 0
    while (block_n > 32 and (block_n // 2 if silu else block_n) > least
           and triton.cdiv(n_out, block_n // 2 if silu else block_n) < cfg.fp8_skinny_mma_min_programs):
        block_n //= 2
    if silu:
        block_n = max(block_n, 32)  # its halves (gate, up) are products of at least 16 rows
    rows = block_n // 2 if silu else block_n
    bm = max(16, triton.next_power_of_2(M))
    block_k = cfg.fp8_skinny_mma_block_k if group < K else cfg.fp8_skinny_mma_row_block_k
    tiles = triton.cdiv(n_out, rows)
    split, split_cols = split_k(tiles, K, block_k, cfg, group < K)
    return SkinnyMmaLaunch(block_n, rows, bm, block_k, tiles, split, split_cols,
                           cfg.fp8_skinny_mma_narrow_warps if rows <= 32 else cfg.fp8_skinny_mma_warps,
                           skinny_mma_stages(cfg, block_n, bm, block_k, shared))


def _split_programs(cfg: KernelConfig, per_group: bool) -> int:
    """The programs a split launch aims at: block weights' (per_group) or a scale a row's bound; 0: no split."""
    return cfg.fp8_skinny_mma_split_programs if per_group else cfg.fp8_skinny_mma_row_split_programs


def split_k(tiles: int, K: int, block_k: int, cfg: KernelConfig, per_group: bool = True) -> tuple[int, int]:
    """-> (splits, columns a split) of a launch of `tiles` row tiles over K columns in K steps of block_k: as many
    splits as bring the programs to cfg.fp8_skinny_mma_split_programs (block weights, per_group) or
    fp8_skinny_mma_row_split_programs (a scale a row; 0: no split), each at least cfg.fp8_skinny_mma_split_min_steps
    whole K steps, none empty; (1, K) where that is one."""
    steps = triton.cdiv(K, block_k)
    programs = _split_programs(cfg, per_group)
    want = triton.cdiv(programs, tiles) if programs else 1
    split = max(1, min(want, steps // max(1, cfg.fp8_skinny_mma_split_min_steps)))
    if split <= 1 or tiles > MAX_SPLIT_TILES:
        return 1, K
    per = triton.cdiv(steps, split)
    return triton.cdiv(steps, per), per * block_k


def act_group(K: int, group: int) -> int:
    """The columns a scale of x's quantization for a weight of K columns and scale group `group`: 128 for
    block weights (a 128-column K step each), K (one scale a token) for a scale a weight row."""
    return QGROUP if group < K else K
