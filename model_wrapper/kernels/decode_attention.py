"""Paged decode attention in Triton: one query token per request over its paged K/V, split-KV.

The decode CUDA graphs (model_wrapper/cuda_graph.py) run it in place of FlashInfer's decode
wrapper. It reads the same page metadata (kv_indptr, kv_indices, kv_last_page_len): request r's
KV length is
    L_r = (indptr[r + 1] - indptr[r] - 1) * page + last[r]
and its token t lives at page indices[indptr[r] + t // page], row t % page, of the NHD caches
[num_blocks, page, kv_heads, head_dim].

A program takes one (request, KV head, split): the GQA group's query heads as the rows of one
tensor-core product (padded to 16), a contiguous share of the request's (windowed) KV range,
read BLOCK_N keys a step with an online softmax in fp32. With one split it writes the output;
with several, each writes its normalised partial output and log2-sum-exp, and a second kernel
merges the splits of each (request, head).

FP8 (e4m3) caches: the layer's K scale goes into the softmax scale and its V scale into the
output (float32 scalars read through pointers once a program, so CUDA graphs see later changes;
no per-tile multiply). How K/V reach the tensor cores (fp8_math; SASS of the loop per 64 keys,
4 warps, sm90, from the ahead-of-time build of tests/kernels/test_fp8_kv_compile.py):
    "q_dtype"   K, V -> q's dtype through Triton's conversion: e4m3 -> bf16 is a cvt to f16x2 and
                then one F2F per value (a slow pipe), and V, which the product reads along keys
                (its rows), comes from shared memory a byte at a time (LDS.U8): 974 instructions
                (a bf16 cache: 524 for twice the bytes). Measured 0.31-0.44 of copy bandwidth
    "fp16"      K, V -> fp16 (one cvt.f16x2.e4m3x2 per two values), q and p in fp16: 789
    "fp16_vreg" K as "fp16"; V converted in the registers it was loaded into, before the layout
                change, so that it reaches the product through shared memory as fp16 (16-byte
                stores, ldmatrix.trans) instead of byte loads: 497 (382 a 64 keys at 128 a step)
    "bits_vreg" as "fp16_vreg", V's conversion by bit moves instead of cvt (integer pipes): the
                e4m3 byte's sign to bit 15, exponent and mantissa to bits 13..7 of an fp16, which
                is the value * 2^-8 exactly, subnormals included (both formats' subnormals are
                mantissa * 2^(1 - bias)); the 2^8 goes into the V scale
The "_vreg" conversions are PTX marked impure (Triton would otherwise move them past the layout
change); under the interpreter Triton ops compute the same values. In the fp16 modes q enters as
fp16(q * 2^-8) (exact for 2^-9 <= |q| < 2^24: nothing overflows; smaller entries round to fp16's
subnormal step, 2^-17 of the unscaled q, far below bf16's own rounding of the larger entries) and
the 2^8 goes into the softmax scale; p rounds to fp16 (finer than bf16). Every mode computes the
same attention over the same e4m3 values.

Against FlashInfer's tensor-core decode as the graphs plan it, a little faster in whole decode
steps at every batch and context measured (benchmarks/ab_decode_attention.py). 64 keys a step in
3 stages: fewer keys or stages lost at long contexts in a sweep.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import gdc_launch_dependents, gdc_wait, launch_args
from model_wrapper.kernels.kv_store import _to_cache


@triton.jit
def _attend(q, k, v, ok, m_i, l_i, acc, scale_log2):
    """One block of keys into the online softmax: -> (m_i, l_i, acc)."""
    qk = tl.dot(q, tl.trans(k)) * scale_log2
    qk = tl.where(ok[None, :], qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet (an empty split): no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(qk - m_use[:, None])
    return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)


@triton.jit
def _e4m3_bits_to_f16(x):
    """uint8 e4m3 bytes -> fp16 holding the e4m3 value * 2^-8 (see the module docstring)."""
    x = x.to(tl.uint16)
    return (((x & 0x80) << 8) | ((x & 0x7F) << 7)).to(tl.float16, bitcast=True)


@triton.jit
def _v_in_registers(v, BITS: tl.constexpr, INTERPRET: tl.constexpr):
    """V's e4m3 tile [BLOCK_N, D] -> fp16 in the layout it was loaded in (BITS: the value * 2^-8 by
    bit moves, else the value by cvt). The assembly is marked impure so that Triton cannot move it
    past the layout change the product needs (it would then read V bytewise from shared memory);
    the interpreter, which runs no assembly, computes the same values with Triton ops."""
    if INTERPRET:
        if BITS:
            return _e4m3_bits_to_f16(v.to(tl.uint8, bitcast=True))
        return v.to(tl.float16)
    if BITS:  # bytes [b3 b2 b1 b0] -> [b1 0 b0 0], [b3 0 b2 0]; sign stays, exponent + mantissa >> 1
        return tl.inline_asm_elementwise(
            "{ .reg .b32 a, b, t;\n"
            "prmt.b32 a, $2, 0, 0x1404;\n"
            "prmt.b32 b, $2, 0, 0x3424;\n"
            "shr.b32 t, a, 1;\n"
            "and.b32 t, t, 0x3f803f80;\n"
            "and.b32 a, a, 0x80008000;\n"
            "or.b32 $0, t, a;\n"
            "shr.b32 t, b, 1;\n"
            "and.b32 t, t, 0x3f803f80;\n"
            "and.b32 b, b, 0x80008000;\n"
            "or.b32 $1, t, b; }",
            "=r,=r,r", [v.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi;\n"
        "mov.b32 {lo, hi}, $2;\n"
        "cvt.rn.f16x2.e4m3x2 $0, lo;\n"
        "cvt.rn.f16x2.e4m3x2 $1, hi; }",
        "=r,=r,r", [v.to(tl.uint8, bitcast=True)], dtype=tl.float16, is_pure=False, pack=4)


@triton.jit
def _qk_norm_rope(x1, x2, w1, w2, cos, sin, qk_eps, AXIS: tl.constexpr, D: tl.constexpr, QK_NORM: tl.constexpr):
    """Heads as halves x1, x2 (of qkv's dtype; heads along the other axis than AXIS, the halves' elements
    along AXIS): (the RMSNorm with weight halves w1, w2,) then RoPE with cos / sin halves (float32): element
    for element the arithmetic of kv_store._rope_store_kernel, each half's sum of squares apart."""
    dtype = x1.dtype
    if QK_NORM:
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        rs = tl.math.rsqrt((tl.sum(a1 * a1, axis=AXIS) + tl.sum(a2 * a2, axis=AXIS)) / D + qk_eps)
        if AXIS == 1:
            rs = rs[:, None]
        x1 = (w1 * (a1 * rs).to(dtype).to(tl.float32)).to(dtype)
        x2 = (w2 * (a2 * rs).to(dtype).to(tl.float32)).to(dtype)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    return (a * cos - b * sin).to(dtype), (b * cos + a * sin).to(dtype)


@triton.jit
def _rope_inputs(pos_ptr, cs_ptr, slot_ptr, qn_ptr, kn_ptr, r, stride_cs, D: tl.constexpr, QK_NORM: tl.constexpr):
    """What the fused RoPE + store reads besides qkv (none of it written by this step's kernels, so it may be
    read before the PDL wait): cos, sin halves [D / 2] float32 at the token's position, its cache slot, and
    the q / k norm weights' halves (float32; ones without QK_NORM, unused)."""
    half = tl.arange(0, D // 2)
    pos = tl.load(pos_ptr + r).to(tl.int64)
    cos = tl.load(cs_ptr + pos * stride_cs + half)
    sin = tl.load(cs_ptr + pos * stride_cs + D // 2 + half)
    slot = tl.load(slot_ptr + r).to(tl.int64)
    wq1 = tl.full([D // 2], 1.0, tl.float32)
    wq2 = wq1
    wk1 = wq1
    wk2 = wq1
    if QK_NORM:
        wq1 = tl.load(qn_ptr + half).to(tl.float32)
        wq2 = tl.load(qn_ptr + D // 2 + half).to(tl.float32)
        wk1 = tl.load(kn_ptr + half).to(tl.float32)
        wk2 = tl.load(kn_ptr + D // 2 + half).to(tl.float32)
    return cos, sin, slot, wq1, wq2, wk1, wk2


@triton.jit
def _rope_q(row, heads, row_ok, cos, sin, w1, w2, qk_eps, D: tl.constexpr, GROUP_PAD: tl.constexpr,
            QK_NORM: tl.constexpr):
    """The program's q heads [GROUP_PAD, D] from the unrotated qkv row `row`: (q_norm,) RoPE, the halves
    then put side by side."""
    half = tl.arange(0, D // 2)
    base = row + heads[:, None] * D
    x1 = tl.load(base + half[None, :], mask=row_ok[:, None], other=0.0)
    x2 = tl.load(base + D // 2 + half[None, :], mask=row_ok[:, None], other=0.0)
    o1, o2 = _qk_norm_rope(x1, x2, w1[None, :], w2[None, :], cos[None, :], sin[None, :], qk_eps, 1, D, QK_NORM)
    return tl.reshape(tl.permute(tl.join(o1, o2), (0, 2, 1)), (GROUP_PAD, D))


@triton.jit
def _rope_kv_new(row, HQ, h, KVH, kc_ptr, vc_ptr, ks_ptr, vs_ptr, cos, sin, slot, w1, w2, qk_eps, STORE,
                 D: tl.constexpr, FP8: tl.constexpr, QK_NORM: tl.constexpr):
    """KV head h of the new token from the unrotated qkv row: k (k_norm,) rotated -> (k, v) [D] as the cache
    holds them (e4m3: their bytes as uint8), the arithmetic of kv_store._rope_store_kernel; where STORE, also
    written at the token's cache slot as that kernel writes them (for later steps: this launch reads the
    returned rows instead, _with_new_row)."""
    half = tl.arange(0, D // 2)
    full = tl.arange(0, D)
    kbase = row + (HQ + h) * D
    x1 = tl.load(kbase + half)
    x2 = tl.load(kbase + D // 2 + half)
    v = tl.load(row + (HQ + KVH + h) * D + full)
    o1, o2 = _qk_norm_rope(x1, x2, w1, w2, cos, sin, qk_eps, 0, D, QK_NORM)
    cdt = kc_ptr.dtype.element_ty
    k1, k2, vc = _to_cache(o1, ks_ptr, FP8, cdt), _to_cache(o2, ks_ptr, FP8, cdt), _to_cache(v, vs_ptr, FP8, cdt)
    if STORE:
        cache = slot * (KVH * D) + h * D
        tl.store(kc_ptr + cache + half, k1)
        tl.store(kc_ptr + cache + D // 2 + half, k2)
        tl.store(vc_ptr + cache + full, vc)
    if FP8:  # (a select of e4m3 values by their bytes)
        k1, k2, vc = k1.to(tl.uint8, bitcast=True), k2.to(tl.uint8, bitcast=True), vc.to(tl.uint8, bitcast=True)
    return tl.reshape(tl.permute(tl.join(k1, k2), (1, 0)), (D,)), vc


@triton.jit
def _with_new_row(x, new, is_new, FP8: tl.constexpr):
    """A loaded K or V tile [BLOCK_N, D] with the rows where is_new [BLOCK_N] replaced by new [D] (uint8 bytes
    where FP8)."""
    if FP8:
        y = tl.where(is_new[:, None], new[None, :], x.to(tl.uint8, bitcast=True)).to(x.dtype, bitcast=True)
    else:
        y = tl.where(is_new[:, None], new[None, :], x)
    return y


@triton.jit
def _prefetch_first_tile(k_ptr, v_ptr, indices_ptr, p0, start, end, stride_kb, stride_kt, kv_head, PAGE: tl.constexpr,
                         BLOCK_N: tl.constexpr, D: tl.constexpr, PF_LINES: tl.constexpr):
    """Into L2 (prefetch.global.L2, a hint nothing waits for): the K and V rows of the split's first BLOCK_N keys,
    PF_LINES 128-byte lines a row; keys past the split's end prefetch the cache's first row instead."""
    t = start + tl.arange(0, BLOCK_N)
    ok = t < end
    page = tl.load(indices_ptr + p0 + t // PAGE, mask=ok, other=0).to(tl.int64)
    off = page * stride_kb + (t % PAGE) * stride_kt + kv_head
    lines = (off[:, None] + (tl.arange(0, PF_LINES) * (D // PF_LINES))[None, :]) * ok[:, None]
    for base in tl.static_range(2):
        ptr = k_ptr if base == 0 else v_ptr
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [(ptr + lines).to(tl.int64)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _load_tile(k_ptr, v_ptr, indices_ptr, p0, n0, end, stride_kb, stride_kt, kv_head, d, PAGE: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Keys n0 .. n0 + BLOCK_N of the request (those < end): -> (K, V tiles [BLOCK_N, D] as cached, t, t < end)."""
    t = n0 + tl.arange(0, BLOCK_N)
    ok = t < end
    page = tl.load(indices_ptr + p0 + t // PAGE, mask=ok, other=0).to(tl.int64)
    off = page * stride_kb + (t % PAGE) * stride_kt + kv_head
    k = tl.load(k_ptr + off[:, None] + d[None, :], mask=ok[:, None], other=0.0)
    v = tl.load(v_ptr + off[:, None] + d[None, :], mask=ok[:, None], other=0.0)
    return k, v, t, ok


@triton.jit
def _use_tile(q, k, v, t, ok, new_key, k_new, v_new, m_i, l_i, acc, scale_log2, ROPE: tl.constexpr,
              FP8: tl.constexpr, MATH: tl.constexpr, INTERPRET: tl.constexpr):
    """A loaded tile (the new key's row from registers where ROPE) to the tensor cores' operands, into the
    online softmax: -> (m_i, l_i, acc)."""
    if ROPE:
        k = _with_new_row(k, k_new, t == new_key, FP8)
        v = _with_new_row(v, v_new, t == new_key, FP8)
    if MATH >= 2:
        k, v = k.to(tl.float16), _v_in_registers(v, MATH == 3, INTERPRET)
    elif FP8:
        k, v = k.to(q.dtype), v.to(q.dtype)
    return _attend(q, k, v, ok, m_i, l_i, acc, scale_log2)


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, last_ptr, o_ptr, part_ptr, lse_ptr,
                   ks_ptr, vs_ptr, scale_log2, window, min_chunk, stride_qt, stride_qh, stride_kb, stride_kt,
                   stride_ot, stride_oh, pos_ptr, cs_ptr, slot_ptr, qn_ptr, kn_ptr, qk_eps, stride_cs, HQ,
                   PAGE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                   BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, FP8: tl.constexpr, MATH: tl.constexpr,
                   INTERPRET: tl.constexpr, PDL: tl.constexpr, ROPE: tl.constexpr, QK_NORM: tl.constexpr,
                   EARLY: tl.constexpr, PF_LINES: tl.constexpr, PEEL: tl.constexpr):
    # MATH (FP8 only): FP8_MATHS' number of fp8_math
    # (3: the same in PTX)
    # ROPE: q_ptr is the qkv projection's rows [B, (HQ + 2 KVH) * D], unrotated; see _rope_q / _rope_kv_new
    # EARLY (with PDL): the page metadata (and the fused RoPE's positions, table rows, slots, norm weights) read
    # before the wait: no kernel of the step writes them (the host's copies precede the step's first kernel);
    # PF_LINES > 0 (with EARLY): the split's first tile of K / V prefetched into L2 before the wait too (the new
    # key's row is taken from registers, not from what was loaded); PEEL (ROPE): that tile loaded into registers
    # before q is made (before the wait where EARLY), its softmax step taken out of the loop
    if PDL:  # the next kernel (the merge, or o's GEMV) may launch now; q and the K/V store are complete after
        gdc_launch_dependents()
        if not EARLY:
            gdc_wait()
    r = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    p0 = tl.load(indptr_ptr + r)
    p1 = tl.load(indptr_ptr + r + 1)
    L = (p1 - p0 - 1) * PAGE + tl.load(last_ptr + r)
    lo = 0
    if window > 0:
        lo = tl.maximum(L - window, 0)
    # min_chunk (a multiple of BLOCK_N, or 0): short contexts on fewer splits, the others empty
    chunk = tl.maximum(tl.cdiv(tl.cdiv(L - lo, SPLITS), BLOCK_N) * BLOCK_N, min_chunk)
    start = lo + s * chunk
    end = tl.minimum(start + chunk, L)

    rows = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    heads = h * GROUP + rows
    row_ok = rows < GROUP
    kv_head = h * D  # column offset of this KV head within a token's row
    if ROPE:
        cos, sin, slot, wq1, wq2, wk1, wk2 = _rope_inputs(pos_ptr, cs_ptr, slot_ptr, qn_ptr, kn_ptr, r, stride_cs, D,
                                                          QK_NORM)
    if PEEL:  # (ROPE only) the split's first tile read before q is made (before the PDL wait where EARLY): no kernel
        # of the step writes those rows but the new key's, which comes from registers (_with_new_row)
        k0, v0, t0, ok0 = _load_tile(k_ptr, v_ptr, indices_ptr, p0, start, end, stride_kb, stride_kt, kv_head, d, PAGE,
                                     BLOCK_N)
    if PDL and EARLY:
        if PF_LINES > 0:
            _prefetch_first_tile(k_ptr, v_ptr, indices_ptr, p0, start, end, stride_kb, stride_kt, h * D, PAGE, BLOCK_N,
                                 D, PF_LINES)
        gdc_wait()
    if ROPE:
        row = q_ptr + r.to(tl.int64) * stride_qt
        q = _rope_q(row, heads, row_ok, cos, sin, wq1, wq2, qk_eps, D, GROUP_PAD, QK_NORM)
        # the split that holds the new key (L - 1) stores its K / V for later steps; in this launch every program
        # takes that row from registers (no read of what it wrote: no ordering of a store and a load needed)
        new_key = tl.where(slot >= 0, L - 1, -1)  # slot -1 (padding): the row as the cache holds it
        k_new, v_new = _rope_kv_new(row, HQ, h, tl.num_programs(1), k_ptr, v_ptr, ks_ptr, vs_ptr, cos, sin, slot,
                                    wk1, wk2, qk_eps, (start <= L - 1) & (L - 1 < end) & (slot >= 0), D, FP8,
                                    QK_NORM)
    else:
        q = tl.load(q_ptr + r.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None], other=0.0)
        new_key, k_new, v_new = -1, 0, 0  # (unused without ROPE)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    out_scale = 1.0
    if FP8:  # e4m3 scores are q.k~ / k_scale: the K scale goes into the softmax scale
        scale_log2 = scale_log2 * tl.load(ks_ptr)
        out_scale = tl.load(vs_ptr)
        if MATH != 0:  # q as fp16(q * 2^-8): its 2^8 back into the scale
            q = (q.to(tl.float32) * 0.00390625).to(tl.float16)
            scale_log2 = scale_log2 * 256.0
        if MATH == 3:  # V comes as value * 2^-8
            out_scale = out_scale * 256.0
    first = start
    if PEEL:  # the first tile, loaded above: into the softmax now
        m_i, l_i, acc = _use_tile(q, k0, v0, t0, ok0, new_key, k_new, v_new, m_i, l_i, acc, scale_log2, ROPE, FP8,
                                  MATH, INTERPRET)
        first = start + BLOCK_N
    for n0 in range(first, end, BLOCK_N):
        k, v, t, ok = _load_tile(k_ptr, v_ptr, indices_ptr, p0, n0, end, stride_kb, stride_kt, kv_head, d, PAGE,
                                 BLOCK_N)
        m_i, l_i, acc = _use_tile(q, k, v, t, ok, new_key, k_new, v_new, m_i, l_i, acc, scale_log2, ROPE, FP8, MATH,
                                  INTERPRET)
    if FP8:
        acc = acc * out_scale

    if SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(o_ptr + r.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        # an empty split (start >= end) leaves l_i = 0: it writes zeros and lse = -inf (weight 0)
        seen = l_i > 0
        out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        base = (r.to(tl.int64) * tl.num_programs(1) * GROUP + heads) * SPLITS + s  # [B, H, S] flat
        tl.store(part_ptr + base[:, None] * D + d[None, :], out, mask=row_ok[:, None])
        tl.store(lse_ptr + base, lse, mask=row_ok)


@triton.jit
def _merge_kernel(part_ptr, lse_ptr, o_ptr, stride_ot, stride_oh, H, SPLITS: tl.constexpr,
                  SPLITS_PAD: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # o's GEMV may launch (and read its weights) while the splits finish; they are complete after
        gdc_launch_dependents()
        gdc_wait()
    r = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, D)
    base = (r.to(tl.int64) * H + h) * SPLITS
    lse = tl.load(lse_ptr + base + sp, mask=sp < SPLITS, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))
    part = tl.load(part_ptr + (base + sp)[:, None] * D + d[None, :], mask=(sp < SPLITS)[:, None], other=0.0)
    out = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(o_ptr + r.to(tl.int64) * stride_ot + h * stride_oh + d, out.to(o_ptr.dtype.element_ty))


FP8_MATHS = {"q_dtype": 0, "fp16": 1, "fp16_vreg": 2, "bits_vreg": 3}
# launch defaults per cache dtype: keys a step of the loop (64: four pages of 16), warps, pipeline
# stages, and for e4m3 how K/V reach the tensor cores
# (e4m3, H200 sweep of bench_fp8_kv.py --sweep, K/V bytes / time / copy bandwidth at batch 64-128 x
# 2k-8k: bits_vreg at 128 keys 0.57-0.65, fp16_vreg 0.57-0.63, fp16 0.50-0.56, q_dtype at 64 keys
# (the old default) 0.37-0.45; FlashInfer's e4m3 decode 0.51-0.60. 8 warps or 256 keys lose; 3 and 4
# stages tie (the pipeline double-buffers either way). maxnreg: the register cap, None: the compiler's.
# H100 sweep of --sweep --occupancy (benchmarks/results/session33/fp8_kv_occupancy_h100.log): capped at
# 128 registers, 64 keys a step (4 programs a SM instead of 2 at 195 registers) take 0.79-0.86 of copy
# bandwidth at 64-128 x 2k-8k (geomean 0.83) against 128 keys uncapped 0.75-0.83 (0.79); a loss only at
# 32 x 2048 (0.59 against 0.70), a gain at 512 tokens (0.68-0.73 against 0.61-0.68)
LAUNCH = {
    "16-bit": dict(block_n=64, num_warps=4, num_stages=3, maxnreg=None),
    "e4m3": dict(block_n=64, num_warps=4, num_stages=3, maxnreg=128, fp8_math="bits_vreg"),
}
MAX_SPLITS = 16

# e4m3 launches by batch: (largest batch, what replaces LAUNCH["e4m3"]'s values there; split_factor:
# decode_splits' splits times it), the first row whose batch is not below the step's. A decode graph
# runs one batch, so it keeps one launch; the context plays no part (graphs replay any context).
# H100, bench_fp8_kv.py --sweep --by-batch (session 34, K/V bytes / time / copy bandwidth at 2k / 8k):
# batch 32 with one split a (request, KV head) runs 256 programs for 3-4 slots a SM on 132 SMs:
# 0.59 / 0.64, with two 0.72 / 0.81 (four 0.68 / 0.80; 128 keys 0.70 / 0.78); batch 64: V through
# "fp16_vreg" 0.80 / 0.85 against "bits_vreg" 0.76 / 0.84 (session 33: 0.80 / 0.86 against 0.79 /
# 0.85); batch 16 (4 splits already) and 128: the plain row is the best or within 1%
E4M3_BY_BATCH = ((16, {}), (32, {"split_factor": 2}), (64, {"fp8_math": "fp16_vreg"}))


def launch_for(fp8: bool, batch: int) -> dict:
    """The launch paged_decode_attention takes by default for `batch` rows: LAUNCH's row of the
    cache dtype, for e4m3 with E4M3_BY_BATCH's replacements (split_factor: decode_splits')."""
    row = LAUNCH["e4m3" if fp8 else "16-bit"]
    if fp8:
        for most, over in E4M3_BY_BATCH:
            if batch <= most:
                return {**row, **over}
    return row


def decode_splits(batch: int, num_kv_heads: int, sms: int, kv_dtype: torch.dtype | None = None) -> int:
    """KV splits per (request, KV head): none where those pairs alone fill the SMs; otherwise a
    power of two giving about two programs per SM, at most MAX_SPLITS. An e4m3 cache (kv_dtype)
    multiplies that by launch_for's split_factor (a function of the batch alone: graph-safe)."""
    pairs = max(1, batch * num_kv_heads)
    if pairs >= sms:
        splits = 1
    else:
        want = -(-2 * sms // pairs)
        splits = 1 << (want - 1).bit_length()
    if kv_dtype == torch.float8_e4m3fn:
        splits *= launch_for(True, batch).get("split_factor", 1)
    return min(MAX_SPLITS, splits)


def fits(dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int) -> bool:
    """What the kernel handles: q of a 16-bit float dtype, K/V of that dtype or float8_e4m3fn, a
    power-of-two head_dim >= 16 (the caches contiguous NHD, the rows of q contiguous)."""
    return (dtype in (torch.float16, torch.bfloat16) and kv_dtype in (dtype, torch.float8_e4m3fn)
            and head_dim >= 16 and head_dim & (head_dim - 1) == 0)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                           scale: float, *, window: int | None = None, splits: int = 1,
                           block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                           maxnreg: int | None = None,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                           fp8_math: str | None = None, pdl: bool = False, min_split_keys: int = 0,
                           early_meta: bool = False, prefetch: bool = False) -> torch.Tensor:
    """q [B, H, D] (one token per request) -> [B, H, D]; caches [blocks, page, KVH, D] of q's dtype
    or float8_e4m3fn (then read as e4m3 * k_scale / v_scale: float32 one-element device tensors,
    the e4m3 values through fp8_math, a key of FP8_MATHS: see the module docstring). pdl: launch the
    kernels as programmatic dependents (sm90+; KernelConfig.decode_attention_pdl_max_batch): each waits for the one
    before it and lets the next launch at once.

    window: a token sees its last `window` keys (itself included), or all when None. block_n,
    num_warps, num_stages, maxnreg, fp8_math: None takes launch_for(B)'s (LAUNCH's row of the cache
    dtype, for e4m3 by batch: E4M3_BY_BATCH). splits: the caller's (decode_splits with the cache dtype).
    min_split_keys: each split takes at least this many keys (rounded up to block_n; 0: an even share),
    so that a short context runs on fewer splits and the rest are empty (KernelConfig.decode_split_min_keys).
    early_meta (with pdl): the page metadata read before the wait for the kernel before
    (KernelConfig.decode_attention_early_meta): it must not be written by the kernels of the step. prefetch
    (with both; KernelConfig.decode_attention_prefetch): each program's first tile of K / V into L2 before it too."""
    return _launch(q, None, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, scale, window, splits,
                   block_n, num_warps, num_stages, maxnreg, k_scale, v_scale, fp8_math, pdl, min_split_keys, early_meta,
                   prefetch)


def rope_paged_decode_attention(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                                slots: torch.Tensor, num_heads: int, num_kv_heads: int, k_cache: torch.Tensor,
                                v_cache: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                                kv_last_page_len: torch.Tensor, scale: float, *, qk_norm=None,
                                window: int | None = None, splits: int = 1, k_scale: torch.Tensor | None = None,
                                v_scale: torch.Tensor | None = None, pdl: bool = False, min_split_keys: int = 0,
                                early_meta: bool = False, prefetch: bool = False, early_tile: bool = False,
                                **launch) -> torch.Tensor:
    """kv_store.rope_store_kv and paged_decode_attention in one launch, for one token per request:
    qkv [B, (H + 2 KVH) * D] (the projection's rows, unrotated, rows contiguous; left as they are),
    positions [B], slots [B] (-1: nothing stored), cos_sin_cache float32 [P, D] (cos half, then sin
    half), qk_norm (q_norm weight [D], k_norm weight [D], eps) or None -> [B, H, D].

    Every program rotates (and normalises) its own q heads and its KV head's new k; the one program
    a (request, KV head) whose split holds the new key (position L - 1 of the page metadata, which
    must be `slots`' row) writes k and v at the slot (e4m3: / k_scale, / v_scale, as the store
    kernel) for later steps, and uses them from registers in place of that row of its tile (so no
    program reads what this launch writes). The same values as rope_store_kv, then paged_decode_attention (other keywords:
    theirs; early_meta also reads positions, slots, the table and the norm weights before the PDL wait).
    early_tile: each program loads its first tile of K / V before making q (before the PDL wait with
    early_meta), so that those loads overlap the wait and q (KernelConfig.decode_rope_attention_early_tile)."""
    B = qkv.shape[0]
    D = k_cache.shape[-1]
    if qkv.shape[1] != (num_heads + 2 * num_kv_heads) * D or qkv.stride(1) != 1:
        raise ValueError(f"rope_paged_decode_attention: qkv must be [B, {(num_heads + 2 * num_kv_heads) * D}] with "
                         f"contiguous rows, got {tuple(qkv.shape)} strides {qkv.stride()}")
    q = qkv[:, : num_heads * D].view(B, num_heads, D)
    qn, kn, eps = qk_norm if qk_norm is not None else (qkv, qkv, 0.0)
    rope = (positions, cos_sin_cache, slots, qn, kn, float(eps), cos_sin_cache.stride(0), qk_norm is not None,
            early_tile)
    return _launch(q, rope, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, scale, window, splits,
                   launch.get("block_n"), launch.get("num_warps"), launch.get("num_stages"), launch.get("maxnreg"),
                   k_scale, v_scale, launch.get("fp8_math"), pdl, min_split_keys, early_meta, prefetch)


def _launch(q, rope, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, scale, window, splits, block_n,
            num_warps, num_stages, maxnreg, k_scale, v_scale, fp8_math, pdl, min_split_keys, early_meta, prefetch):
    """The decode kernel (and the split merge) over q [B, H, D]; rope: None, or the fused RoPE + store's
    (positions, cos_sin_cache, slots, q_norm w, k_norm w, eps, cos_sin stride, QK_NORM, early_tile) with q a
    view of qkv."""
    B, H, D = q.shape
    _, page, KVH, _ = k_cache.shape
    group = H // KVH
    out = torch.empty(B, H, D, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    if splits > 1:
        part = torch.empty(B, H, splits, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, H, splits, dtype=torch.float32, device=q.device)
    else:
        part = lse = out
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    dflt = launch_for(fp8, B)
    block_n = dflt["block_n"] if block_n is None else block_n
    num_warps = dflt["num_warps"] if num_warps is None else num_warps
    num_stages = dflt["num_stages"] if num_stages is None else num_stages
    fp8_math = dflt.get("fp8_math", "q_dtype") if fp8_math is None else fp8_math
    maxnreg = dflt["maxnreg"] if maxnreg is None else maxnreg
    # registers per thread capped (more programs a SM) where asked; the interpreter takes no such option
    cap = {} if maxnreg is None or os.environ.get("TRITON_INTERPRET") == "1" else {"maxnreg": maxnreg}
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("paged_decode_attention: an e4m3 cache needs k_scale and v_scale")
    if fp8_math not in FP8_MATHS:
        raise ValueError(f"paged_decode_attention: fp8_math must be one of {sorted(FP8_MATHS)}, got {fp8_math!r}")
    math_id = FP8_MATHS[fp8_math] if fp8 else 0
    if math_id == 2 and q.is_cuda and torch.cuda.get_device_capability(q.device) < (8, 9):
        math_id = 1  # cvt.f16x2.e4m3x2 is sm89+: Triton's own conversion (emulated there)
    # 128-byte lines of a K / V row (a GPU instruction: not under the interpreter)
    pf_lines = 0
    if pdl and early_meta and prefetch and os.environ.get("TRITON_INTERPRET") != "1":
        pf_lines = max(1, D * k_cache.element_size() // 128)
    pos, cs, slots, qn, kn, eps, stride_cs, qk_norm, peel = rope if rope is not None else (
        kv_indptr, kv_indptr, kv_indptr, kv_indptr, kv_indptr, 0.0, 0, False, False)
    _decode_kernel[(B, KVH, splits)](
        q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, part, lse,
        k_scale if fp8 else kv_indptr, v_scale if fp8 else kv_indptr,
        scale * math.log2(math.e), 0 if window is None else window, -(-min_split_keys // block_n) * block_n,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        pos, cs, slots, qn, kn, eps, stride_cs, H,
        PAGE=page, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=D,
        BLOCK_N=block_n, SPLITS=splits, FP8=fp8, MATH=math_id,
        INTERPRET=os.environ.get("TRITON_INTERPRET") == "1", PDL=pdl, ROPE=rope is not None, QK_NORM=qk_norm,
        EARLY=pdl and early_meta, PF_LINES=pf_lines, PEEL=peel,
        num_warps=num_warps, num_stages=num_stages, **cap, **launch_args(pdl))
    if splits > 1:
        _merge_kernel[(B, H)](part, lse, out, out.stride(0), out.stride(1), H, SPLITS=splits,
                              SPLITS_PAD=max(2, triton.next_power_of_2(splits)), D=D, PDL=pdl, num_warps=4,
                              **launch_args(pdl))
    return out
