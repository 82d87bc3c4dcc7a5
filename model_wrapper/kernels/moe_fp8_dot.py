"""FP8 experts' gate_up GEMV of a decode step with its products on the tensor cores (KernelConfig.moe_fp8_dot).

    program (pair p = t * k + j, BLOCK_N columns n) of expert e = ids[t, j]:
        for each chunk of BLOCK_K columns c (a loop):
            wg, wu = dequant(gate_e[n, c]), dequant(up_e[n, c])          e4m3 * scale -> bf16 (the reference's)
            acc_g += X16 @ wg^T,  acc_u += X16 @ wu^T                     X16 [16, BLOCK_K]: x[t, c] in row 0, zeros
        act[p, n] = silu(round(acc_g[0])) * round(acc_u[0])               act [T * k, I], as moe_gemv's gate_up

Why: at one token kernels/moe_gemv.py's FP8 gate_up is instruction-bound, not byte-bound (benchmarks/RESULTS.md,
session 34: FP8 experts take about as long as bf16's for half the bytes). A weight there costs about five
instructions: the e4m3 unpack, the conversion to fp32, the scale's product, the rounding to bf16 (the reference
dequantizes to the model dtype), then back to fp32 and an FMA with x. Here the rounded bf16 weights go to the
tensor cores as they are (mma of a 16-row x tile whose first row is x): the conversion back and the FMA leave
the loop, one mma instruction covering a 16 x 8 x 16 block (15 of x's rows are zeros: the tensor cores have
throughput to spare at one token). The product of two bf16 values is exact in fp32, so only the order of the
fp32 sum differs from the FMA path (the two agree within fp32 rounding before the rounding to the dtype).

The same for down (KernelConfig.moe_fp8_dot_down), one expert a program, and the k experts' rows summed by
kernels/moe.py's k-sum kernel (fp32, one rounding, as moe_gemv's down sums them in registers):

    program (pair p, BLOCK_N rows n): out[p, n] = round(round(A16 @ dequant(down_e[n, :])^T [0]) * w[p])
                                      A16: act[p] in row 0, zeros                         out [T * k, H]
    k-sum:                            y[t, n] = sum_j out[t * k + j, n]                   y [T, H]

PDL: gate_up as moe_gemv's (wait for the route kernel, then let down launch, then read ids and the weights); down
reads ids, the routing weight and its first chunk of weights before its wait (the route kernel's, complete before
any gate_up program passed its wait), then each step loads the next chunk before its product (two chunks in
flight); the k-sum waits for down.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import gdc_launch_dependents, gdc_wait, launch_args
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.moe_decode import FP8_GROUP
from model_wrapper.kernels.moe_gemv import _round_bf16x2


@triton.jit
def _dequant_chunk(w, s_rows, row_ok, k0, K, GROUP: tl.constexpr, BLOCK_K: tl.constexpr, dtype: tl.constexpr,
                   PACKED: tl.constexpr):
    """e4m3 w [R, BLOCK_K] (columns k0.., BLOCK_K whole GROUP-column groups) -> the model dtype: times each
    element's row and group scale (s_rows [R], pointers to the rows' first scale), rounded once (PACKED: two
    values an instruction, bf16)."""
    R: tl.constexpr = w.shape[0]
    NG: tl.constexpr = BLOCK_K // GROUP
    g = k0 // GROUP + tl.arange(0, NG)
    s = tl.load(s_rows[:, None] + g[None, :], mask=row_ok[:, None] & (g * GROUP < K)[None, :], other=0.0)
    v = tl.reshape(w.to(tl.float32), (R, NG, GROUP)) * s[:, :, None]
    if PACKED:
        return tl.reshape(_round_bf16x2(v), (R, BLOCK_K))
    return tl.reshape(v.to(dtype), (R, BLOCK_K))


@triton.jit
def _gate_up_dot_kernel(x_ptr, w_ptr, s_ptr, ids_ptr, act_ptr, N, K, stride_x, stride_we, stride_wn, stride_se,
                        stride_sn, stride_act, TOP_K: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, PDL: tl.constexpr, PACKED: tl.constexpr, PREC: tl.constexpr,
                        SWAP: tl.constexpr):
    p = tl.program_id(0)
    t = p // TOP_K
    if PDL:
        gdc_wait()  # the route kernel is complete: ids are final
        gdc_launch_dependents()
    e = tl.load(ids_ptr + p).to(tl.int64)
    dtype = act_ptr.dtype.element_ty
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    gate_rows = w_ptr + e * stride_we + offs_n.to(tl.int64) * stride_wn
    gate_s = s_ptr + e * stride_se + offs_n * stride_sn
    first = (tl.arange(0, 16) == 0)[:, None]  # X16's row that holds x
    offs_k = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros((BLOCK_N, 16) if SWAP else (16, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, 16) if SWAP else (16, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        m = n_ok[:, None] & k_ok[None, :]
        wg = tl.load(gate_rows[:, None] + kk[None, :], mask=m, other=0.0)
        wu = tl.load(gate_rows[:, None] + N * stride_wn + kk[None, :], mask=m, other=0.0)
        xv = tl.load(x_ptr + t * stride_x + kk, mask=k_ok, other=0.0)
        x16 = tl.where(first, xv[None, :], 0.0).to(dtype)
        wg = _dequant_chunk(wg, gate_s, n_ok, k0, K, GROUP, BLOCK_K, dtype, PACKED)
        wu = _dequant_chunk(wu, gate_s + N * stride_sn, n_ok, k0, K, GROUP, BLOCK_K, dtype, PACKED)
        if SWAP:  # the weights as the mma's first operand: acc [BLOCK_N, 16], x's products in column 0
            acc_g = tl.dot(wg, tl.trans(x16), acc_g, input_precision=PREC)
            acc_u = tl.dot(wu, tl.trans(x16), acc_u, input_precision=PREC)
        else:
            acc_g = tl.dot(x16, tl.trans(wg), acc_g, input_precision=PREC)
            acc_u = tl.dot(x16, tl.trans(wu), acc_u, input_precision=PREC)
    if SWAP:
        g = tl.sum(tl.where(tl.trans(first), acc_g, 0.0), axis=1).to(dtype).to(tl.float32)
        u = tl.sum(tl.where(tl.trans(first), acc_u, 0.0), axis=1).to(dtype).to(tl.float32)
    else:
        g = tl.sum(tl.where(first, acc_g, 0.0), axis=0).to(dtype).to(tl.float32)  # row 0: x's products
        u = tl.sum(tl.where(first, acc_u, 0.0), axis=0).to(dtype).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(dtype)
    tl.store(act_ptr + p * stride_act + offs_n, (silu.to(tl.float32) * u).to(dtype), mask=n_ok)


@triton.jit
def _down_dot_kernel(act_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, out_ptr, N, K, stride_act, stride_we, stride_wn,
                     stride_se, stride_sn, stride_out, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, PDL: tl.constexpr, PACKED: tl.constexpr, PREC: tl.constexpr,
                     SWAP: tl.constexpr):
    p = tl.program_id(0)
    dtype = out_ptr.dtype.element_ty
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    # before the wait: ids, the routing weight and the first chunk (the route kernel's: module docstring)
    e = tl.load(ids_ptr + p).to(tl.int64)
    rw = tl.load(rw_ptr + p).to(tl.float32)
    rows = w_ptr + e * stride_we + offs_n.to(tl.int64) * stride_wn
    s_rows = s_ptr + e * stride_se + offs_n * stride_sn
    w = tl.load(rows[:, None] + offs_k[None, :], mask=n_ok[:, None] & (offs_k < K)[None, :], other=0.0)
    if PDL:
        gdc_wait()  # gate_up is complete: act is final
        gdc_launch_dependents()
    first = (tl.arange(0, 16) == 0)[:, None]
    acc = tl.zeros((BLOCK_N, 16) if SWAP else (16, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        nk = kk + BLOCK_K
        w_next = tl.load(rows[:, None] + nk[None, :], mask=n_ok[:, None] & (nk < K)[None, :], other=0.0)
        a = tl.load(act_ptr + p * stride_act + kk, mask=kk < K, other=0.0)
        a16 = tl.where(first, a[None, :], 0.0).to(dtype)
        wd = _dequant_chunk(w, s_rows, n_ok, k0, K, GROUP, BLOCK_K, dtype, PACKED)
        if SWAP:
            acc = tl.dot(wd, tl.trans(a16), acc, input_precision=PREC)
        else:
            acc = tl.dot(a16, tl.trans(wd), acc, input_precision=PREC)
        w = w_next
    if SWAP:
        d = tl.sum(tl.where(tl.trans(first), acc, 0.0), axis=1).to(dtype).to(tl.float32)
    else:
        d = tl.sum(tl.where(first, acc, 0.0), axis=0).to(dtype).to(tl.float32)
    tl.store(out_ptr + p * stride_out + offs_n, (d * rw).to(dtype), mask=n_ok)


def fp8_dot_fits(hidden: int, cfg: KernelConfig) -> bool:
    """Whether moe_gemv's FP8 gate_up runs here: cfg.moe_fp8_dot and chunks of whole 128-column scale groups."""
    bk = cfg.moe_fp8_dot_block_k
    return cfg.moe_fp8_dot and bk % FP8_GROUP == 0 and bk & (bk - 1) == 0 and cfg.moe_fp8_dot_block_n >= 16


def fp8_down_dot_fits(cfg: KernelConfig) -> bool:
    """Whether moe_gemv's FP8 down runs here (and the k-sum after it): cfg.moe_fp8_dot_down, whole scale groups."""
    bk = cfg.moe_fp8_dot_down_block_k
    return cfg.moe_fp8_dot_down and bk % FP8_GROUP == 0 and bk & (bk - 1) == 0 and cfg.moe_fp8_dot_down_block_n >= 16


def fp8_down_dot(act: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, down: torch.Tensor,
                 scale: torch.Tensor, cfg: KernelConfig, pdl: bool) -> torch.Tensor:
    """act [T * k, I], weights / ids [T, k] (contiguous), down [E, H, I] e4m3 with scale [E, H, ceil(I / 128)]
    -> y [T, H] in act's dtype: each pair's weighted down product, then their sum per token (kernels/moe.py's)."""
    from model_wrapper.kernels.moe import _sum_k_kernel  # (kernels/moe.py imports moe_gemv, which imports this)

    T, k = ids.shape
    H, inter = down.shape[1], down.shape[2]
    out = torch.empty(T * k, H, dtype=act.dtype, device=act.device)
    y = torch.empty(T, H, dtype=act.dtype, device=act.device)
    block_n = cfg.moe_fp8_dot_down_block_n
    packed = cfg.moe_fp8_packed_round and act.is_cuda and act.dtype == torch.bfloat16
    _down_dot_kernel[(T * k, triton.cdiv(H, block_n))](
        act, down, scale, ids, weights, out, H, inter, act.stride(0), down.stride(0), down.stride(1), scale.stride(0),
        scale.stride(1), out.stride(0), GROUP=FP8_GROUP, BLOCK_N=block_n, BLOCK_K=cfg.moe_fp8_dot_down_block_k,
        PDL=pdl, PACKED=packed, PREC="ieee" if act.dtype == torch.float32 else "tf32", SWAP=cfg.moe_fp8_dot_swap,
        num_warps=cfg.moe_fp8_dot_warps, **launch_args(pdl))
    block = cfg.moe_sum_block
    _sum_k_kernel[(T, triton.cdiv(H, block))](out, y, H, TOP_K=k, KP=max(2, triton.next_power_of_2(k)),
                                              BLOCK_N=block, PDL=pdl, num_warps=4, **launch_args(pdl))
    return y


def fp8_gate_up_dot(x: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, scale: torch.Tensor,
                    act: torch.Tensor, cfg: KernelConfig, pdl: bool) -> None:
    """act [T * k, I] <- silu(x . gate_e) * (x . up_e) of each pair's expert: x [T, H], ids [T, k] (contiguous),
    gate_up [E, 2I, H] e4m3 with scale [E, 2I, ceil(H / 128)] float32 (unit-strided groups)."""
    T, H = x.shape
    k = ids.shape[1]
    inter = gate_up.shape[1] // 2
    block_n = cfg.moe_fp8_dot_block_n
    packed = cfg.moe_fp8_packed_round and x.is_cuda and x.dtype == torch.bfloat16
    _gate_up_dot_kernel[(T * k, triton.cdiv(inter, block_n))](
        x, gate_up, scale, ids, act, inter, H, x.stride(0), gate_up.stride(0), gate_up.stride(1), scale.stride(0),
        scale.stride(1), act.stride(0), TOP_K=k, GROUP=FP8_GROUP, BLOCK_N=block_n, BLOCK_K=cfg.moe_fp8_dot_block_k,
        PDL=pdl, PACKED=packed, PREC="ieee" if x.dtype == torch.float32 else "tf32", SWAP=cfg.moe_fp8_dot_swap,
        num_warps=cfg.moe_fp8_dot_warps, **launch_args(pdl))
