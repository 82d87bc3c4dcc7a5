"""The MoE expert chain of a one-token decode step in one kernel: gate_up -> SiLU -> down, no act round trip.

    chain: program (pair p = t * k + j, group g of ROWS intermediate rows) of expert e = ids[t, j]:
           for each block of BLOCK rows i of the group (a loop):
               a[i]        = silu(x[t] . gate_e[i]) * (x[t] . up_e[i])        in registers, [BLOCK]
               part[p, g] += down_e[:, i] @ a[i]                              fp32, [H]
    sum:   program (token t, BLOCK_H columns h):
           y[t, h] = sum_j w[t, j] * round(sum_g part[t * k + j, g, h])       [T, H]

kernels/moe_gemv.py runs the same chain as two kernels: gate_up's programs write act [P, I], and down's
programs (all k experts of a token, a block of H rows) wait for all of gate_up (their weights loaded
before the wait). Here a program's SiLU output goes straight into the matching columns of down (a
[H, BLOCK] tile: down is [E, H, I] row-major, so a block of columns is BLOCK contiguous elements a row),
and the only dependent launch left is the sum of the groups' fp32 partials ([P, I / ROWS, H], 3 MB at one
Qwen3-30B-A3B token with ROWS 16, read back from L2 by a kernel of T x H / BLOCH_H small programs): the
reduction order is fixed (a tree over the groups per expert, then the experts in order), so the result
does not depend on the scheduling (no atomics).

Rounding is the reference's (kernels/moe.py, moe_gemv.py): each gate and up product rounded to the model
dtype, silu in fp32 rounded, times up rounded; down's product per expert summed in fp32 and rounded to the
dtype once (here after the sum over the groups), times the routing weight, rounded; the k terms summed in
fp32, one final rounding. Only the order of down's fp32 sum differs from the two-kernel path (blocks of
BLOCK columns, then groups), so the two agree within fp32 rounding before the one dtype rounding.

FP8 experts (e4m3, float32 scales per row and 128 columns): gate_up's whole-row tiles are dequantized as in
moe_gemv.py (packed bf16 rounding on a GPU); a group's ROWS columns of down lie in one scale group (ROWS
divides 128: chain_fits), so the program loads down's [H] scales once, before its loop.

PDL: the chain waits for the route kernel (ids final) before reading ids, then lets the sum launch; the sum
reads the routing weights (complete: the route kernel finished before any chain program passed its wait)
and waits for the chain before reading the partials.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import gdc_launch_dependents, gdc_wait, launch_args, uses_pdl
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.moe_decode import FP8_GROUP, scale_args
from model_wrapper.kernels.moe_gemv import _dequant_tile, _loads_fence, _round_bf16x2


@triton.jit
def _chain_kernel(x_ptr, gu_ptr, gus_ptr, dn_ptr, dns_ptr, ids_ptr, part_ptr, I, H, stride_x, stride_ge, stride_gn,
                  stride_gse, stride_gsn, stride_de, stride_dn, stride_dse, stride_dsn, stride_pp, stride_pg,
                  TOP_K: tl.constexpr, HP: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, FP8: tl.constexpr,
                  GROUP: tl.constexpr, PDL: tl.constexpr, PACKED: tl.constexpr, LOADS_FIRST: tl.constexpr):
    p = tl.program_id(0)
    grp = tl.program_id(1)
    t = p // TOP_K
    if PDL:
        gdc_wait()  # the route kernel is complete: ids are final
        gdc_launch_dependents()
    e = tl.load(ids_ptr + p).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    cols = tl.arange(0, HP)  # gate_up's columns, down's rows
    h_ok = cols < H
    xv = tl.load(x_ptr + t * stride_x + cols, mask=h_ok, other=0.0).to(tl.float32)
    r0 = grp * ROWS
    down_rows = dn_ptr + e * stride_de + cols.to(tl.int64)[:, None] * stride_dn
    if FP8:  # the group's columns lie in one scale group of each down row
        sd = tl.load(dns_ptr + e * stride_dse + cols * stride_dsn + r0 // GROUP, mask=h_ok, other=0.0)
    acc = tl.zeros((HP,), dtype=tl.float32)
    for b in range(0, ROWS, BLOCK):
        i = r0 + b + tl.arange(0, BLOCK)
        i_ok = i < I
        rows = gu_ptr + e * stride_ge + i.to(tl.int64) * stride_gn
        m = i_ok[:, None] & h_ok[None, :]
        wg = tl.load(rows[:, None] + cols[None, :], mask=m, other=0.0)
        wu = tl.load(rows[:, None] + I * stride_gn + cols[None, :], mask=m, other=0.0)
        wd = tl.load(down_rows + i[None, :], mask=h_ok[:, None] & i_ok[None, :], other=0.0)  # [HP, BLOCK]
        if LOADS_FIRST:  # the block's loads all in flight before its products (moe_gemv.py)
            _loads_fence()
        gs = gus_ptr + e * stride_gse + i * stride_gsn
        ag = tl.sum(_dequant_tile(wg, gs, i_ok, H, FP8, GROUP, HP, dtype, PACKED) * xv[None, :], axis=1)
        au = tl.sum(_dequant_tile(wu, gs + I * stride_gsn, i_ok, H, FP8, GROUP, HP, dtype, PACKED) * xv[None, :],
                    axis=1)
        g = ag.to(dtype).to(tl.float32)
        silu = (g / (1.0 + tl.exp(-g))).to(dtype)
        a = (silu.to(tl.float32) * au.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)  # rows past I: 0
        if FP8 and PACKED:  # the rounding to bf16 two values an instruction (moe_gemv._round_bf16x2)
            wdf = _round_bf16x2(wd.to(tl.float32) * sd[:, None]).to(tl.float32)
        elif FP8:
            wdf = (wd.to(tl.float32) * sd[:, None]).to(dtype).to(tl.float32)
        else:
            wdf = wd.to(tl.float32)
        acc += tl.sum(wdf * a[None, :], axis=1)
    tl.store(part_ptr + p * stride_pp + grp * stride_pg + cols, acc, mask=h_ok)


@triton.jit
def _chain_sum_kernel(part_ptr, rw_ptr, y_ptr, H, G, stride_pp, stride_pg, stride_y, TOP_K: tl.constexpr,
                      GP: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = h < H
    g = tl.arange(0, GP)
    m = (g < G)[:, None] & h_ok[None, :]
    dtype = y_ptr.dtype.element_ty
    if PDL:
        gdc_wait()  # the chain is complete: the partials are final
        gdc_launch_dependents()
    y = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        p = t * TOP_K + j
        d = tl.sum(tl.load(part_ptr + p * stride_pp + g[:, None] * stride_pg + h[None, :], mask=m, other=0.0), axis=0)
        rw = tl.load(rw_ptr + p).to(tl.float32)
        y += (d.to(dtype).to(tl.float32) * rw).to(dtype).to(tl.float32)
    tl.store(y_ptr + t * stride_y + h, y.to(dtype), mask=h_ok)


def _block(cfg: KernelConfig, fp8: bool) -> int:
    return cfg.moe_fp8_chain_block if fp8 else cfg.moe_chain_block


def chain_fits(tokens: int, hidden: int, inter: int, top_k: int, cfg: KernelConfig, fp8: bool = False) -> bool:
    """Whether moe_chain takes a decode step: cfg.moe_chain, at most cfg.moe_chain_max_tokens tokens, a block of
    gate and up rows of the padded hidden width within cfg.moe_chain_tile weights, and (FP8) groups of rows that
    lie in one 128-column scale group of down."""
    rows, block = cfg.moe_chain_rows, _block(cfg, fp8)
    pow2 = rows & (rows - 1) == 0 and block & (block - 1) == 0
    return (cfg.moe_chain and 0 < tokens <= cfg.moe_chain_max_tokens and pow2 and block <= rows
            and 2 * block * triton.next_power_of_2(hidden) <= cfg.moe_chain_tile
            and (not fp8 or FP8_GROUP % rows == 0))


def moe_chain(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
              cfg: KernelConfig, gate_up_scale: torch.Tensor | None = None,
              down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H], weights [T, k], ids [T, k], gate_up [E, 2I, H], down [E, H, I] (model dtype, or e4m3 with scales
    [E, 2I, ceil(H / 128)] and [E, H, ceil(I / 128)]) -> [T, H] in x's dtype: the chain kernel, then the sum of its
    partials (module docstring). For the steps chain_fits accepts."""
    T, H = x.shape
    k = ids.shape[1]
    inter = gate_up.shape[1] // 2
    fp8 = gate_up_scale is not None
    x, ids, rw = x.contiguous(), ids.contiguous(), weights.contiguous()
    rows = cfg.moe_chain_rows
    groups = triton.cdiv(inter, rows)
    part = torch.empty(T * k, groups, H, dtype=torch.float32, device=x.device)
    y = torch.empty(T, H, dtype=x.dtype, device=x.device)
    pdl = uses_pdl(x.device, cfg)
    packed = cfg.moe_fp8_packed_round and fp8 and x.is_cuda and x.dtype == torch.bfloat16
    gs, gsse, gssn = scale_args(gate_up_scale, gate_up)
    ds, dsse, dssn = scale_args(down_scale, down)
    _chain_kernel[(T * k, groups)](
        x, gate_up, gs, down, ds, ids, part, inter, H, x.stride(0), gate_up.stride(0), gate_up.stride(1), gsse, gssn,
        down.stride(0), down.stride(1), dsse, dssn, part.stride(0), part.stride(1), TOP_K=k,
        HP=triton.next_power_of_2(H), ROWS=rows, BLOCK=_block(cfg, fp8), FP8=fp8, GROUP=FP8_GROUP, PDL=pdl,
        PACKED=packed, LOADS_FIRST=cfg.moe_gemv_loads_first and not fp8 and x.is_cuda, num_warps=cfg.moe_chain_warps,
        **launch_args(pdl))
    block_h = cfg.moe_chain_sum_block
    _chain_sum_kernel[(T, triton.cdiv(H, block_h))](
        part, rw, y, H, groups, part.stride(0), part.stride(1), y.stride(0), TOP_K=k,
        GP=max(2, triton.next_power_of_2(groups)), BLOCK_H=block_h, PDL=pdl, num_warps=4, **launch_args(pdl))
    return y
