"""Kernels that add a projection's deferred LoRA delta in the epilogue of the kernel consuming its
output: silu_and_mul_lora (gate_up), add_lora_rms_norm (o / down, with the residual add and the
next RMSNorm), and the LoRA tiles of the fused RoPE + K/V store (kernels/kv_store.py).

LoraBatch.finish_deferred (adapters/lora_batch.py) hands over a LoraDelta with the shrink's fp32
partial sums s [splits, T, n_sub * R], the B stacks [slots, out_i, R], the per-token slots and
true ranks (or, from a folded GEMM, s [1, T, slots * slot_stride] with every slot's shrink, token
t's own at column slot * slot_stride: read at + slot * slot_stride below, 0 otherwise).
For token t with slot >= 0, sub-module i, column n:
    y[t, n] <- round(y[t, n] + sum_r round(sum_p s[p, t, i*R + r]) * B_i[slot, n, r])
(the same roundings as the expand kernel: s summed in fp32 and rounded to the weights' dtype,
products accumulated in fp32, one rounding of y). Rows with slot -1 (base model, padding) and
the columns r >= the true rank of s are never read; B tiles are read whole (_b_mask).

Written for latency (one launch and one pass over y fewer per projection than an expand kernel):
- B tiles masked only along n (not by the rank), so that they are read in 16-byte vectors;
- a program reads every row it needs before it writes any (a store holds later loads back: the
  compiler cannot move a load above a store that may alias it), and without a branch or a loop
  around the LoRA loads (the splits of s unrolled: NUM_SPLITS; no delta = rank 0, masked);
- a slot-major program of a slot no token uses returns at once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, silu_mul
from model_wrapper.kernels.config import KernelConfig


@triton.jit
def _b_mask(n_ok, rank, r, R, RPAD: tl.constexpr):
    """Where a B tile is read: its columns n_ok of a slot with a delta (rank > 0), every r < R.
    Not masked by the rank: B is zero past each adapter's rank (LoraManager._write_slot zeroes a
    slot before writing it; s is masked by the rank, so that a product there is 0 * 0), and a mask
    constant along r lets the tile be read in 16-byte vectors instead of element by element.
    RPAD: the tile is wider than the stack (BLOCK_R > R)."""
    ok = n_ok & (rank > 0)
    if RPAD:
        ok = ok & (r < R)
    return ok


@triton.jit
def _lora_s(s_ptr, rank, slot, t, sub, R, stride_sp, stride_sm, stride_ss, dtype, BLOCK_R: tl.constexpr,
            NUM_SPLITS: tl.constexpr, scale):
    """Token t's shrink output for sub-module `sub` of `slot`: the partials summed, times `scale`
    (the token's deferred RMSNorm factor, see row_scale) and rounded to the weights' dtype, as
    fp32 [BLOCK_R], zero at r >= rank (the true rank; 0 where the token has no delta: nothing
    read). Straight-line loads (the splits unrolled), so that a caller's loads of several rows
    are all in flight at once."""
    r = tl.arange(0, BLOCK_R)
    at = s_ptr + t * stride_sm + tl.maximum(slot, 0) * stride_ss + sub * R + r
    sv = tl.zeros([BLOCK_R], dtype=tl.float32)
    for p in tl.static_range(NUM_SPLITS):
        sv += tl.load(at + p * stride_sp, mask=r < rank, other=0.0).to(tl.float32)
    return (sv * scale).to(dtype).to(tl.float32)


@triton.jit
def row_scale(ss_ptr, t, nb, inv_n, eps, NB: tl.constexpr):
    """Row t's RMSNorm factor rsqrt(mean(v^2) + eps), from the nb sums of squares per column block
    that add_lora_rms_norm left at ss[t, :nb] (fp32)."""
    j = tl.arange(0, NB)
    ss = tl.sum(tl.load(ss_ptr + t * nb + j, mask=j < nb, other=0.0), axis=0)
    return 1.0 / tl.sqrt(ss * inv_n + eps)


@triton.jit
def _rows_scale(ss_ptr, t, nb, inv_n, eps, NB: tl.constexpr):
    """row_scale of the rows t [BLOCK_T] -> [BLOCK_T]."""
    j = tl.arange(0, NB)
    ss = tl.sum(tl.load(ss_ptr + t[:, None] * nb + j[None, :], mask=(j < nb)[None, :], other=0.0), axis=1)
    return 1.0 / tl.sqrt(ss * inv_n + eps)


@triton.jit
def _lora_b(b_ptr, rank, slot, n, n_ok, n_out, R, BLOCK_R: tl.constexpr, RPAD: tl.constexpr):
    """B[slot, n, :] as a [len(n), BLOCK_R] tile (rank 0, no delta: zero, nothing read). Read
    whole rows: B is zero past each adapter's rank (see _b_mask)."""
    r = tl.arange(0, BLOCK_R)
    return tl.load(b_ptr + tl.maximum(slot, 0).to(tl.int64) * n_out * R + n[:, None] * R + r[None, :],
                   mask=_b_mask(n_ok[:, None], rank, r[None, :], R, RPAD), other=0.0)


@triton.jit
def lora_add(x, bv, s_ptr, rank, slot, t, sub, R, stride_sp, stride_sm, stride_ss, BLOCK_R: tl.constexpr,
              NUM_SPLITS: tl.constexpr, scale):
    """x [len(n)] + token t's delta (bv: its _lora_b tile), one rounding to x's dtype; x itself
    where rank is 0 (no delta)."""
    sv = _lora_s(s_ptr, rank, slot, t, sub, R, stride_sp, stride_sm, stride_ss, bv.dtype, BLOCK_R, NUM_SPLITS, scale)
    return tl.where(rank > 0, (x.to(tl.float32) + tl.sum(bv.to(tl.float32) * sv[None, :], axis=1)).to(x.dtype), x)


@triton.jit
def _token_group(groups_ptr, stride_g, S):
    """A slot-major program's group g (axis 0): -> (whether g < S is an adapter slot, the slot
    clamped to a valid index (int64), a pointer to groups[g] = [count, row, row, ...], count)."""
    grp = tl.program_id(0)
    row0 = groups_ptr + grp * stride_g
    return grp < S, tl.minimum(grp, S - 1).to(tl.int64), row0, tl.load(row0)


@triton.jit
def _silu_lora_row(x_ptr, s_ptr, ss_ptr, bgf, buf, rank_g, rank_u, s0, t, col, m, n, R, stride_x, stride_sp,
                   stride_sm, stride_ss, nb, inv_n, eps, BLOCK_R: tl.constexpr, NUM_SPLITS: tl.constexpr,
                   SCALED: tl.constexpr, NB: tl.constexpr):
    """silu(gate) * up (fp32) of token t's columns `col` of x [T, 2N]: scaled by its RMSNorm factor
    (SCALED) and with its gate_up delta added (bgf / buf its slot's B^T tiles in fp32; ranks 0: no
    delta). Loads only, no branch: a caller's two rows are read at once."""
    g = tl.load(x_ptr + t * stride_x + col, mask=m, other=0.0)
    u = tl.load(x_ptr + t * stride_x + n + col, mask=m, other=0.0)
    rs = 1.0
    if SCALED:
        rs = row_scale(ss_ptr, t, nb, inv_n, eps, NB)
        g = (g.to(tl.float32) * rs).to(g.dtype)
        u = (u.to(tl.float32) * rs).to(u.dtype)
    dt = g.dtype
    sg = _lora_s(s_ptr, rank_g, s0, t, 0, R, stride_sp, stride_sm, stride_ss, dt, BLOCK_R, NUM_SPLITS, rs)
    su = _lora_s(s_ptr, rank_u, s0, t, 1, R, stride_sp, stride_sm, stride_ss, dt, BLOCK_R, NUM_SPLITS, rs)
    g = tl.where(rank_g > 0, (g.to(tl.float32) + tl.sum(bgf * sg[:, None], axis=0)).to(dt), g)
    u = tl.where(rank_u > 0, (u.to(tl.float32) + tl.sum(buf * su[:, None], axis=0)).to(dt), u)
    return silu_mul(g, u)


@triton.jit
def _silu_and_mul_lora_kernel(x_ptr, out_ptr, s_ptr, bg_ptr, bu_ptr, rank_ptr, groups_ptr, ss_ptr, n, R, S,
                              stride_x, stride_o, stride_sp, stride_sm, stride_ss, stride_g, nb, inv_n, eps,
                              BLOCK_T: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, RPAD: tl.constexpr,
                              NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr, SCALED: tl.constexpr,
                              NB: tl.constexpr):
    """Program (group, column block). Group g < S: the tokens of adapter slot g; g = S: the tokens
    without one (groups[g] = [count, row, row, ...], adapters.lora_groups). Each adapter's B tile is
    read once per step however many tokens use it, and not at all by a slot no token uses. SCALED:
    x and s are the projections of an unnormalised input (add_lora_rms_norm); each token's rows are
    first multiplied by its RMSNorm factor (row_scale) and rounded, as the GEMM's output would be."""
    lora, s0, row0, count = _token_group(groups_ptr, stride_g, S)
    if count == 0:  # (a slot no token of this step uses)
        return
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    r = tl.arange(0, BLOCK_R)
    rank_g = tl.where(lora, tl.load(rank_ptr + s0 * 2), 0)
    rank_u = tl.where(lora, tl.load(rank_ptr + s0 * 2 + 1), 0)
    b_at = s0 * n * R + col[None, :] * R + r[:, None]  # [BLOCK_R, BLOCK] tile of B^T
    bg = tl.load(bg_ptr + b_at, mask=_b_mask(m[None, :], rank_g, r[:, None], R, RPAD), other=0.0)
    bu = tl.load(bu_ptr + b_at, mask=_b_mask(m[None, :], rank_u, r[:, None], R, RPAD), other=0.0)
    if count <= 2:  # one or two tokens (the common case with many adapters): CUDA-core products; both
        # rows are read before either is written (a store would hold the second row's loads back); with
        # one token the second is row 0, read and never written
        bgf = bg.to(tl.float32)
        buf = bu.to(tl.float32)
        t0 = tl.load(row0 + 1).to(tl.int64)
        t1 = tl.load(row0 + 2, mask=count > 1, other=0).to(tl.int64)
        y0 = _silu_lora_row(x_ptr, s_ptr, ss_ptr, bgf, buf, rank_g, rank_u, s0, t0, col, m, n, R, stride_x,
                            stride_sp, stride_sm, stride_ss, nb, inv_n, eps, BLOCK_R, NUM_SPLITS, SCALED, NB)
        y1 = _silu_lora_row(x_ptr, s_ptr, ss_ptr, bgf, buf, rank_g, rank_u, s0, t1, col, m, n, R, stride_x,
                            stride_sp, stride_sm, stride_ss, nb, inv_n, eps, BLOCK_R, NUM_SPLITS, SCALED, NB)
        tl.store(out_ptr + t0 * stride_o + col, y0.to(out_ptr.dtype.element_ty), mask=m)
        tl.store(out_ptr + t1 * stride_o + col, y1.to(out_ptr.dtype.element_ty), mask=m & (count > 1))
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
            # the shrink rows summed over the splits and rounded to the weights' dtype, then @ B^T
            sg = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            su = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            for p in tl.static_range(NUM_SPLITS):
                sp = s_ptr + p * stride_sp + t[:, None] * stride_sm + s0 * stride_ss + r[None, :]
                sg += tl.load(sp, mask=ok[:, None] & (r < rank_g)[None, :], other=0.0).to(tl.float32)
                su += tl.load(sp + R, mask=ok[:, None] & (r < rank_u)[None, :], other=0.0).to(tl.float32)
            sg = (sg * rs[:, None]).to(bg.dtype)
            su = (su * rs[:, None]).to(bu.dtype)
            g = tl.where(rank_g > 0, (g.to(tl.float32) + tl.dot(sg, bg, input_precision=PRECISION)).to(g.dtype), g)
            u = tl.where(rank_u > 0, (u.to(tl.float32) + tl.dot(su, bu, input_precision=PRECISION)).to(u.dtype), u)
            tl.store(out_ptr + t[:, None] * stride_o + col[None, :], silu_mul(g, u).to(out_ptr.dtype.element_ty),
                     mask=xm)




def silu_and_mul_lora(x: torch.Tensor, d, scale: RowScale | None = None,
                      cfg: KernelConfig = DEFAULT) -> torch.Tensor:
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
        ss, nb, inv_n, eps = scale_args(scale, x)
        _silu_and_mul_lora_kernel[(S + 1, triton.cdiv(n, cfg.silu_lora_block))](
            x, out, d.s, d.b[0], d.b[1], d.ranks, groups, ss, n, d.rank, S, x.stride(0), out.stride(0),
            d.s.stride(0), d.s.stride(1), d.slot_stride, groups.stride(0), nb, inv_n, eps,
            BLOCK_T=cfg.silu_lora_block_t, BLOCK=cfg.silu_lora_block, **rank_args(d.rank), NUM_SPLITS=d.s.shape[0],
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SCALED=scale is not None,
            NB=triton.next_power_of_2(nb), num_warps=cfg.silu_lora_warps)
    return out



def rank_args(R: int) -> dict:
    """BLOCK_R (a power of two >= 16, the smallest tensor-core K) and RPAD of a stack of rank R."""
    block_r = max(16, triton.next_power_of_2(R))
    return {"BLOCK_R": block_r, "RPAD": block_r != R}


def scale_args(scale, like: torch.Tensor) -> tuple:
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
def _add_lora_row(h_ptr, res_ptr, s_ptr, bf, rank, s0, t, col, m, R, stride_h, stride_r, stride_sp, stride_sm,
                  stride_ss, BLOCK_R: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """round(residual[t] + round(h[t] + delta)) at columns `col` (bf: the slot's B^T tile in fp32;
    rank 0: no delta). Loads only, no branch."""
    hv = tl.load(h_ptr + t * stride_h + col, mask=m, other=0.0)
    sv = _lora_s(s_ptr, rank, s0, t, 0, R, stride_sp, stride_sm, stride_ss, hv.dtype, BLOCK_R, NUM_SPLITS, 1.0)
    hv = tl.where(rank > 0, (hv.to(tl.float32) + tl.sum(bf * sv[:, None], axis=0)).to(hv.dtype), hv)
    return (tl.load(res_ptr + t * stride_r + col, mask=m, other=0.0).to(tl.float32) + hv.to(tl.float32)).to(hv.dtype)


@triton.jit
def _norm_row_out(h_ptr, res_ptr, ss_ptr, rv, w, t, col, m, cb, nb, stride_h, stride_r, ok):
    """Writes residual[t] <- rv, h[t] <- round(w * rv) and ss[t, cb] <- sum(rv^2) (fp32)."""
    tl.store(res_ptr + t * stride_r + col, rv, mask=m)
    rf = rv.to(tl.float32)
    tl.store(h_ptr + t * stride_h + col, (rf * w).to(rv.dtype), mask=m)
    tl.store(ss_ptr + t * nb + cb, tl.sum(rf * rf, axis=0), mask=ok)


@triton.jit
def _add_lora_norm_kernel(h_ptr, res_ptr, w_ptr, ss_ptr, s_ptr, b_ptr, rank_ptr, groups_ptr, n, R, S, nb, stride_h,
                          stride_r, stride_sp, stride_sm, stride_ss, stride_g, BLOCK_T: tl.constexpr,
                          BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, RPAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
                          PRECISION: tl.constexpr):
    """Program (group, column block), groups as in _silu_and_mul_lora_kernel: for each of the
    group's tokens t, h[t] + its LoRA delta (one rounding) is added to residual[t] (one rounding,
    written back), then h[t] <- round(weight * residual[t]) and ss[t, block] <- the block's sum of
    residual[t]^2 (fp32), which the consumer of the next GEMM turns into the RMSNorm factor."""
    lora, s0, row0, count = _token_group(groups_ptr, stride_g, S)
    if count == 0:  # (a slot no token of this step uses)
        return
    cb = tl.program_id(1)
    col = cb * BLOCK + tl.arange(0, BLOCK)
    m = col < n
    r = tl.arange(0, BLOCK_R)
    rank = tl.where(lora, tl.load(rank_ptr + s0), 0)
    bt = tl.load(b_ptr + s0 * n * R + col[None, :] * R + r[:, None], mask=_b_mask(m[None, :], rank, r[:, None], R, RPAD),
                 other=0.0)  # [BLOCK_R, BLOCK] tile of B^T
    w = tl.load(w_ptr + col, mask=m, other=0.0).to(tl.float32)
    if count <= 2:  # one or two tokens: CUDA-core products, both rows read before either is written
        bf = bt.to(tl.float32)
        t0 = tl.load(row0 + 1).to(tl.int64)
        t1 = tl.load(row0 + 2, mask=count > 1, other=0).to(tl.int64)
        m1 = m & (count > 1)
        r0 = _add_lora_row(h_ptr, res_ptr, s_ptr, bf, rank, s0, t0, col, m, R, stride_h, stride_r, stride_sp,
                           stride_sm, stride_ss, BLOCK_R, NUM_SPLITS)
        r1 = _add_lora_row(h_ptr, res_ptr, s_ptr, bf, rank, s0, t1, col, m1, R, stride_h, stride_r, stride_sp,
                           stride_sm, stride_ss, BLOCK_R, NUM_SPLITS)
        _norm_row_out(h_ptr, res_ptr, ss_ptr, r0, w, t0, col, m, cb, nb, stride_h, stride_r, True)
        _norm_row_out(h_ptr, res_ptr, ss_ptr, r1, w, t1, col, m1, cb, nb, stride_h, stride_r, count > 1)
    else:  # BLOCK_T tokens at a time, tensor-core products
        for c0 in range(0, count, BLOCK_T):
            i = c0 + tl.arange(0, BLOCK_T)
            ok = i < count
            t = tl.load(row0 + 1 + i, mask=ok, other=0).to(tl.int64)
            xm = ok[:, None] & m[None, :]
            hv = tl.load(h_ptr + t[:, None] * stride_h + col[None, :], mask=xm, other=0.0)
            sv = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            for p in tl.static_range(NUM_SPLITS):
                sv += tl.load(s_ptr + p * stride_sp + t[:, None] * stride_sm + s0 * stride_ss + r[None, :],
                              mask=ok[:, None] & (r < rank)[None, :], other=0.0).to(tl.float32)
            hv = tl.where(rank > 0,
                          (hv.to(tl.float32) + tl.dot(sv.to(bt.dtype), bt, input_precision=PRECISION)).to(hv.dtype), hv)
            res = res_ptr + t[:, None] * stride_r + col[None, :]
            rv = (tl.load(res, mask=xm, other=0.0).to(tl.float32) + hv.to(tl.float32)).to(hv.dtype)
            tl.store(res, rv, mask=xm)
            rf = rv.to(tl.float32)
            tl.store(h_ptr + t[:, None] * stride_h + col[None, :], (rf * w[None, :]).to(hv.dtype), mask=xm)
            tl.store(ss_ptr + t * nb + cb, tl.sum(rf * rf, axis=1), mask=ok)



def add_lora_rms_norm(h: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, d,
                      cfg: KernelConfig = DEFAULT) -> RowScale:
    """The residual add and RMSNorm before a projection, with h's LoRA delta d (a LoraDelta of one
    sub-module, d.groups the tokens grouped by slot) added first, column-parallel: the norm's
    division is left to the kernel after the next GEMM (linear in its input row).

    In place: residual <- residual + (h + delta), h <- weight * residual (the rows before their
    division by rms(residual)); returns the RowScale that silu_and_mul_lora / rope_store_kv apply.
    h [T, n] and residual [T, n]: unit column stride."""
    T, n = h.shape
    nb = triton.cdiv(n, cfg.add_norm_block)
    ss = torch.empty(T, nb, dtype=torch.float32, device=h.device)
    if T:
        S = d.b[0].shape[0]
        groups = d.groups
        assert groups is not None and groups.shape[0] == S + 1 and groups.stride(1) == 1 and len(d.b) == 1
        assert h.stride(1) == 1 and residual.stride(1) == 1 and weight.is_contiguous()
        _add_lora_norm_kernel[(S + 1, nb)](
            h, residual, weight, ss, d.s, d.b[0], d.ranks, groups, n, d.rank, S, nb, h.stride(0), residual.stride(0),
            d.s.stride(0), d.s.stride(1), d.slot_stride, groups.stride(0), BLOCK_T=cfg.silu_lora_block_t,
            BLOCK=cfg.add_norm_block, **rank_args(d.rank), NUM_SPLITS=d.s.shape[0],
            PRECISION="ieee" if h.dtype == torch.float32 else "tf32", num_warps=cfg.add_norm_warps)
    return RowScale(ss, n, eps)



@triton.jit
def rope_lora_tiles(bq_ptr, bk_ptr, bv_ptr, rank_ptr, lslot, head, j, half, full, ok, HQ, HK, R, D: tl.constexpr,
                     BLOCK_R: tl.constexpr, RPAD: tl.constexpr):
    """-> (b1, b2, bv, sub, rank, rank_v) of program (token, head): the B tiles of q's or k's rows
    of the head's two halves (sub-module `sub`: 0 = q, 1 = k) and of v's rows for a kv head, and
    the true ranks of their sub-modules; ranks 0 (empty tiles, nothing read) where the token has
    no adapter, and rank_v 0 for a q head."""
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
    has = lslot >= 0
    at = rank_ptr + tl.maximum(lslot, 0) * 3
    rank = tl.where(has, tl.load(at + sub), 0)
    rank_v = tl.where(has & (head >= HQ), tl.load(at + 2), 0)
    b1 = _lora_b(b_ptr, rank, lslot, c0 + half, ok, n_out, R, BLOCK_R, RPAD)
    b2 = _lora_b(b_ptr, rank, lslot, c0 + D // 2 + half, ok, n_out, R, BLOCK_R, RPAD)
    bvt = _lora_b(bv_ptr, rank_v, lslot, j * D + full, full < D, HK * D, R, BLOCK_R, RPAD)
    return b1, b2, bvt, sub, rank, rank_v

