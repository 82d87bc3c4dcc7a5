"""Fused mixture-of-experts on the GPU: the entry point fused_moe and the grouped GEMMs of larger steps.

Steps of at most KernelConfig.moe_decode_pairs token-expert pairs take the decode path (no sort: a GEMV
per pair, kernels/moe_gemv.py's register tiles, or kernels/moe_decode.py's K loops where a row does not
fit a tile or cfg.moe_decode_gemv is off). Larger ones sort the pairs per expert on the device and run
two grouped GEMMs:

    ids [T, k] --moe_align--> pairs [R] (pair p = t * k + j, sorted by expert, each expert's run padded
                              to a multiple of BLOCK_M with the sentinel P = T * k), block_expert [R / BLOCK_M]
                              (kernels/moe_align.py)
    gate_up kernel: program (m block, n block) of expert e = block_expert[m]:
                    act[p, n] = silu(x[p // k] @ gate_e[n]) * (x[p // k] @ up_e[n])      act [P, I]
    down kernel:    out[p, :] = w[p] * (act[p] @ down_e^T)                                out [P, H]
    sum kernel:     y[t] = sum_j out[t * k + j]  (fp32, one rounding)                      y [T, H]

All five kernels (the align's two, the GEMMs, the sum) launch with PDL on sm90+ and wait for the one before
at entry: each launch overlaps the previous kernel's tail. The GEMMs' grids are numbered n block first
(KernelConfig.moe_grid_n_first): the programs the GPU starts together take neighbouring row blocks of one
expert rather than one row block of each of many experts (1.2% off an FP8-experts decode step at 32 and 128
tokens on an H100; benchmarks/RESULTS.md, session 56).

No step reads a count back to the host: the sort, the per-expert padding and the grid are all sized by the
worst case of T (R <= P + min(E, P) * (BLOCK_M - 1)), so a CUDA graph of a decode bucket replays whatever
the routing. Blocks past the last expert's run find block_expert == E and return at once. Rounding is the
reference's (layers/moe.experts_reference): each product rounded to the model dtype, silu in fp32 rounded,
times up rounded, the routing weight applied to the rounded down product; only the final sum over a
token's k experts runs in fp32 (the reference adds them one by one in the model dtype).

FP8 experts (e4m3 weights, float32 scales [E, rows, ceil(cols / 128)], one per row and 128 columns): each
weight tile is dequantized to the model dtype in registers before its dot (weight-only: activations stay
in the model dtype), which is what the reference computes on the dequantized tensors. With
KernelConfig.moe_fp8_w8a8 (the default) the grouped GEMMs multiply e4m3 by e4m3 instead (W8A8, as the dense FP8 linears'
prefill and skinny_mma paths and vLLM's block-FP8 MoE): x quantized per token and 128 columns before gate_up,
gate_up's output per pair and 128 columns before down (kernels/fp8_act.py, the reference quantizer), one
tensor-core product per 128 columns scaled by both operands' scales into an fp32 sum; the rounding of each
product to the model dtype and the epilogues as above. The decode path (a few pairs) stays weight-only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import (gdc_launch_dependents, gdc_wait, launch_args, sm90, tma_fits, uses_pdl,
                                          weight_descriptor)
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.fp8_act import quantize_fp8_per_token_group
from model_wrapper.kernels.fp8_reference import QuantizedActivation
from model_wrapper.kernels.moe_align import moe_align, moe_align_reference
from model_wrapper.kernels.moe_decode import FP8_GROUP, scale_args, moe_decode
from model_wrapper.kernels.moe_gemv import moe_gemv, moe_gemv_fits


@triton.jit
def _moe_gemm_kernel(a_ptr, as_ptr, w_ptr, s_ptr, o_ptr, pairs_ptr, block_expert_ptr, rw_ptr, w_desc, P, E, N, K,
                     stride_a, stride_as, stride_asg, stride_we, stride_wn, stride_se, stride_sn, stride_o, W_ROWS,
                     TOP_K: tl.constexpr, SILU: tl.constexpr, WEIGHTED: tl.constexpr, FP8: tl.constexpr,
                     W8A8: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, PDL: tl.constexpr, TMA_W: tl.constexpr = False,
                     SWAP: tl.constexpr = False, N_FIRST: tl.constexpr = False):
    # W8A8 (FP8 experts, KernelConfig.moe_fp8_w8a8): a is e4m3 with float32 scales as_ptr [rows, groups] (per row
    # and GROUP columns); BLOCK_K == GROUP, so each K step is one e4m3 x e4m3 product scaled by its row's and
    # column's scales before it joins the fp32 sum. Otherwise FP8 dequantizes the weight tile to a's dtype.
    # TMA_W: weight tiles through w_desc, a tensor descriptor of w as [E * W_ROWS, K] rows with [BLOCK_N, BLOCK_K]
    # blocks (rows past an expert's N are the next rows of the tensor or zeros: their columns are never stored).
    # SWAP (W8A8 only; KernelConfig.moe_w8a8_swap): each product as W a^T, the weight rows on the MMA's M side
    # ([BLOCK_N, BLOCK_M] sums, transposed once after the K loop), as the dense e4m3 skinny kernel multiplies: sm90
    # builds wgmma e4m3 products for BLOCK_N >= 64, where a 16-pair M side builds mma.sync ones on fp16 conversions
    # of both operands; with TMA_W the weight tile goes to the MMA as it is stored (no transposed view).
    # N_FIRST (KernelConfig.moe_grid_n_first): the grid is (n blocks, m blocks), so that programs launched together
    # read neighbouring row blocks of one expert instead of one row block of many experts
    pid_m = tl.program_id(1 if N_FIRST else 0)
    pid_n = tl.program_id(0 if N_FIRST else 1)
    if PDL:
        gdc_wait()  # the kernel before (the align's scatter, or gate_up) is complete
        gdc_launch_dependents()
    e = tl.load(block_expert_ptr + pid_m)
    if e >= E:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pairs_ptr + offs_m)
    valid = pair < P
    if SILU:
        row = pair // TOP_K  # gate_up reads the token's row of x
    else:
        row = pair  # down reads the pair's row of act
    row = tl.where(valid, row, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w_ptr + e.to(tl.int64) * stride_we
    s_base = s_ptr + e.to(tl.int64) * stride_se + offs_n * stride_sn  # FP8: the tile's rows' scales
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        a = tl.load(a_ptr + row[:, None].to(tl.int64) * stride_a + kk[None, :], mask=valid[:, None] & k_ok[None, :],
                    other=0.0)
        if SWAP:  # W8A8: [BLOCK_N, BLOCK_K] weight rows (K contiguous) times a^T, scaled [rows, pairs]
            at = tl.trans(a)
            sa = tl.load(as_ptr + row.to(tl.int64) * stride_as + (k0 // GROUP) * stride_asg, mask=valid, other=0.0)
            if TMA_W:
                w = w_desc.load([e * W_ROWS + pid_n * BLOCK_N, k0])
            else:
                w = tl.load(w_base + offs_n[:, None] * stride_wn + kk[None, :], mask=n_ok[:, None] & k_ok[None, :],
                            other=0.0)
            s = tl.load(s_base + k0 // GROUP, mask=n_ok, other=0.0)
            acc += tl.dot(w, at) * (s[:, None] * sa[None, :])
            if SILU:
                if TMA_W:
                    wu = w_desc.load([e * W_ROWS + N + pid_n * BLOCK_N, k0])
                else:
                    wu = tl.load(w_base + (offs_n + N)[:, None] * stride_wn + kk[None, :],
                                 mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                su = tl.load(s_base + N * stride_sn + k0 // GROUP, mask=n_ok, other=0.0)
                acc_up += tl.dot(wu, at) * (su[:, None] * sa[None, :])
        else:
            if TMA_W:
                w = w_desc.load([e * W_ROWS + pid_n * BLOCK_N, k0]).T
            else:
                w = tl.load(w_base + offs_n[None, :] * stride_wn + kk[:, None], mask=n_ok[None, :] & k_ok[:, None],
                            other=0.0)
            if W8A8:
                sa = tl.load(as_ptr + row.to(tl.int64) * stride_as + (k0 // GROUP) * stride_asg, mask=valid,
                             other=0.0)
                s = tl.load(s_base + k0 // GROUP, mask=n_ok, other=0.0)
                acc += tl.dot(a, w) * (sa[:, None] * s[None, :])
            else:
                if FP8:  # BLOCK_K divides GROUP: the tile lies in one column group
                    s = tl.load(s_base + k0 // GROUP, mask=n_ok, other=0.0)
                    w = (w.to(tl.float32) * s[None, :]).to(a.dtype)
                acc = tl.dot(a, w, acc)
            if SILU:
                if TMA_W:
                    wu = w_desc.load([e * W_ROWS + N + pid_n * BLOCK_N, k0]).T
                else:
                    wu = tl.load(w_base + (offs_n + N)[None, :] * stride_wn + kk[:, None],
                                 mask=n_ok[None, :] & k_ok[:, None], other=0.0)
                if W8A8:
                    su = tl.load(s_base + N * stride_sn + k0 // GROUP, mask=n_ok, other=0.0)
                    acc_up += tl.dot(a, wu) * (sa[:, None] * su[None, :])
                else:
                    if FP8:
                        su = tl.load(s_base + N * stride_sn + k0 // GROUP, mask=n_ok, other=0.0)
                        wu = (wu.to(tl.float32) * su[None, :]).to(a.dtype)
                    acc_up = tl.dot(a, wu, acc_up)
    if SWAP:
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)
    dtype = o_ptr.dtype.element_ty
    if SILU:
        g = acc.to(dtype).to(tl.float32)
        out = (g / (1.0 + tl.exp(-g))).to(dtype) * acc_up.to(dtype)
    else:
        out = acc.to(dtype)
    if WEIGHTED:
        rw = tl.load(rw_ptr + pair, mask=valid, other=0.0)
        out = (out.to(tl.float32) * rw.to(tl.float32)[:, None]).to(dtype)
    tl.store(o_ptr + pair[:, None].to(tl.int64) * stride_o + offs_n[None, :], out.to(dtype),
             mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _sum_k_kernel(out_ptr, y_ptr, N, TOP_K: tl.constexpr, KP: tl.constexpr, BLOCK_N: tl.constexpr,
                  PDL: tl.constexpr):
    # y[t, n] = sum_j out[t * TOP_K + j, n] in fp32, one rounding (out [T * TOP_K, N] unit-strided rows)
    t = tl.program_id(0).to(tl.int64)
    if PDL:
        gdc_wait()  # the down GEMM is complete
        gdc_launch_dependents()
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, KP)
    rows = tl.load(out_ptr + (t * TOP_K + j)[:, None] * N + n[None, :], mask=(j < TOP_K)[:, None] & (n < N)[None, :],
                   other=0.0)
    tl.store(y_ptr + t * N + n, tl.sum(rows.to(tl.float32), axis=0).to(y_ptr.dtype.element_ty), mask=n < N)


MAX_GRID_Y = 65535  # a CUDA grid's second dimension at most (its first: 2^31 - 1)


def grid_n_first(m_blocks: int, n_first: bool) -> bool:
    """Whether the grouped GEMMs of a step with m_blocks pair blocks number their grid n block first: with
    KernelConfig.moe_grid_n_first, where the pair blocks fit the grid's second dimension (a step of millions of
    token-expert pairs keeps them in the first)."""
    return n_first and m_blocks <= MAX_GRID_Y


def _grid(m_blocks: int, n_blocks: int, n_first: bool) -> tuple[int, int]:
    return (n_blocks, m_blocks) if n_first else (m_blocks, n_blocks)


def grouped_tile(cfg: KernelConfig, pairs: int, fp8: bool, w8a8: bool) -> tuple[int, int, int, int, int]:
    """The sorted path's grouped-GEMM launch (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) for a step of pairs
    token-expert pairs: the moe_* set up to moe_small_pairs, then moe_large_* (W8A8: moe_w8a8_large_*); FP8 experts
    step K by at most one scale group (W8A8: exactly one)."""
    if pairs <= cfg.moe_small_pairs:
        bm, bn, bk, warps, stages = cfg.moe_block_m, cfg.moe_block_n, cfg.moe_block_k, cfg.moe_warps, cfg.moe_stages
    elif w8a8:  # (BLOCK_K: the scale group, below)
        bm, bn, bk = cfg.moe_w8a8_large_block_m, cfg.moe_w8a8_large_block_n, cfg.moe_large_block_k
        warps, stages = cfg.moe_w8a8_large_warps, cfg.moe_w8a8_large_stages
    else:
        bm, bn, bk = cfg.moe_large_block_m, cfg.moe_large_block_n, cfg.moe_large_block_k
        warps, stages = cfg.moe_large_warps, cfg.moe_large_stages
    if fp8:
        bk = FP8_GROUP if w8a8 else min(bk, FP8_GROUP)
    return bm, bn, bk, warps, stages


def w8a8_swaps(cfg: KernelConfig, pairs: int, w8a8: bool, device: torch.device) -> bool:
    """Whether the W8A8 grouped GEMMs of a step of `pairs` pairs on `device` multiply W a^T (_moe_gemm_kernel's SWAP):
    the small tiles (up to cfg.moe_small_pairs pairs: decode batches past the decode path) with cfg.moe_w8a8_swap, on
    Hopper (where it was measured, its weight tiles through TMA as well) or off CUDA (the interpreter)."""
    return (w8a8 and cfg.moe_w8a8_swap and pairs <= cfg.moe_small_pairs
            and (device.type != "cuda" or sm90(device)))


def _w8a8_operand(x: torch.Tensor, w8a8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, its scales) for the grouped GEMM: W8A8, x [M, K] quantized per row and FP8_GROUP columns
    (fp8_act.quantize_fp8_per_token_group: e4m3 [M, K], float32 [M, ceil(K / 128)]); else x itself, with
    x standing in for the scales (never read)."""
    if not w8a8:
        return x, x
    return quantize_fp8_per_token_group(x, FP8_GROUP)


def takes_quantized_x(rows: int, top_k: int, num_experts: int, cfg: KernelConfig) -> int | None:
    """FP8_GROUP where fused_moe on `rows` tokens with FP8 experts runs the W8A8 small tiles (past the decode path) on
    cfg.moe_w8a8_norm_quant_min_pairs to cfg.moe_small_pairs pairs and cfg.moe_w8a8_norm_quant lets the norm before x
    quantize it for them (fused_moe's x_quant), else None."""
    pairs = rows * top_k
    w8a8 = cfg.moe_fp8_w8a8 and cfg.moe_w8a8_norm_quant
    take = w8a8 and cfg.moe_w8a8_norm_quant_min_pairs <= pairs <= cfg.moe_small_pairs
    return FP8_GROUP if take and not takes_decode_path(pairs, num_experts, cfg, fp8=True) else None


def takes_decode_path(num_pairs: int, num_experts: int, cfg: KernelConfig, fp8: bool = False) -> bool:
    """Whether fused_moe runs a step of num_pairs token-expert pairs on the decode path: a few pairs
    (cfg.moe_fp8_decode_pairs for FP8 experts), and not many more than the experts (the decode path reads a
    repeated expert once per pair)."""
    most = cfg.moe_fp8_decode_pairs if fp8 else cfg.moe_decode_pairs
    return num_pairs <= min(most, cfg.moe_decode_pairs_per_expert * num_experts)


def fused_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
              cfg: KernelConfig = KernelConfig(), gate_up_scale: torch.Tensor | None = None,
              down_scale: torch.Tensor | None = None, x_quant: QuantizedActivation | None = None) -> torch.Tensor:
    """x [T, H], weights [T, k] (model dtype or fp32), ids [T, k] int, gate_up [E, 2I, H], down [E, H, I]
    -> [T, H] in x's dtype: the sum over each token's k experts of weight * expert(x). With scales
    (gate_up_scale [E, 2I, ceil(H / 128)], down_scale [E, H, ceil(I / 128)] float32) the experts are
    e4m3, dequantized in registers; without them the model-dtype path runs unchanged. x_quant: x already
    quantized per token and 128 columns (fp8_act.add_rms_norm_fp8, where takes_quantized_x said so), which the
    W8A8 GEMMs take instead of quantizing x themselves; the other paths ignore it."""
    T, H = x.shape
    k = ids.shape[1]
    E, two_i, _ = gate_up.shape
    inter = two_i // 2
    if (gate_up_scale is None) != (down_scale is None):
        raise ValueError("fused_moe: FP8 experts need both gate_up_scale and down_scale, got one")
    if T == 0:
        return torch.zeros_like(x)
    P = T * k
    if takes_decode_path(P, E, cfg, fp8=gate_up_scale is not None):
        if cfg.moe_decode_gemv and moe_gemv_fits(H, inter, k, cfg, gate_up_scale is not None):
            return moe_gemv(x, weights, ids, gate_up, down, cfg, gate_up_scale, down_scale)
        return moe_decode(x, weights, ids, gate_up, down, cfg, gate_up_scale, down_scale)
    x = x.contiguous()
    fp8 = gate_up_scale is not None
    w8a8 = fp8 and cfg.moe_fp8_w8a8
    bm, bn, bk, warps, stages = grouped_tile(cfg, P, fp8, w8a8)
    pdl = uses_pdl(x.device, cfg)
    if cfg.moe_fused_align:
        chunk = cfg.moe_align_small_chunk if P <= cfg.moe_small_pairs else cfg.moe_align_chunk
        pairs, block_expert = moe_align(ids, E, bm, chunk, pdl)
    else:
        pairs, block_expert = moe_align_reference(ids, E, bm)
    act = torch.empty(P, inter, dtype=x.dtype, device=x.device)
    out = torch.empty(P, H, dtype=x.dtype, device=x.device)
    rw = weights.reshape(-1).contiguous()
    m_blocks = block_expert.shape[0]
    swap = w8a8_swaps(cfg, P, w8a8, x.device)  # (with its weight tiles through TMA)
    tma = (cfg.moe_tma_weights if P > cfg.moe_small_pairs else cfg.moe_tma_small_weights or swap) \
        and sm90(x.device) and tma_fits(gate_up) and tma_fits(down)
    launch = dict(TOP_K=k, FP8=fp8, W8A8=w8a8, GROUP=FP8_GROUP, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PDL=pdl,
                  TMA_W=tma, SWAP=swap, num_warps=warps, num_stages=stages, **launch_args(pdl))
    if w8a8 and x_quant is not None and x_quant.group == FP8_GROUP and x_quant.rows == T:
        a, a_s = x_quant.q, x_quant.scale  # (quantized by the norm that made x: its rows past T are never read)
    else:
        a, a_s = _w8a8_operand(x, w8a8)  # (W8A8: x quantized per token and 128 columns, once for its k experts)
    s, sse, ssn = scale_args(gate_up_scale, gate_up)
    nf = grid_n_first(m_blocks, cfg.moe_grid_n_first)
    _moe_gemm_kernel[_grid(m_blocks, triton.cdiv(inter, bn), nf)](
        a, a_s, gate_up, s, act, pairs, block_expert, rw, weight_descriptor(gate_up, bn, bk) if tma else gate_up, P, E,
        inter, H, a.stride(0), a_s.stride(0), a_s.stride(1), gate_up.stride(0), gate_up.stride(1), sse, ssn,
        act.stride(0), 2 * inter, SILU=True, WEIGHTED=False, N_FIRST=nf, **launch)
    a, a_s = _w8a8_operand(act, w8a8)  # (W8A8: each pair's activation row per 128 columns)
    s, sse, ssn = scale_args(down_scale, down)
    _moe_gemm_kernel[_grid(m_blocks, triton.cdiv(H, bn), nf)](
        a, a_s, down, s, out, pairs, block_expert, rw, weight_descriptor(down, bn, bk) if tma else down, P, E, H, inter,
        a.stride(0), a_s.stride(0), a_s.stride(1), down.stride(0), down.stride(1), sse, ssn, out.stride(0), H,
        SILU=False, WEIGHTED=True, N_FIRST=nf, **launch)
    y = torch.empty(T, H, dtype=x.dtype, device=x.device)
    _sum_k_kernel[(T, triton.cdiv(H, cfg.moe_sum_block))](out, y, H, TOP_K=k, KP=max(2, triton.next_power_of_2(k)),
                                                           BLOCK_N=cfg.moe_sum_block, PDL=pdl, **launch_args(pdl))
    return y
