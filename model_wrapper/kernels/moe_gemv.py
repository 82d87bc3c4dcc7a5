"""MoE decode experts as two register-tile GEMVs (kernels/gemv.py's design on routed experts), no sort.

    gate_up: program (pair p = t * k + j, BLOCK_N columns n) of expert e = ids[t, j]:
             act[p, n] = silu(x[t] . gate_e[n]) * (x[t] . up_e[n])                     act [T * k, I]
    down:    program (token t, BLOCK_N rows n), all k experts of t at once:
             y[t, n] = sum_j w[t, j] * (act[t * k + j] . down_{ids[t, j]}[n])           y [T, H]

Each program loads its whole weight tile (rows x the padded row width, cfg.moe_gemv_tile weights; FP8
cfg.moe_fp8_gemv_tile e4m3 weights) in one go, then reduces it: no K loop, every byte of the program in
flight at once. At one Qwen3-30B-A3B token (H 2048, I 768, top-8) that is 8 x 192 gate_up programs of
4 gate + 4 up rows and 1024 down programs of 8 x 2 rows: several waves of small programs over 132 SMs,
where kernels/moe_decode.py's K loops keep fewer bytes in flight. Both kernels launch with PDL:

    gate_up  waits for the route kernel, then lets down launch (so that down's ids are final when it
             starts), then reads ids, its expert's rows and x;
    down     reads ids, the routing weights and its k experts' rows *before* its wait (written by the
             route kernel, complete before any gate_up program passed its wait), so its weights stream in
             while gate_up drains; then waits and reads act.

Loads first (KernelConfig.moe_gemv_loads_first, bf16 gate_up on a GPU): the tile's loads come after
gate_up's PDL wait (they need ids), and there ptxas interleaves them with the products to save registers:
in the sm90 SASS each thread had one or two of its eight 16-byte loads in flight (37 registers), where
the down kernel, whose loads precede its wait, issues all of them first. A CTA-scope fence after the
loads (placed before the products; it costs a wait for the CTA's loads, which the products need anyway)
makes ptxas issue all eight first (63 registers). The dequantized FP8 tiles are issued first without it
(their scales' loads, inside the dequantization, would land behind the fence); the direct FP8 tiles take it, their
scales loaded before it.

FP8 on a GPU (KernelConfig.moe_fp8_packed_round): the dequantized weights are rounded to bf16 two an
instruction (cvt.rn.bf16x2.f32) instead of Triton's one-value conversion (F2F, 132 a thread for 128 weights
in the sm90 SASS): the same values, fewer conversions.

Rounding is kernels/moe.py's (the reference's): each product rounded to the model dtype, silu in fp32
rounded, times up rounded; the routing weight applied to the rounded down product, the k terms summed in
fp32, one final rounding. FP8 (e4m3, float32 scales per row and 128 columns) tiles, KernelConfig.moe_fp8_direct
(default): kept e4m3 in registers, each 128-column group's sum of products scaled after the sum (W = e4m3 *
scale in fp32, kernels/fp8_reference.py's arithmetic; its own tiles, moe_fp8_direct_tile). Off: dequantized to
the model dtype in registers before the products (moe_decode._dequant, 2-4 bytes of registers a weight, hence
the smaller moe_fp8_gemv_tile), as the reference dequantizes the tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import gdc_launch_dependents, gdc_wait, launch_args, loads_fence, uses_pdl
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.moe_decode import FP8_GROUP, _dequant, decode_operands, scale_args


@triton.jit
def _round_bf16x2(v):
    """fp32 -> bf16, round to nearest even, two values an instruction (cvt.rn.bf16x2.f32; Triton's own conversion
    is one value an instruction, F2F on sm90)."""
    return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [v], dtype=tl.bfloat16, is_pure=True,
                                     pack=2)


@triton.jit
def _dequant_tile(w, s_rows, row_ok, K, FP8: tl.constexpr, GROUP: tl.constexpr, KP: tl.constexpr, dtype: tl.constexpr,
                  PACKED: tl.constexpr):
    """moe_decode._dequant of a whole-row tile (columns 0..KP); PACKED (FP8 experts, bf16 model, on a GPU): the
    rounding to bf16 two values an instruction (_round_bf16x2), the same values."""
    if FP8 and PACKED and KP > GROUP:
        R: tl.constexpr = w.shape[0]
        NG: tl.constexpr = KP // GROUP
        g = tl.arange(0, NG)
        s = tl.load(s_rows[:, None] + g[None, :], mask=row_ok[:, None] & (g * GROUP < K)[None, :], other=0.0)
        v = tl.reshape(w.to(tl.float32), (R, NG, GROUP)) * s[:, :, None]
        return tl.reshape(_round_bf16x2(v), (R, KP)).to(tl.float32)
    return _dequant(w, s_rows, row_ok, 0, K, FP8, GROUP, KP, dtype)


@triton.jit
def _direct_scales(s_rows, row_ok, K, GROUP: tl.constexpr, KP: tl.constexpr):
    """The DIRECT products' scales of rows s_rows [R] (pointers to the rows' first scale): [R] where a row lies in
    one group, else [R, KP // GROUP] (groups past K: 0)."""
    if KP <= GROUP:
        return tl.load(s_rows, mask=row_ok, other=0.0)
    else:
        g = tl.arange(0, KP // GROUP)
        return tl.load(s_rows[:, None] + g[None, :], mask=row_ok[:, None] & (g * GROUP < K)[None, :], other=0.0)


@triton.jit
def _direct_dots(w, x, s, GROUP: tl.constexpr, KP: tl.constexpr):
    """DIRECT FP8 products of e4m3 rows w [R, KP] with x [R or 1, KP] (fp32): each GROUP-column group's sum of
    products times its scale (s: _direct_scales'), the groups summed -> [R] fp32. W = e4m3 * scale in fp32
    (kernels/fp8_reference.py's arithmetic), not rounded to the model dtype."""
    R: tl.constexpr = w.shape[0]
    if KP <= GROUP:  # the row lies in one group
        return tl.sum(w.to(tl.float32) * x, axis=1) * s
    else:
        part = tl.sum(tl.reshape(w.to(tl.float32) * x, (R, KP // GROUP, GROUP)), axis=2)
        return tl.sum(part * s, axis=1)


@triton.jit
def _gate_up_gemv_kernel(x_ptr, w_ptr, s_ptr, ids_ptr, act_ptr, N, K, stride_x, stride_we, stride_wn, stride_se,
                         stride_sn, stride_act, TOP_K: tl.constexpr, KP: tl.constexpr, FP8: tl.constexpr,
                         GROUP: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr, LOADS_FIRST: tl.constexpr,
                         PACKED: tl.constexpr, DIRECT: tl.constexpr = False):
    p = tl.program_id(0)
    t = p // TOP_K
    if PDL:
        gdc_wait()  # the route kernel is complete: ids are final
        gdc_launch_dependents()
    e = tl.load(ids_ptr + p).to(tl.int64)
    dtype = act_ptr.dtype.element_ty
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    cols = tl.arange(0, KP)
    k_ok = cols < K
    m = n_ok[:, None] & k_ok[None, :]
    gate_rows = w_ptr + e * stride_we + offs_n.to(tl.int64) * stride_wn
    wg = tl.load(gate_rows[:, None] + cols[None, :], mask=m, other=0.0)
    wu = tl.load(gate_rows[:, None] + N * stride_wn + cols[None, :], mask=m, other=0.0)
    xv = tl.load(x_ptr + t * stride_x + cols, mask=k_ok, other=0.0).to(tl.float32)
    gate_s = s_ptr + e * stride_se + offs_n * stride_sn
    sg, su = 0.0, 0.0
    if DIRECT:  # the scales' loads with the tile's, before the fence
        sg = _direct_scales(gate_s, n_ok, K, GROUP, KP)
        su = _direct_scales(gate_s + N * stride_sn, n_ok, K, GROUP, KP)
    if LOADS_FIRST:  # the tile's loads all in flight at once (module docstring)
        loads_fence()
    if DIRECT:  # e4m3 tiles kept as loaded (1 byte a weight in registers), scaled per group after the sums
        acc_g = _direct_dots(wg, xv[None, :], sg, GROUP, KP)
        acc_u = _direct_dots(wu, xv[None, :], su, GROUP, KP)
    else:
        acc_g = tl.sum(_dequant_tile(wg, gate_s, n_ok, K, FP8, GROUP, KP, dtype, PACKED) * xv[None, :], axis=1)
        acc_u = tl.sum(_dequant_tile(wu, gate_s + N * stride_sn, n_ok, K, FP8, GROUP, KP, dtype, PACKED) * xv[None, :],
                       axis=1)
    g = acc_g.to(dtype).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(dtype)
    out = silu.to(tl.float32) * acc_u.to(dtype).to(tl.float32)
    tl.store(act_ptr + p * stride_act + offs_n, out.to(dtype), mask=n_ok)


@triton.jit
def _down_gemv_kernel(act_ptr, w_ptr, s_ptr, ids_ptr, rw_ptr, y_ptr, N, K, stride_act, stride_we, stride_wn,
                      stride_se, stride_sn, stride_y, TOP_K: tl.constexpr, SLOTS: tl.constexpr, KP: tl.constexpr,
                      FP8: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr,
                      PACKED: tl.constexpr, DIRECT: tl.constexpr = False):
    # the tile's rows: r = j * BLOCK_N + c is row (first + c) of the token's j-th expert; SLOTS = TOP_K
    # rounded up to a power of two, its extra slots masked
    t = tl.program_id(0)
    dtype = y_ptr.dtype.element_ty
    first = tl.program_id(1) * BLOCK_N
    slot = tl.arange(0, SLOTS)
    slot_ok = slot < TOP_K
    p = t * TOP_K + slot
    r = tl.arange(0, SLOTS * BLOCK_N)
    rj, rn = r // BLOCK_N, first + r % BLOCK_N
    row_ok = (rj < TOP_K) & (rn < N)
    cols = tl.arange(0, KP)
    k_ok = cols < K
    # before the wait: ids and routing weights (the route kernel's, complete: see the module docstring)
    # and the experts' rows
    e = tl.load(ids_ptr + t * TOP_K + rj, mask=rj < TOP_K, other=0).to(tl.int64)
    w_rows = w_ptr + e * stride_we + rn.to(tl.int64) * stride_wn
    w = tl.load(w_rows[:, None] + cols[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    rw = tl.load(rw_ptr + p, mask=slot_ok, other=0.0).to(tl.float32)
    s_rows = s_ptr + e * stride_se + rn * stride_sn
    ws = 0.0
    if DIRECT:
        ws = _direct_scales(s_rows, row_ok, K, GROUP, KP)
    else:
        w = _dequant_tile(w, s_rows, row_ok, K, FP8, GROUP, KP, dtype, PACKED)
    if PDL:
        gdc_wait()  # gate_up is complete: act is final
        gdc_launch_dependents()
    a = tl.load(act_ptr + p[:, None].to(tl.int64) * stride_act + cols[None, :], mask=slot_ok[:, None] & k_ok[None, :],
                other=0.0).to(tl.float32)
    if DIRECT:  # [SLOTS * BLOCK_N] rows against their slot's act row
        a_rows = tl.reshape(tl.broadcast_to(a[:, None, :], (SLOTS, BLOCK_N, KP)), (SLOTS * BLOCK_N, KP))
        acc = tl.reshape(_direct_dots(w, a_rows, ws, GROUP, KP), (SLOTS, BLOCK_N))
    else:
        acc = tl.sum(tl.reshape(w, (SLOTS, BLOCK_N, KP)) * a[:, None, :], axis=2)
    y = (acc.to(dtype).to(tl.float32) * rw[:, None]).to(dtype).to(tl.float32)  # masked slots: 0
    out_n = first + tl.arange(0, BLOCK_N)
    tl.store(y_ptr + t * stride_y + out_n, tl.sum(y, axis=0).to(dtype), mask=out_n < N)


def _tiles(cfg: KernelConfig, fp8: bool) -> tuple[int, int]:
    """Weights a gate_up and a down program hold: the model dtype's tiles, or the FP8 experts' own (direct:
    moe_fp8_direct_tile / moe_fp8_direct_down_tile)."""
    if fp8 and cfg.moe_fp8_direct:
        return cfg.moe_fp8_direct_tile, cfg.moe_fp8_direct_down_tile
    return (cfg.moe_fp8_gemv_tile, cfg.moe_fp8_gemv_down_tile) if fp8 else (cfg.moe_gemv_tile, cfg.moe_gemv_down_tile)


def moe_gemv_fits(hidden: int, inter: int, top_k: int, cfg: KernelConfig, fp8: bool = False) -> bool:
    """Whether one gate and one up row of the padded hidden width, and one row of each of the k experts'
    down of the padded intermediate width, fit a program's tile (else the K-looped kernels/moe_decode.py)."""
    slots = max(2, triton.next_power_of_2(top_k))
    tile, down_tile = _tiles(cfg, fp8)
    return 2 * triton.next_power_of_2(hidden) <= tile and slots * triton.next_power_of_2(inter) <= down_tile


def moe_gemv(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
             cfg: KernelConfig, gate_up_scale: torch.Tensor | None = None,
             down_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, H], weights [T, k], ids [T, k], gate_up [E, 2I, H], down [E, H, I] (model dtype, or e4m3 with
    scales [E, 2I, ceil(H / 128)] and [E, H, ceil(I / 128)]) -> [T, H] in x's dtype, in two kernels."""
    T, H, k, inter, fp8, x, ids, rw, act, y = decode_operands(x, weights, ids, gate_up, gate_up_scale)
    tile, down_tile = _tiles(cfg, fp8)
    kp_h, kp_i = triton.next_power_of_2(H), triton.next_power_of_2(inter)
    slots = max(2, triton.next_power_of_2(k))
    block_n = _pow2_floor(max(1, tile // (2 * kp_h)))  # a gate and an up row each
    block_n_down = _pow2_floor(max(1, down_tile // (slots * kp_i)))
    pdl = uses_pdl(x.device, cfg)
    packed = cfg.moe_fp8_packed_round and fp8 and x.is_cuda and x.dtype == torch.bfloat16
    direct = fp8 and cfg.moe_fp8_direct
    warps = cfg.moe_gemv_warps if T == 1 else cfg.moe_fp8_direct_multi_warps if direct else cfg.moe_gemv_multi_warps
    s, sse, ssn = scale_args(gate_up_scale, gate_up)
    _gate_up_gemv_kernel[(T * k, triton.cdiv(inter, block_n))](
        x, gate_up, s, ids, act, inter, H, x.stride(0), gate_up.stride(0), gate_up.stride(1), sse, ssn, act.stride(0),
        TOP_K=k, KP=kp_h, FP8=fp8, GROUP=FP8_GROUP, BLOCK_N=block_n, PDL=pdl,
        LOADS_FIRST=cfg.moe_gemv_loads_first and (direct or not fp8) and x.is_cuda, PACKED=packed, DIRECT=direct,
        num_warps=warps, **launch_args(pdl))
    s, sse, ssn = scale_args(down_scale, down)
    _down_gemv_kernel[(T, triton.cdiv(H, block_n_down))](
        act, down, s, ids, rw, y, H, inter, act.stride(0), down.stride(0), down.stride(1), sse, ssn, y.stride(0),
        TOP_K=k, SLOTS=slots, KP=kp_i, FP8=fp8, GROUP=FP8_GROUP, BLOCK_N=block_n_down, PDL=pdl, PACKED=packed,
        DIRECT=direct, num_warps=warps, **launch_args(pdl))
    return y


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)
