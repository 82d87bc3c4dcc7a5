"""The MoE decode path: steps of a few token-expert pairs read each pair's expert directly, with no sort.

    gate_up: program (pair p, column block nb), t = p // k, e = ids[p]:
             act[p, n] = silu(x[t] . gate_e[n]) * (x[t] . up_e[n])                    act [P, I]
    down:    program (token t, row block nb):
             y[t, n] = sum_j w[t, j] * (act[t * k + j] . down_{ids[t, j]}[n])          y [T, H]

Both are GEMVs (fp32 FMAs over BLOCK_K columns at a time): at one token a Qwen3-30B-A3B layer has
8 pairs x 48 gate_up blocks of 16 columns and 2048 / 8 down blocks, enough programs for every SM,
where the grouped GEMM had 8 experts x 12 blocks of 16-row tiles holding one real row each. A down
program loads the rows of all k experts of its token in one tile ([k x BLOCK_N, BLOCK_K]: more bytes
in flight than one expert's rows) and sums their weighted, rounded products in fp32 in registers: no
atomics, no [P, H] intermediate, the same result whatever the scheduling. Rounding is fused_moe's
(kernels/moe.py). A pair whose expert is repeated by another token reads its weights again: the path
is for steps of few pairs per expert (kernels/moe.takes_decode_path).

FP8 (e4m3) weights carry float32 scales [E, rows, ceil(cols / GROUP)], one per row and GROUP columns:
a tile is dequantized to the model dtype in registers (w * scale, rounded), as the reference does to
the whole tensor. Its tiles span twice the configured columns (the same bytes a load), either inside
one group (BLOCK_K <= GROUP) or over whole groups side by side (reshaped [rows, groups, GROUP]).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.config import KernelConfig

FP8_GROUP = 128  # columns per scale of the block-wise FP8 experts (layers/moe.FP8_GROUP: the same format)


@triton.jit
def _dequant(w, s_rows, row_ok, k0, K, FP8: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
             dtype: tl.constexpr):
    """w [R, BLOCK_K] (columns k0..) -> fp32. FP8: times the scale of each element's row (s_rows [R], pointers
    to the rows' first scale) and GROUP-column group, rounded to dtype, as the reference dequantizes."""
    if FP8:
        R: tl.constexpr = w.shape[0]
        if BLOCK_K <= GROUP:  # BLOCK_K divides GROUP: the tile lies in one group
            s = tl.load(s_rows + k0 // GROUP, mask=row_ok, other=0.0)
            w = (w.to(tl.float32) * s[:, None]).to(dtype)
        else:  # BLOCK_K / GROUP whole groups side by side
            NG: tl.constexpr = BLOCK_K // GROUP
            g = k0 // GROUP + tl.arange(0, NG)
            s = tl.load(s_rows[:, None] + g[None, :], mask=row_ok[:, None] & (g * GROUP < K)[None, :], other=0.0)
            w = tl.reshape(w.to(tl.float32), (R, NG, GROUP)) * s[:, :, None]
            w = tl.reshape(w.to(dtype), (R, BLOCK_K))
    return w.to(tl.float32)


@triton.jit
def _gate_up_kernel(x_ptr, w_ptr, s_ptr, ids_ptr, act_ptr, N, K, stride_x, stride_we, stride_wn, stride_se,
                    stride_sn, stride_act, TOP_K: tl.constexpr, FP8: tl.constexpr, GROUP: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    p = tl.program_id(0)
    t = p // TOP_K
    e = tl.load(ids_ptr + p).to(tl.int64)
    dtype = act_ptr.dtype.element_ty
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    gate_rows = w_ptr + e * stride_we + offs_n.to(tl.int64) * stride_wn
    up_rows = gate_rows + N * stride_wn
    gate_s = s_ptr + e * stride_se + offs_n * stride_sn
    up_s = gate_s + N * stride_sn
    acc_g = tl.zeros((BLOCK_N,), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        xv = tl.load(x_ptr + t * stride_x + kk, mask=k_ok, other=0.0).to(tl.float32)
        m = n_ok[:, None] & k_ok[None, :]
        wg = tl.load(gate_rows[:, None] + kk[None, :], mask=m, other=0.0)
        wu = tl.load(up_rows[:, None] + kk[None, :], mask=m, other=0.0)
        acc_g += tl.sum(_dequant(wg, gate_s, n_ok, k0, K, FP8, GROUP, BLOCK_K, dtype) * xv[None, :], axis=1)
        acc_u += tl.sum(_dequant(wu, up_s, n_ok, k0, K, FP8, GROUP, BLOCK_K, dtype) * xv[None, :], axis=1)
    g = acc_g.to(dtype).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(dtype)
    out = silu.to(tl.float32) * acc_u.to(dtype).to(tl.float32)
    tl.store(act_ptr + p * stride_act + offs_n, out.to(dtype), mask=n_ok)


@triton.jit
def _down_kernel(act_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, y_ptr, N, K, stride_act, stride_we, stride_wn, stride_se,
                 stride_sn, stride_y, TOP_K: tl.constexpr, KP: tl.constexpr, FP8: tl.constexpr, GROUP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # the weight tile's rows: r = j * BLOCK_N + c is row (first + c) of the token's j-th expert; KP = TOP_K
    # rounded up to a power of two, its extra slots masked
    t = tl.program_id(0)
    dtype = y_ptr.dtype.element_ty
    first = tl.program_id(1) * BLOCK_N
    slot = tl.arange(0, KP)
    slot_ok = slot < TOP_K
    p = t * TOP_K + slot  # [KP] the token's pairs
    r = tl.arange(0, KP * BLOCK_N)
    rj, rn = r // BLOCK_N, first + r % BLOCK_N
    row_ok = (rj < TOP_K) & (rn < N)
    e = tl.load(ids_ptr + t * TOP_K + rj, mask=rj < TOP_K, other=0).to(tl.int64)  # [KP * BLOCK_N]
    w_rows = w_ptr + e * stride_we + rn.to(tl.int64) * stride_wn
    s_rows = s_ptr + e * stride_se + rn * stride_sn
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((KP, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        a = tl.load(act_ptr + p[:, None].to(tl.int64) * stride_act + kk[None, :], mask=slot_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)
        w = tl.load(w_rows[:, None] + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = _dequant(w, s_rows, row_ok, k0, K, FP8, GROUP, BLOCK_K, dtype)
        acc += tl.sum(tl.reshape(w, (KP, BLOCK_N, BLOCK_K)) * a[:, None, :], axis=2)
    rw = tl.load(rw_ptr + p, mask=slot_ok, other=0.0).to(tl.float32)
    y = (acc.to(dtype).to(tl.float32) * rw[:, None]).to(dtype).to(tl.float32)  # masked slots: 0
    out_n = first + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + t * stride_y + out_n, tl.sum(y, axis=0).to(dtype), mask=out_n < N)


def scale_args(scale: torch.Tensor | None, w: torch.Tensor) -> tuple:
    """(tensor, expert stride, row stride) of a scale tensor (groups unit-strided); w stands in (never
    read) without one."""
    if scale is None:
        return w, 0, 0
    scale = scale.contiguous()
    return scale, scale.stride(0), scale.stride(1)


def decode_operands(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                    gate_up_scale: torch.Tensor | None) -> tuple:
    """The decode path's sizes and buffers (moe_decode, moe_gemv.moe_gemv): (T, H, k, I, fp8, x, ids and
    weights contiguous, act [T * k, I] and y [T, H] in x's dtype, uninitialised)."""
    T, H = x.shape
    k = ids.shape[1]
    inter = gate_up.shape[1] // 2
    act = torch.empty(T * k, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(T, H, dtype=x.dtype, device=x.device)
    return T, H, k, inter, gate_up_scale is not None, x.contiguous(), ids.contiguous(), weights.contiguous(), act, y


def moe_decode(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
               cfg: KernelConfig, gate_up_scale: torch.Tensor | None = None,
               down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H], weights [T, k], ids [T, k], gate_up [E, 2I, H], down [E, H, I] (model dtype, or e4m3 with
    scales [E, 2I, ceil(H / 128)] and [E, H, ceil(I / 128)]) -> [T, H] in x's dtype, in two kernels."""
    T, H, k, inter, fp8, x, ids, rw, act, y = decode_operands(x, weights, ids, gate_up, gate_up_scale)
    # FP8 tiles span twice the columns: the same bytes a load as the model-dtype tiles
    bk, bk_down = cfg.moe_decode_block_k * (2 if fp8 else 1), cfg.moe_decode_down_block_k * (2 if fp8 else 1)
    s, sse, ssn = scale_args(gate_up_scale, gate_up)
    _gate_up_kernel[(T * k, triton.cdiv(inter, cfg.moe_decode_block_n))](
        x, gate_up, s, ids, act, inter, H, x.stride(0), gate_up.stride(0), gate_up.stride(1), sse, ssn, act.stride(0),
        TOP_K=k, FP8=fp8, GROUP=FP8_GROUP, BLOCK_N=cfg.moe_decode_block_n, BLOCK_K=bk,
        num_warps=cfg.moe_decode_warps, num_stages=cfg.moe_decode_stages)
    s, sse, ssn = scale_args(down_scale, down)
    _down_kernel[(T, triton.cdiv(H, cfg.moe_decode_down_block_n))](
        act, down, s, ids, rw, y, H, inter, act.stride(0), down.stride(0), down.stride(1), sse, ssn, y.stride(0),
        TOP_K=k, KP=max(2, triton.next_power_of_2(k)), FP8=fp8, GROUP=FP8_GROUP, BLOCK_N=cfg.moe_decode_down_block_n,
        BLOCK_K=bk_down, num_warps=cfg.moe_decode_warps, num_stages=cfg.moe_decode_stages)
    return y
