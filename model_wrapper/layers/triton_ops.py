"""Small Triton kernels for the CUDA path (imported only when Triton is there), among them:

silu_and_mul  [T, 2N] -> [T, N]: silu(gate) * up in one pass (fp32 math, one rounding), instead
              of torch's silu, then mul (three passes over the activations).
store_kv      writes this step's K and V rows [T, kv_heads * head_dim] at flat slots of the
              caller's caches in one launch; rows whose slot is -1 write nothing. Graph-safe: a
              padded decode batch simply carries -1 slots.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

# Programmatic dependent launch (Hopper and later, not under the interpreter): silu_and_mul and
# RoPE + K/V store are launched while the GEMM before them drains and wait (gdc_wait) before
# reading its output. Measured on an H100 (Llama-3-8B, batch 32 @ 2k, graph replay): 9.33 ->
# 9.17 ms a step. Not for their LoRA-fused variants: there it measured no gain (10.22 vs 10.23 ms
# with 1 adapter), with or without their B tiles read before the wait.
PDL = True


@functools.lru_cache(maxsize=None)
def _pdl(device: torch.device) -> bool:
    return PDL and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _launch(pdl: bool) -> dict:
    return dict(launch_pdl=True) if pdl else {}


@triton.jit
def _silu_mul(g, u):
    """silu(g) * u in fp32 (g, u of any float dtype)."""
    g = g.to(tl.float32)
    return g / (1.0 + tl.exp(-g)) * u.to(tl.float32)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, n, stride_x, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    if PDL:
        gdc_wait()  # the GEMM that wrote x is complete
    g = tl.load(x_ptr + row * stride_x + col, mask=m)
    u = tl.load(x_ptr + row * stride_x + n + col, mask=m)
    tl.store(out_ptr + row * stride_o + col, _silu_mul(g, u).to(out_ptr.dtype.element_ty), mask=m)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2N] (rows contiguous) -> [T, N]."""
    T, n2 = x.shape
    n = n2 // 2
    out = torch.empty(T, n, dtype=x.dtype, device=x.device)
    if T:
        block = 1024
        pdl = _pdl(x.device)
        _silu_and_mul_kernel[(T, triton.cdiv(n, block))](x, out, n, x.stride(0), out.stride(0), BLOCK=block, PDL=pdl,
                                                         **_launch(pdl))
    return out


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_k, stride_v, width,
                     BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = (offs < width) & (slot >= 0)
    k = tl.load(k_ptr + t * stride_k + offs, mask=m)
    v = tl.load(v_ptr + t * stride_v + offs, mask=m)
    tl.store(kc_ptr + slot * width + offs, k, mask=m)
    tl.store(vc_ptr + slot * width + offs, v, mask=m)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:
    """k, v [T, kv_heads, head_dim] (each row contiguous); caches [blocks, block_size, kv_heads,
    head_dim] contiguous; slots [T] int64, -1 = skip."""
    T = k.shape[0]
    width = k.shape[1] * k.shape[2]
    if T:
        _store_kv_kernel[(T,)](k, v, k_cache, v_cache, slots, k.stride(0), v.stride(0), width,
                               BLOCK=triton.next_power_of_2(width))


# -- fused kernels with an optional LoRA delta ------------------------------------------------------
#
# A projection's LoRA delta can be added by the kernel that consumes the projection's output,
# instead of by an expand kernel of its own (one launch and one pass over y fewer per projection):
# LoraBatch.finish_deferred hands over a LoraDelta (adapters.lora_batch) with the shrink's fp32
# partial sums s [splits, T, n_sub * R], the B stacks [slots, out_i, R], the per-token slots and
# true ranks (or, from a folded GEMM, s [1, T, slots * slot_stride] with every slot's shrink, token
# t's own at column slot * slot_stride: read at + slot * slot_stride below, 0 otherwise).
# For token t with slot >= 0, sub-module i, column n:
#     y[t, n] <- round(y[t, n] + sum_r round(sum_p s[p, t, i*R + r]) * B_i[slot, n, r])
# (the same roundings as the expand kernel: s summed in fp32 and rounded to the weights' dtype,
# products accumulated in fp32, one rounding of y). Rows with slot -1 (base model, padding) and
# columns r >= the true rank are never read.


@triton.jit
def _lora_s(s_ptr, rank_ptr, slot, t, sub, n_sub, R, num_splits, stride_sp, stride_sm, stride_ss, dtype,
            BLOCK_R: tl.constexpr, scale):
    """Token t's shrink output for sub-module `sub` (slot >= 0 assumed): the partials summed, times
    `scale` (the token's deferred RMSNorm factor, see _row_scale) and rounded to the weights' dtype,
    as fp32 [BLOCK_R], zero at r >= its true rank."""
    r = tl.arange(0, BLOCK_R)
    r_ok = r < tl.load(rank_ptr + slot * n_sub + sub)
    sv = tl.zeros([BLOCK_R], dtype=tl.float32)
    for p in range(num_splits):
        sv += tl.load(s_ptr + p * stride_sp + t * stride_sm + slot * stride_ss + sub * R + r, mask=r_ok,
                      other=0.0).to(tl.float32)
    return (sv * scale).to(dtype).to(tl.float32)


@triton.jit
def _row_scale(ss_ptr, t, nb, inv_n, eps, NB: tl.constexpr):
    """Row t's RMSNorm factor rsqrt(mean(v^2) + eps), from the nb sums of squares per column block
    that add_lora_rms_norm left at ss[t, :nb] (fp32)."""
    j = tl.arange(0, NB)
    ss = tl.sum(tl.load(ss_ptr + t * nb + j, mask=j < nb, other=0.0), axis=0)
    return 1.0 / tl.sqrt(ss * inv_n + eps)


@triton.jit
def _rows_scale(ss_ptr, t, nb, inv_n, eps, NB: tl.constexpr):
    """_row_scale of the rows t [BLOCK_T] -> [BLOCK_T]."""
    j = tl.arange(0, NB)
    ss = tl.sum(tl.load(ss_ptr + t[:, None] * nb + j[None, :], mask=(j < nb)[None, :], other=0.0), axis=1)
    return 1.0 / tl.sqrt(ss * inv_n + eps)


@triton.jit
def _lora_b(b_ptr, rank_ptr, slot, n, n_ok, sub, n_sub, n_out, R, BLOCK_R: tl.constexpr):
    """B_sub[slot, n, :] as a [len(n), BLOCK_R] tile, zero at r >= the true rank and where slot < 0
    (nothing read then)."""
    r = tl.arange(0, BLOCK_R)
    s = tl.maximum(slot, 0)
    rank = tl.where(slot >= 0, tl.load(rank_ptr + s * n_sub + sub), 0)
    return tl.load(b_ptr + s.to(tl.int64) * n_out * R + n[:, None] * R + r[None, :],
                   mask=n_ok[:, None] & (r < rank)[None, :], other=0.0)


@triton.jit
def _lora_add(x, bv, s_ptr, rank_ptr, slot, t, sub, n_sub, R, num_splits, stride_sp, stride_sm, stride_ss,
              BLOCK_R: tl.constexpr, scale):
    """x [len(n)] + token t's delta (bv: its _lora_b tile; slot >= 0), one rounding to x's dtype."""
    sv = _lora_s(s_ptr, rank_ptr, slot, t, sub, n_sub, R, num_splits, stride_sp, stride_sm, stride_ss, bv.dtype,
                 BLOCK_R, scale)
    return (x.to(tl.float32) + tl.sum(bv.to(tl.float32) * sv[None, :], axis=1)).to(x.dtype)


@triton.jit
def _token_group(groups_ptr, stride_g, S):
    """A slot-major program's group g (axis 0): -> (whether g < S is an adapter slot, the slot
    clamped to a valid index (int64), a pointer to groups[g] = [count, row, row, ...], count)."""
    grp = tl.program_id(0)
    row0 = groups_ptr + grp * stride_g
    return grp < S, tl.minimum(grp, S - 1).to(tl.int64), row0, tl.load(row0)


@triton.jit
def _silu_and_mul_lora_kernel(x_ptr, out_ptr, s_ptr, bg_ptr, bu_ptr, rank_ptr, groups_ptr, ss_ptr, n, R, S,
                              num_splits, stride_x, stride_o, stride_sp, stride_sm, stride_ss, stride_g, nb, inv_n,
                              eps, BLOCK_T: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr,
                              PRECISION: tl.constexpr, SCALED: tl.constexpr, NB: tl.constexpr):
    """Program (group, column block). Group g < S: the tokens of adapter slot g; g = S: the tokens
    without one (groups[g] = [count, row, row, ...], adapters.lora_groups). Each adapter's B tile is
    read once per step however many tokens use it, and not at all by a slot no token uses. SCALED:
    x and s are the projections of an unnormalised input (add_lora_rms_norm); each token's rows are
    first multiplied by its RMSNorm factor (_row_scale) and rounded, as the GEMM's output would be."""
    lora, s0, row0, count = _token_group(groups_ptr, stride_g, S)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    r = tl.arange(0, BLOCK_R)
    rank_g = tl.where(lora, tl.load(rank_ptr + s0 * 2), 0)
    rank_u = tl.where(lora, tl.load(rank_ptr + s0 * 2 + 1), 0)
    b_at = s0 * n * R + col[None, :] * R + r[:, None]  # [BLOCK_R, BLOCK] tile of B^T
    bg = tl.load(bg_ptr + b_at, mask=(count > 0) & m[None, :] & (r < rank_g)[:, None], other=0.0)
    bu = tl.load(bu_ptr + b_at, mask=(count > 0) & m[None, :] & (r < rank_u)[:, None], other=0.0)
    if count <= 2:  # one or two tokens (the common case with many adapters): CUDA-core products
        bgf = bg.to(tl.float32)
        buf = bu.to(tl.float32)
        for j in tl.static_range(2):
            ok = j < count
            t = tl.load(row0 + 1 + j, mask=ok, other=0).to(tl.int64)
            g = tl.load(x_ptr + t * stride_x + col, mask=m & ok, other=0.0)
            u = tl.load(x_ptr + t * stride_x + n + col, mask=m & ok, other=0.0)
            rs = 1.0
            if SCALED:
                rs = _row_scale(ss_ptr, t, nb, inv_n, eps, NB)
                g = (g.to(tl.float32) * rs).to(g.dtype)
                u = (u.to(tl.float32) * rs).to(u.dtype)
            if lora:  # (t = 0 where not ok: its s is read, its result never stored)
                sg = _lora_s(s_ptr, rank_ptr, s0, t, 0, 2, R, num_splits, stride_sp, stride_sm, stride_ss, bg.dtype,
                             BLOCK_R, rs)
                su = _lora_s(s_ptr, rank_ptr, s0, t, 1, 2, R, num_splits, stride_sp, stride_sm, stride_ss, bu.dtype,
                             BLOCK_R, rs)
                g = (g.to(tl.float32) + tl.sum(bgf * sg[:, None], axis=0)).to(g.dtype)
                u = (u.to(tl.float32) + tl.sum(buf * su[:, None], axis=0)).to(u.dtype)
            tl.store(out_ptr + t * stride_o + col, _silu_mul(g, u).to(out_ptr.dtype.element_ty), mask=m & ok)
    else:  # BLOCK_T tokens at a time through tensor-core products
        for c0 in range(0, count, BLOCK_T):
            i = c0 + tl.arange(0, BLOCK_T)
            ok = i < count
            t = tl.load(row0 + 1 + i, mask=ok, other=0).to(tl.int64)
            xm = ok[:, None] & m[None, :]
            g = tl.load(x_ptr + t[:, None] * stride_x + col[None, :], mask=xm, other=0.0)
            u = tl.load(x_ptr + t[:, None] * stride_x + n + col[None, :], mask=xm, other=0.0)
            rs = tl.full([BLOCK_T], 1.0, tl.float32)
            if SCALED:
                rs = _rows_scale(ss_ptr, t, nb, inv_n, eps, NB)
                g = (g.to(tl.float32) * rs[:, None]).to(g.dtype)
                u = (u.to(tl.float32) * rs[:, None]).to(u.dtype)
            if lora:  # the shrink rows summed over the splits and rounded to the weights' dtype, then @ B^T
                sg = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
                su = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
                for p in range(num_splits):
                    sp = s_ptr + p * stride_sp + t[:, None] * stride_sm + s0 * stride_ss + r[None, :]
                    sg += tl.load(sp, mask=ok[:, None] & (r < rank_g)[None, :], other=0.0).to(tl.float32)
                    su += tl.load(sp + R, mask=ok[:, None] & (r < rank_u)[None, :], other=0.0).to(tl.float32)
                sg = (sg * rs[:, None]).to(bg.dtype)
                su = (su * rs[:, None]).to(bu.dtype)
                g = (g.to(tl.float32) + tl.dot(sg, bg, input_precision=PRECISION)).to(g.dtype)
                u = (u.to(tl.float32) + tl.dot(su, bu, input_precision=PRECISION)).to(u.dtype)
            tl.store(out_ptr + t[:, None] * stride_o + col[None, :], _silu_mul(g, u).to(out_ptr.dtype.element_ty),
                     mask=xm)


SILU_LORA_BLOCK = 128  # columns per program
SILU_LORA_BLOCK_T = 16  # tokens of one group per tensor-core product (its smallest M)


def silu_and_mul_lora(x: torch.Tensor, d, scale: RowScale | None = None) -> torch.Tensor:
    """silu_and_mul of x [T, 2N] after adding the gate_up LoRA delta d (a LoraDelta: sub-modules
    gate, up; d.groups the step's tokens grouped by slot) to x; x itself is not written. -> [T, N].
    scale: x and d.s project add_lora_rms_norm's unnormalised rows; its RowScale normalises them."""
    T, n2 = x.shape
    n = n2 // 2
    out = torch.empty(T, n, dtype=x.dtype, device=x.device)
    if T:
        S = d.b[0].shape[0]
        groups = d.groups
        assert groups is not None and groups.shape[0] == S + 1 and groups.stride(1) == 1
        ss, nb, inv_n, eps = _scale_args(scale, x)
        _silu_and_mul_lora_kernel[(S + 1, triton.cdiv(n, SILU_LORA_BLOCK))](
            x, out, d.s, d.b[0], d.b[1], d.ranks, groups, ss, n, d.rank, S, d.s.shape[0], x.stride(0), out.stride(0),
            d.s.stride(0), d.s.stride(1), d.slot_stride, groups.stride(0), nb, inv_n, eps, BLOCK_T=SILU_LORA_BLOCK_T,
            BLOCK=SILU_LORA_BLOCK, BLOCK_R=max(16, triton.next_power_of_2(d.rank)),
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SCALED=scale is not None,
            NB=triton.next_power_of_2(nb), num_warps=4)
    return out


def _scale_args(scale, like: torch.Tensor) -> tuple:
    """-> (ss, nb, inv_n, eps) kernel arguments of a RowScale, or dummies for None (SCALED off)."""
    if scale is None:
        return like, 1, 1.0, 0.0
    return scale.ss, scale.ss.shape[1], 1.0 / scale.n, scale.eps


class RowScale(NamedTuple):
    """Each row's RMSNorm factor, left to the kernels after the next GEMM (add_lora_rms_norm).

    ss:  [T, nb] float32: row t's sums of squares, one per column block of the normalised rows
    n:   the hidden size (the mean's divisor)
    eps: the norm's epsilon
    """

    ss: torch.Tensor
    n: int
    eps: float


@triton.jit
def _add_lora_norm_kernel(h_ptr, res_ptr, w_ptr, ss_ptr, s_ptr, b_ptr, rank_ptr, groups_ptr, n, R, S, num_splits, nb,
                          stride_h, stride_r, stride_sp, stride_sm, stride_ss, stride_g, BLOCK_T: tl.constexpr,
                          BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, PRECISION: tl.constexpr):
    """Program (group, column block), groups as in _silu_and_mul_lora_kernel: for each of the
    group's tokens t, h[t] + its LoRA delta (one rounding) is added to residual[t] (one rounding,
    written back), then h[t] <- round(weight * residual[t]) and ss[t, block] <- the block's sum of
    residual[t]^2 (fp32), which the consumer of the next GEMM turns into the RMSNorm factor."""
    lora, s0, row0, count = _token_group(groups_ptr, stride_g, S)
    cb = tl.program_id(1)
    col = cb * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    r = tl.arange(0, BLOCK_R)
    rank = tl.where(lora, tl.load(rank_ptr + s0), 0)
    bt = tl.load(b_ptr + s0 * n * R + col[None, :] * R + r[:, None], mask=(count > 0) & m[None, :] & (r < rank)[:, None],
                 other=0.0)  # [BLOCK_R, BLOCK] tile of B^T
    w = tl.load(w_ptr + col, mask=m, other=0.0).to(tl.float32)
    if count <= 2:  # one or two tokens: CUDA-core products
        bf = bt.to(tl.float32)
        for j in tl.static_range(2):
            ok = j < count
            t = tl.load(row0 + 1 + j, mask=ok, other=0).to(tl.int64)
            hv = tl.load(h_ptr + t * stride_h + col, mask=m & ok, other=0.0)
            if lora:
                sv = _lora_s(s_ptr, rank_ptr, s0, t, 0, 1, R, num_splits, stride_sp, stride_sm, stride_ss, bt.dtype,
                             BLOCK_R, 1.0)
                hv = (hv.to(tl.float32) + tl.sum(bf * sv[:, None], axis=0)).to(hv.dtype)
            rv = (tl.load(res_ptr + t * stride_r + col, mask=m & ok, other=0.0).to(tl.float32)
                  + hv.to(tl.float32)).to(hv.dtype)
            tl.store(res_ptr + t * stride_r + col, rv, mask=m & ok)
            rf = rv.to(tl.float32)
            tl.store(h_ptr + t * stride_h + col, (rf * w).to(hv.dtype), mask=m & ok)
            tl.store(ss_ptr + t * nb + cb, tl.sum(rf * rf, axis=0), mask=ok)
    else:  # BLOCK_T tokens at a time, tensor-core products
        for c0 in range(0, count, BLOCK_T):
            i = c0 + tl.arange(0, BLOCK_T)
            ok = i < count
            t = tl.load(row0 + 1 + i, mask=ok, other=0).to(tl.int64)
            xm = ok[:, None] & m[None, :]
            hv = tl.load(h_ptr + t[:, None] * stride_h + col[None, :], mask=xm, other=0.0)
            if lora:
                sv = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
                for p in range(num_splits):
                    sv += tl.load(s_ptr + p * stride_sp + t[:, None] * stride_sm + s0 * stride_ss + r[None, :],
                                  mask=ok[:, None] & (r < rank)[None, :], other=0.0).to(tl.float32)
                hv = (hv.to(tl.float32) + tl.dot(sv.to(bt.dtype), bt, input_precision=PRECISION)).to(hv.dtype)
            res = res_ptr + t[:, None] * stride_r + col[None, :]
            rv = (tl.load(res, mask=xm, other=0.0).to(tl.float32) + hv.to(tl.float32)).to(hv.dtype)
            tl.store(res, rv, mask=xm)
            rf = rv.to(tl.float32)
            tl.store(h_ptr + t[:, None] * stride_h + col[None, :], (rf * w[None, :]).to(hv.dtype), mask=xm)
            tl.store(ss_ptr + t * nb + cb, tl.sum(rf * rf, axis=1), mask=ok)


ADD_NORM_BLOCK = 128  # columns per program


def add_lora_rms_norm(h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, d) -> RowScale:
    """The residual add and RMSNorm before a projection, with h's LoRA delta d (a LoraDelta of one
    sub-module, d.groups the tokens grouped by slot) added first, column-parallel: the norm's
    division is left to the kernel after the next GEMM (linear in its input row).

    In place: residual <- residual + (h + delta), h <- weight * residual (the rows before their
    division by rms(residual)); returns the RowScale that silu_and_mul_lora / rope_store_kv apply.
    h [T, n] and residual [T, n]: unit column stride."""
    T, n = h.shape
    nb = triton.cdiv(n, ADD_NORM_BLOCK)
    ss = torch.empty(T, nb, dtype=torch.float32, device=h.device)
    if T:
        S = d.b[0].shape[0]
        groups = d.groups
        assert groups is not None and groups.shape[0] == S + 1 and groups.stride(1) == 1 and len(d.b) == 1
        assert h.stride(1) == 1 and residual.stride(1) == 1 and weight.is_contiguous()
        _add_lora_norm_kernel[(S + 1, nb)](
            h, residual, weight, ss, d.s, d.b[0], d.ranks, groups, n, d.rank, S, d.s.shape[0], nb, h.stride(0),
            residual.stride(0), d.s.stride(0), d.s.stride(1), d.slot_stride, groups.stride(0), BLOCK_T=SILU_LORA_BLOCK_T,
            BLOCK=ADD_NORM_BLOCK, BLOCK_R=max(16, triton.next_power_of_2(d.rank)),
            PRECISION="ieee" if h.dtype == torch.float32 else "tf32", num_warps=4)
    return RowScale(ss, n, eps)


@triton.jit
def _rotate_half_pair(x1, x2, cos, sin, dtype):
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    return (a * cos - b * sin).to(dtype), (b * cos + a * sin).to(dtype)


@triton.jit
def _rope_lora_tiles(bq_ptr, bk_ptr, bv_ptr, rank_ptr, lslot, head, j, half, full, ok, HQ, HK, R, D: tl.constexpr,
                     BLOCK_R: tl.constexpr):
    """The B tiles of program (token, head): q's or k's rows of the head's two halves, and v's
    rows for a kv head (an empty tile for a q head)."""
    if head < HQ:
        b_ptr = bq_ptr
        sub = 0
        n_out = HQ * D
        c0 = head * D
    else:
        b_ptr = bk_ptr
        sub = 1
        n_out = HK * D
        c0 = j * D
    b1 = _lora_b(b_ptr, rank_ptr, lslot, c0 + half, ok, sub, 3, n_out, R, BLOCK_R)
    b2 = _lora_b(b_ptr, rank_ptr, lslot, c0 + D // 2 + half, ok, sub, 3, n_out, R, BLOCK_R)
    bvt = _lora_b(bv_ptr, rank_ptr, tl.where(head >= HQ, lslot, -1), j * D + full, full < D, 2, 3, HK * D, R,
                  BLOCK_R)
    return b1, b2, bvt


@triton.jit
def _rope_store_kernel(qkv_ptr, pos_ptr, cs_ptr, kc_ptr, vc_ptr, slot_ptr, s_ptr, bq_ptr, bk_ptr, bv_ptr, rank_ptr,
                       lslot_ptr, ss_ptr, R, num_splits, stride_qkv, stride_sp, stride_sm, stride_ss, stride_cs, HQ, HK,
                       nb, inv_n, eps, D: tl.constexpr, LORA: tl.constexpr, BLOCK_R: tl.constexpr, PDL: tl.constexpr,
                       SCALED: tl.constexpr, NB: tl.constexpr):
    """Program (token, head): head < HQ rotates q head `head` in place; otherwise, for kv head
    j = head - HQ, rotates k head j in place and writes it and v head j at the token's cache slot.
    SCALED: qkv (and s) project add_lora_rms_norm's unnormalised rows: each is first multiplied by
    the token's RMSNorm factor and rounded (written back too: qkv ends as the true projection)."""
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dtype = qkv_ptr.dtype.element_ty
    half = tl.arange(0, D // 2)
    full = tl.arange(0, D)
    ok = half < D // 2
    j = tl.maximum(head - HQ, 0)
    if PDL:
        gdc_wait()  # the GEMM that wrote qkv is complete
    if LORA:
        lslot = tl.load(lslot_ptr + t)
        b1, b2, bvt = _rope_lora_tiles(bq_ptr, bk_ptr, bv_ptr, rank_ptr, lslot, head, j, half, full, ok, HQ, HK, R, D,
                                       BLOCK_R)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cs_ptr + pos * stride_cs + half)
    sin = tl.load(cs_ptr + pos * stride_cs + D // 2 + half)
    row = qkv_ptr + t * stride_qkv
    if head < HQ:
        base = row + head * D  # q head `head`
    else:
        base = row + HQ * D + j * D  # k head j
    x1 = tl.load(base + half)
    x2 = tl.load(base + D // 2 + half)
    rs = 1.0
    if SCALED:
        rs = _row_scale(ss_ptr, t, nb, inv_n, eps, NB)
        x1 = (x1.to(tl.float32) * rs).to(dtype)
        x2 = (x2.to(tl.float32) * rs).to(dtype)
    if LORA:
        if lslot >= 0:
            sub = tl.where(head < HQ, 0, 1)  # q or k
            x1 = _lora_add(x1, b1, s_ptr, rank_ptr, lslot, t, sub, 3, R, num_splits, stride_sp, stride_sm, stride_ss,
                           BLOCK_R, rs)
            x2 = _lora_add(x2, b2, s_ptr, rank_ptr, lslot, t, sub, 3, R, num_splits, stride_sp, stride_sm, stride_ss,
                           BLOCK_R, rs)
    o1, o2 = _rotate_half_pair(x1, x2, cos, sin, dtype)
    tl.store(base + half, o1)
    tl.store(base + D // 2 + half, o2)
    if head >= HQ:  # v head j: its delta, and k and v into the cache
        vbase = row + (HQ + HK) * D + j * D
        v = tl.load(vbase + full)
        if SCALED:
            v = (v.to(tl.float32) * rs).to(dtype)
        if LORA:
            if lslot >= 0:
                v = _lora_add(v, bvt, s_ptr, rank_ptr, lslot, t, 2, 3, R, num_splits, stride_sp, stride_sm,
                              stride_ss, BLOCK_R, rs)
        if SCALED or LORA:
            tl.store(vbase + full, v)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            cache = slot * (HK * D) + j * D
            tl.store(kc_ptr + cache + half, o1)
            tl.store(kc_ptr + cache + D // 2 + half, o2)
            tl.store(vc_ptr + cache + full, v)


def rope_store_kv(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, num_heads: int,
                  num_kv_heads: int, head_dim: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slots: torch.Tensor, d=None, scale: RowScale | None = None) -> None:
    """In place on qkv [T, (Hq + 2 Hk) * D] (rows contiguous): the qkv LoRA delta d (a LoraDelta, sub-
    modules q, k, v; None = no LoRA) added, q and k rotated (neox form, cos / sin from the float32
    [P, D] table: cos half then sin half), and k and v written at flat `slots` of the caches
    [blocks, block_size, Hk, D] (contiguous; slot -1 writes nothing): RoPE, the K/V store and the
    LoRA expand in one launch. scale: qkv and d.s project add_lora_rms_norm's unnormalised rows;
    its RowScale normalises them first."""
    T = qkv.shape[0]
    if not T:
        return
    lora = d is not None
    pdl = _pdl(qkv.device) and not lora and scale is None
    block_r = max(16, triton.next_power_of_2(d.rank)) if lora else 16
    s = d.s if lora else qkv
    bq, bk, bv = d.b if lora else (qkv, qkv, qkv)
    ss, nb, inv_n, eps = _scale_args(scale, qkv)
    _rope_store_kernel[(T, num_heads + num_kv_heads)](
        qkv, positions, cos_sin_cache, k_cache, v_cache, slots, s, bq, bk, bv, d.ranks if lora else slots,
        d.token_slot if lora else slots, ss, d.rank if lora else 1, s.shape[0] if lora else 0, qkv.stride(0),
        s.stride(0) if lora else 0, s.stride(1) if lora else 0, d.slot_stride if lora else 0, cos_sin_cache.stride(0),
        num_heads, num_kv_heads, nb, inv_n, eps,
        D=head_dim, LORA=lora, BLOCK_R=block_r, PDL=pdl, SCALED=scale is not None, NB=triton.next_power_of_2(nb),
        **_launch(pdl))
