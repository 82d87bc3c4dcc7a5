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
3 stages: fewer keys or stages lost at long contexts in a sweep (at 3-4 stages K / V have one buffer: see
LAUNCH).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from model_wrapper.kernels import e4m3_decode_cuda
from model_wrapper.kernels.common import (gdc_launch_dependents, gdc_wait, launch_args, max_shared_memory,
                                         stages_that_fit)
from model_wrapper.kernels.fp8_act import _quantize_store
from model_wrapper.kernels.fp8_reference import FP8_MAX, MIN_AMAX, QuantizedActivation
from model_wrapper.kernels.kv_store import _to_cache


@triton.jit
def paged_kv(k_ptr, v_ptr, indices_ptr, p0, t, ok, stride_kb, stride_kt, kv_head, d, PAGE: tl.constexpr):
    """The K and V rows of a request's keys t [BLOCK_N] (ok: t is one of them) from the paged cache, the
    request's pages listed at indices_ptr + p0, a KV head's columns kv_head + d -> (k, v) [BLOCK_N, D]
    (zeros where not ok). Shared by the decode, verify and prefill kernels."""
    page = tl.load(indices_ptr + p0 + t // PAGE, mask=ok, other=0).to(tl.int64)
    off = page * stride_kb + (t % PAGE) * stride_kt + kv_head
    k = tl.load(k_ptr + off[:, None] + d[None, :], mask=ok[:, None], other=0.0)
    v = tl.load(v_ptr + off[:, None] + d[None, :], mask=ok[:, None], other=0.0)
    return k, v


@triton.jit
def attend(q, k, v, vis, m_i, l_i, acc, scale_log2):
    """One block of keys into the online softmax of q's rows: vis [ROWS, BLOCK_N] (or [1, BLOCK_N]) which
    keys a row sees -> (m_i, l_i, acc). Shared by the decode, verify and prefill kernels."""
    qk = tl.dot(q, tl.trans(k)) * scale_log2
    qk = tl.where(vis, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no visible key yet (an empty split): no NaN
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
def e4m3_scales(q, scale_log2, ks_ptr, vs_ptr, FP8: tl.constexpr, MATH: tl.constexpr):
    """An e4m3 cache's scales (FP8; the decode and prefill kernels): e4m3 scores are q.k~ / k_scale, so the
    K scale goes into the softmax scale, and the V scale onto the output. MATH (FP8_MATHS) != 0: q enters
    as fp16(q * 2^-8), its 2^8 back into the scale; MATH 3: V comes as value * 2^-8, its 2^8 onto the
    output. -> (q, scale_log2, out_scale)"""
    out_scale = 1.0
    if FP8:
        scale_log2 = scale_log2 * tl.load(ks_ptr)
        out_scale = tl.load(vs_ptr)
        if MATH != 0:
            q = (q.to(tl.float32) * 0.00390625).to(tl.float16)
            scale_log2 = scale_log2 * 256.0
        if MATH == 3:
            out_scale = out_scale * 256.0
    return q, scale_log2, out_scale


@triton.jit
def e4m3_operands(k, v, q_dtype: tl.constexpr, FP8: tl.constexpr, MATH: tl.constexpr, INTERPRET: tl.constexpr):
    """A K / V tile as the tensor-core products take it: a 16-bit cache's as it is; e4m3 through fp8_math
    MATH (K to fp16 and V in its registers for the "_vreg" modes, else both to q's dtype). -> (k, v)"""
    if MATH >= 2:
        k, v = k.to(tl.float16), _v_in_registers(v, MATH == 3, INTERPRET)
    elif FP8:
        k, v = k.to(q_dtype), v.to(q_dtype)
    return k, v


def fp8_math_id(fp8_math: str, fp8: bool, device: torch.device, caller: str) -> int:
    """The kernels' MATH constant for fp8_math (a key of FP8_MATHS; 0 for a 16-bit cache); "fp16_vreg"'s
    cvt.f16x2.e4m3x2 is sm89+: "fp16" (Triton's own conversion, emulated there) on older GPUs."""
    if fp8_math not in FP8_MATHS:
        raise ValueError(f"{caller}: fp8_math must be one of {sorted(FP8_MATHS)}, got {fp8_math!r}")
    math_id = FP8_MATHS[fp8_math] if fp8 else 0
    if math_id == 2 and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        math_id = 1
    return math_id


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
def _norm_rope(xa, xb, cos, sin, first, wa_ptr, wb_ptr, eps, D: tl.constexpr, QK_NORM: tl.constexpr):
    """RoPE (neox form) of head rows xa [R, D] in their dtype, xb their rotate-half partners (column (d + D / 2) % D
    of each row), cos / sin [D] at column d % (D / 2), first: d < D / 2; QK_NORM: each row RMS-normalised first, times
    the weight whose columns wa_ptr / wb_ptr [D] address (Qwen3's q / k norm). kv_store's _qk_norm and _rotate_half_pair
    per value (the rotation bit for bit; the norm's fp32 sum of squares in another order)."""
    dtype = xa.dtype
    a, b = xa.to(tl.float32), xb.to(tl.float32)
    if QK_NORM:
        r = tl.math.rsqrt(tl.sum(a * a, axis=1, keep_dims=True) / D + eps)
        a = (tl.load(wa_ptr).to(tl.float32)[None, :] * (a * r).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        b = (tl.load(wb_ptr).to(tl.float32)[None, :] * (b * r).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    # the first half is x1 cos - x2 sin, the second x2 cos + x1 sin, each as kv_store writes it
    return tl.where(first[None, :], a * cos[None, :] - b * sin[None, :], a * cos[None, :] + b * sin[None, :]).to(dtype)


@triton.jit
def _rope_store_new_key(qkv_row, cs_ptr, pos, slot_ptr, r, kn_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, qk_eps, h, HQ, HK,
                        d, D: tl.constexpr, FP8: tl.constexpr, QK_NORM: tl.constexpr):
    """The step's own key of KV head h (request r's qkv row at qkv_row): k normalised and rotated, k and v written at
    the request's slot (none at -1), as kv_store.rope_store_kv writes them."""
    slot = tl.load(slot_ptr + r).to(tl.int64)
    if slot >= 0:
        pd = (d + D // 2) % D
        first = d < D // 2
        cos = tl.load(cs_ptr + pos + d % (D // 2))
        sin = tl.load(cs_ptr + pos + D // 2 + d % (D // 2))
        kb = qkv_row + (HQ + h) * D
        k = _norm_rope(tl.load(kb + d)[None, :], tl.load(kb + pd)[None, :], cos, sin, first, kn_ptr + d, kn_ptr + pd,
                       qk_eps, D, QK_NORM)
        v = tl.load(qkv_row + (HQ + HK + h) * D + d)
        cache = slot * (HK * D) + h * D
        cdt = k_ptr.dtype.element_ty
        tl.store(k_ptr + cache + d[None, :], _to_cache(k, ks_ptr, FP8, cdt))
        tl.store(v_ptr + cache + d, _to_cache(v, vs_ptr, FP8, cdt))


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, last_ptr, o_ptr, part_ptr, lse_ptr,
                   ks_ptr, vs_ptr, scale_log2, window, stride_qt, stride_qh, stride_kb, stride_kt, stride_ot,
                   stride_oh, pos_ptr, cs_ptr, slot_ptr, qn_ptr, kn_ptr, qk_eps, stride_cs, HQ, HK,
                   PAGE: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                   BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, FP8: tl.constexpr, MATH: tl.constexpr,
                   INTERPRET: tl.constexpr, PDL: tl.constexpr, PF_LINES: tl.constexpr, ROPE: tl.constexpr = False,
                   QK_NORM: tl.constexpr = False):
    # MATH (FP8 only): FP8_MATHS' number of fp8_math
    # (3: the same in PTX)
    # PF_LINES > 0 (with PDL): the page metadata read, and the split's first tile of K / V prefetched into L2
    # (PF_LINES 128-byte lines a row), before the wait: no kernel of the step writes the metadata (the host's
    # copies precede the step's first kernel), and a prefetch only warms L2 (the new key's row, which RoPE +
    # store writes, is read after the wait as before)
    # ROPE: q_ptr is the step's qkv [B, (HQ + 2 HK) * D] as the projection wrote it (stride_qt its rows); every
    # program normalises (QK_NORM) and rotates its group's q heads itself, and the program whose split holds the
    # request's last key (the step's own) rotates k and writes k and v at slot_ptr[r] of the caches (RoPE + store
    # in this kernel: rope_decode_attention), then reads them back through its loop after a barrier
    if PDL:  # the next kernel (the merge, or o's GEMV) may launch now; q and the K/V store are complete after
        gdc_launch_dependents()
        if PF_LINES == 0:
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
    chunk = tl.cdiv(tl.cdiv(L - lo, SPLITS), BLOCK_N) * BLOCK_N
    start = lo + s * chunk
    end = tl.minimum(start + chunk, L)

    if PDL and PF_LINES > 0:
        _prefetch_first_tile(k_ptr, v_ptr, indices_ptr, p0, start, end, stride_kb, stride_kt, h * D, PAGE, BLOCK_N, D,
                             PF_LINES)
        gdc_wait()

    rows = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D)
    heads = h * GROUP + rows
    row_ok = rows < GROUP
    q_at = q_ptr + r.to(tl.int64) * stride_qt + heads[:, None] * stride_qh
    q = tl.load(q_at + d[None, :], mask=row_ok[:, None], other=0.0)
    if ROPE:
        pos = tl.load(pos_ptr + r).to(tl.int64) * stride_cs
        pd = (d + D // 2) % D
        cos = tl.load(cs_ptr + pos + d % (D // 2))
        sin = tl.load(cs_ptr + pos + D // 2 + d % (D // 2))
        q = _norm_rope(q, tl.load(q_at + pd[None, :], mask=row_ok[:, None], other=0.0), cos, sin, d < D // 2,
                       qn_ptr + d, qn_ptr + pd, qk_eps, D, QK_NORM)
        if (start <= L - 1) & (L - 1 < end):  # this split holds the step's own key
            _rope_store_new_key(q_ptr + r.to(tl.int64) * stride_qt, cs_ptr, pos, slot_ptr, r, kn_ptr, k_ptr, v_ptr,
                                ks_ptr, vs_ptr, qk_eps, h, HQ, HK, d, D, FP8, QK_NORM)
        tl.debug_barrier()  # the program's stores before its loads of the same rows
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    q, scale_log2, out_scale = e4m3_scales(q, scale_log2, ks_ptr, vs_ptr, FP8, MATH)
    kv_head = h * D  # column offset of this KV head within a token's row
    for n0 in range(start, end, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)
        ok = t < end
        k, v = paged_kv(k_ptr, v_ptr, indices_ptr, p0, t, ok, stride_kb, stride_kt, kv_head, d, PAGE)
        k, v = e4m3_operands(k, v, q.dtype, FP8, MATH, INTERPRET)
        m_i, l_i, acc = attend(q, k, v, ok[None, :], m_i, l_i, acc, scale_log2)
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
                  SPLITS_PAD: tl.constexpr, D: tl.constexpr, PDL: tl.constexpr, q_ptr=None, qs_ptr=None,
                  stride_q=0, stride_qs=0, QUANT: tl.constexpr = False, FMAX: tl.constexpr = 448.0,
                  AMIN: tl.constexpr = 1e-10, RECIP: tl.constexpr = False):
    # QUANT: o_ptr only gives the dtype; the head's D values, rounded to it, go out as e4m3 with one scale (the
    # group of fp8_act's per-token quantization that o's e4m3 GEMM takes: a head) at q_ptr [B, H * D], qs_ptr [B, H]
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
    if QUANT:
        y = out.to(o_ptr.dtype.element_ty).to(tl.float32)[None, :]  # the value the unquantized merge writes
        g = tl.full([1], 0, tl.int32) + h
        _quantize_store(y, g, g[:, None] * D + d[None, :], d[None, :] < D, r.to(tl.int64), q_ptr, qs_ptr, stride_q,
                        stride_qs, 1, D, H * D, FMAX, AMIN, RECIP)
    else:
        tl.store(o_ptr + r.to(tl.int64) * stride_ot + h * stride_oh + d, out.to(o_ptr.dtype.element_ty))


FP8_MATHS = {"q_dtype": 0, "fp16": 1, "fp16_vreg": 2, "bits_vreg": 3}
# launch defaults per cache dtype: keys a step of the loop (64: four pages of 16), warps, pipeline
# stages, and for e4m3 how K/V reach the tensor cores
# (e4m3, H200 sweep of bench_fp8_kv.py --sweep, K/V bytes / time / copy bandwidth at batch 64-128 x
# 2k-8k: bits_vreg at 128 keys 0.57-0.65, fp16_vreg 0.57-0.63, fp16 0.50-0.56, q_dtype at 64 keys
# (the old default) 0.37-0.45; FlashInfer's e4m3 decode 0.51-0.60. 8 warps or 256 keys lose; 3 and 4
# stages tie (K / V have one buffer either way: see below). maxnreg: the register cap, None: the compiler's.
# H100 sweep of --sweep --occupancy (benchmarks/results/session33/fp8_kv_occupancy_h100.log): capped at
# 128 registers, 64 keys a step (4 programs a SM instead of 2 at 195 registers) take 0.79-0.86 of copy
# bandwidth at 64-128 x 2k-8k (geomean 0.83) against 128 keys uncapped 0.75-0.83 (0.79); a loss only at
# 32 x 2048 (0.59 against 0.70), a gain at 512 tokens (0.68-0.73 against 0.61-0.68)
# num_stages and the K / V buffers (session 39, the TTGIR of the sm90 build with the launch's divisibility
# hints, tests/kernels/test_fp8_kv_compile.py): the page index load is a stage of its own before K / V's,
# so Triton's pipeliner gives K / V one shared-memory buffer at 3-4 stages, two at 5-6, three at 7. With
# one buffer a program waits for all its loads at the top of each step and issues the next tile's after
# its math: nothing of its own is in flight while it computes, and an SM's bytes in flight are its
# programs x one tile. The bf16 tile (32 KB at 64 keys) keeps an H200 streaming that way; the e4m3 tile
# (16 KB) was the suspect of its ~2.6 TB/s (0.61-0.65 of copy). 5 stages double-buffer K / V (55.8 KB of
# shared memory a program at 64 keys: 4 still fit an SM, as the register cap allows; no spills). Measured
# (session 40, H100, bench_fp8_kv.py --sweep --by-batch --variants, results/session40/kv_bybatch*): at
# 64-128 x 2k-8k 0.865 of copy bandwidth against 0.822 at 3 stages (geomean; fp16_vreg 0.872), and a
# gain at every batch from 1 to 128 (E4M3_BY_BATCH); 7 stages (three buffers) lose (0.762)
LAUNCH = {
    "16-bit": dict(block_n=64, num_warps=4, num_stages=3, maxnreg=None),
    "e4m3": dict(block_n=64, num_warps=4, num_stages=5, maxnreg=128, fp8_math="fp16_vreg"),
}
MAX_SPLITS = 16

# e4m3 launches by batch: (largest batch, what replaces LAUNCH["e4m3"]'s values there; split_factor:
# decode_splits' splits times it), the first row whose batch is not below the step's. A decode graph
# runs one batch, so it keeps one launch; the context plays no part (graphs replay any context).
# H100, bench_fp8_kv.py --sweep --by-batch --variants (session 40, all at 5 stages; K/V bytes / time /
# copy bandwidth, geomean over 8k at batch 1-4, 2k and 8k from 8 on): 128 keys "bits_vreg" at batch 32
# 0.839 (64 keys 0.703, with two splits 0.790; the old two-split 3-stage row 0.758); the plain row (64
# keys, "fp16_vreg") at 4 / 8 / 16 / 64 / 128: 0.631 / 0.604 / 0.706 / 0.861 / 0.883 (old rows 0.621 /
# 0.589 / 0.687 / - / 0.830; at 64 the old "fp16_vreg" row was not swept, "bits_vreg" at 3 stages took
# 0.815); no batch gains from twice the splits any more. Batch 1 keeps the old
# row: at 1 x 8k the kernel alone took 0.361 with 128 keys against 0.260, but the FP8 + FP8 KV decode step
# at context 2048 ran 3.51 / 3.51 ms against 3.42 / 3.44 (session 40 c3, two rounds each; batch 32: 6.11 /
# 6.13 against 6.22 / 6.23, 128: 11.15 / 11.21 against 11.42 / 11.50). On an sm89 GPU batch 32's 128 keys
# run at 3 stages: two buffers of them do not fit its shared memory (decode_stages)
E4M3_BY_BATCH = ((1, {"num_stages": 3, "fp8_math": "bits_vreg"}), (16, {}),
                 (32, {"block_n": 128, "fp8_math": "bits_vreg"}))


def launch_for(fp8: bool, batch: int) -> dict:
    """The launch paged_decode_attention takes by default for `batch` rows: LAUNCH's row of the
    cache dtype, for e4m3 with E4M3_BY_BATCH's replacements (split_factor: decode_splits')."""
    row = LAUNCH["e4m3" if fp8 else "16-bit"]
    if fp8:
        for most, over in E4M3_BY_BATCH:
            if batch <= most:
                return {**row, **over}
    return row


def decode_stages(num_stages: int, block_n: int, D: int, kv_bytes: int, math_id: int, group_pad: int,
                  shared: int) -> int:
    """The decode kernel's pipeline depth: num_stages, fewer where K / V's shared-memory buffers would not fit
    `shared` bytes (common.max_shared_memory). The pipeliner gives K / V (num_stages - 1) // 2 buffers (the page
    index load is a stage of its own: LAUNCH), each a K and a V tile of block_n x D values of kv_bytes and their
    block_n page indices; beside them q and p in 16 bits for the products ([group_pad, D], [group_pad, block_n])
    and, in the "_vreg" maths (math_id 2, 3), V's tile converted to fp16. That is the sm89 and sm90 builds' shared
    memory to the byte at 3-7 stages (tests/kernels/test_shared_memory_compile.py). E4M3_BY_BATCH's 128 keys at 5
    stages take 107520 bytes, over an sm89 GPU's 101376 (L4, L40S): 3 stages there, one buffer (74240)."""
    buffers = (num_stages - 1) // 2
    if buffers < 1:
        return num_stages
    fixed = 2 * group_pad * (D + block_n) + (2 * block_n * D if math_id >= 2 else 0)
    fit = stages_that_fit(buffers, 2 * block_n * D * kv_bytes + 4 * block_n, shared, reserve=fixed + 1024)
    return num_stages if fit == buffers else 2 * fit + 1


def decode_splits(batch: int, num_kv_heads: int, sms: int, kv_dtype: torch.dtype | None = None,
                  cuda: bool = False) -> int:
    """KV splits per (request, KV head): none where those pairs alone fill the SMs; otherwise a
    power of two giving about two programs per SM, at most MAX_SPLITS. An e4m3 cache (kv_dtype)
    multiplies that by launch_for's split_factor (a function of the batch alone: graph-safe).
    cuda (an e4m3 cache on kernels/e4m3_decode_cuda.py): the pairs fill the SMs from 2 programs of 4 warps a SM,
    with no split; below that, programs of 8 warps (e4m3_decode_cuda.launch_warps) and half the splits above.
    Session 50, H200 (K/V bytes / time / copy bandwidth): at 4 warps batch 16 best at 4 splits, 32 at 2, 64 and 128
    at 1; 8 warps with half the splits: 32 x 2k 0.765 against 0.721, 16 x 8k 0.840 against 0.826, 4-8 even."""
    pairs = max(1, batch * num_kv_heads)
    cuda = cuda and kv_dtype == torch.float8_e4m3fn
    if (e4m3_decode_cuda.fills(pairs, sms) if cuda else pairs >= sms):
        splits = 1
    else:
        want = -(-2 * sms // pairs)
        splits = 1 << (want - 1).bit_length()
        if cuda:
            splits //= 2
    if kv_dtype == torch.float8_e4m3fn and not cuda:
        splits *= launch_for(True, batch).get("split_factor", 1)
    return min(MAX_SPLITS, splits)


# KernelConfig.decode_attention_fat's launch (a 16-bit cache): one program a SM, its K / V tiles double-buffered
FAT = dict(block_n=128, num_warps=4, num_stages=5)
FAT_MAX_SPLITS = 2  # its splits at most (the pairs at least about a third of the SMs; at 4, session 55 c3: even to +1%)


def decode_plan(batch: int, num_kv_heads: int, sms: int, kv_dtype: torch.dtype | None = None, cuda: bool = False,
                fat: bool = False) -> tuple[int, dict]:
    """A decode graph's (splits, launch keywords of paged_decode_attention): with fat (KernelConfig.decode_attention_fat)
    over a 16-bit cache (kv_dtype not e4m3) whose (request, KV head) pairs are at most the SMs and at least enough that
    sms // pairs <= FAT_MAX_SPLITS, FAT with sms // pairs splits (a program a SM); else decode_splits' splits and the
    default launch ({})."""
    pairs = max(1, batch * num_kv_heads)
    if fat and kv_dtype != torch.float8_e4m3fn and pairs <= sms and sms // pairs <= FAT_MAX_SPLITS:
        return sms // pairs, dict(FAT)
    return decode_splits(batch, num_kv_heads, sms, kv_dtype, cuda=cuda), {}


def cuda_e4m3(cfg, batch: int) -> bool:
    """Whether a decode step of `batch` rows over an e4m3 cache asks for kernels/e4m3_decode_cuda.py
    (KernelConfig.fp8_kv_decode_cuda, from fp8_kv_decode_cuda_min_batch rows): the graphs' splits and their
    calls agree through this."""
    return cfg.fp8_kv_decode_cuda and batch >= cfg.fp8_kv_decode_cuda_min_batch


def fits(dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int) -> bool:
    """What the kernel handles: q of a 16-bit float dtype, K/V of that dtype or float8_e4m3fn, a
    power-of-two head_dim >= 16 (the caches contiguous NHD, the rows of q contiguous)."""
    return (dtype in (torch.float16, torch.bfloat16) and kv_dtype in (dtype, torch.float8_e4m3fn)
            and head_dim >= 16 and head_dim & (head_dim - 1) == 0)


def split_outputs(q: torch.Tensor, splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split-KV kernels' outputs for q [rows, H, D] (the decode, verify and prefill kernels): (out [rows, H, D]
    in q's dtype, part [rows, H, splits, D] float32, lse [rows, H, splits] float32); with one split the kernel
    writes out directly and part / lse are out (unused)."""
    rows, H, D = q.shape
    out = torch.empty(rows, H, D, dtype=q.dtype, device=q.device)
    if splits <= 1:
        return out, out, out
    return (out, torch.empty(rows, H, splits, D, dtype=torch.float32, device=q.device),
            torch.empty(rows, H, splits, dtype=torch.float32, device=q.device))


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                           scale: float, *, window: int | None = None, splits: int = 1,
                           block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                           maxnreg: int | None = None,
                           k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                           fp8_math: str | None = None, pdl: bool = False, prefetch: bool = False,
                           cuda: bool = False, rope: tuple | None = None, quant_group: int | None = None):
    """q [B, H, D] (one token per request) -> [B, H, D]; caches [blocks, page, KVH, D] of q's dtype
    or float8_e4m3fn (then read as e4m3 * k_scale / v_scale: float32 one-element device tensors,
    the e4m3 values through fp8_math, a key of FP8_MATHS: see the module docstring). pdl: launch the
    kernels as programmatic dependents (sm90+; KernelConfig.decode_attention_pdl_max_batch): each waits for the one
    before it and lets the next launch at once. prefetch (with pdl; KernelConfig.decode_attention_prefetch): the
    page metadata read and each program's first tile of K / V prefetched into L2 before that wait (the
    metadata must not be written by the kernels of the step: the graphs' is copied from the host before it).

    window: a token sees its last `window` keys (itself included), or all when None. block_n,
    num_warps, num_stages, maxnreg, fp8_math: None takes launch_for(B)'s (LAUNCH's row of the cache
    dtype, for e4m3 by batch: E4M3_BY_BATCH); num_stages fewer where its buffers would not fit the device's
    shared memory (decode_stages). splits: the caller's (decode_splits with the cache dtype).

    cuda (e4m3 caches): kernels/e4m3_decode_cuda.py where it fits (with pdl: launched as programmatic dependents,
    its first K / V lines prefetched into L2 before its wait; block_n, num_warps, num_stages, maxnreg, fp8_math and
    prefetch do not apply; splits: decode_splits(cuda=True)'s); else this Triton kernel.

    rope: rope_decode_attention's (positions, cos_sin_cache, slots, qk_norm), q then the q heads of the step's qkv rows
    as the projection wrote them (rope_decode_attention's view); not with cuda.

    quant_group: where it equals head_dim and the step merges splits (this kernel's, splits > 1), the merge quantizes
    its rows per token and head and the call returns merge_splits' QuantizedActivation of [B, H * D] (o's e4m3
    GEMM takes it as it comes: Linear.attention_input_quant) instead of [B, H, D]."""
    B, H, D = q.shape
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and B > 0 and (k_scale is None or v_scale is None):
        raise ValueError("paged_decode_attention: an e4m3 cache needs k_scale and v_scale")
    if cuda and fp8 and rope is None and e4m3_decode_cuda.fits(q, k_cache, window):
        return e4m3_decode_cuda.paged_decode_attention_e4m3(
            q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, scale, k_scale, v_scale, splits=splits,
            pdl=pdl, num_warps=e4m3_decode_cuda.launch_warps(B * k_cache.shape[2], q.device))
    _, page, KVH, _ = k_cache.shape
    group = H // KVH
    out, part, lse = split_outputs(q, splits)
    if B == 0:
        return out
    dflt = launch_for(fp8, B)
    block_n = dflt["block_n"] if block_n is None else block_n
    num_warps = dflt["num_warps"] if num_warps is None else num_warps
    fp8_math = dflt.get("fp8_math", "q_dtype") if fp8_math is None else fp8_math
    maxnreg = dflt["maxnreg"] if maxnreg is None else maxnreg
    # registers per thread capped (more programs a SM) where asked; the interpreter takes no such option
    cap = {} if maxnreg is None or os.environ.get("TRITON_INTERPRET") == "1" else {"maxnreg": maxnreg}
    math_id = fp8_math_id(fp8_math, fp8, q.device, "paged_decode_attention")
    group_pad = max(16, triton.next_power_of_2(group))
    num_stages = decode_stages(dflt["num_stages"] if num_stages is None else num_stages, block_n, D,
                               k_cache.element_size(), math_id, group_pad, max_shared_memory(q.device))
    # 128-byte lines of a K / V row (a GPU instruction: not under the interpreter, which takes no PDL either)
    pf_lines = max(1, D * k_cache.element_size() // 128) if pdl and prefetch and q.is_cuda else 0
    positions, cos_sin, slots, qk_norm = rope if rope is not None else (kv_indptr, kv_indptr, kv_indptr, None)
    qn, kn, qk_eps = qk_norm if qk_norm is not None else (kv_indptr, kv_indptr, 0.0)
    _decode_kernel[(B, KVH, splits)](
        q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, out, part, lse,
        k_scale if fp8 else kv_indptr, v_scale if fp8 else kv_indptr,
        scale * math.log2(math.e), 0 if window is None else window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        positions, cos_sin, slots, qn, kn, float(qk_eps), cos_sin.stride(0) if rope is not None else 0, H, KVH,
        PAGE=page, GROUP=group, GROUP_PAD=group_pad, D=D,
        BLOCK_N=block_n, SPLITS=splits, FP8=fp8, MATH=math_id,
        INTERPRET=os.environ.get("TRITON_INTERPRET") == "1", PDL=pdl, PF_LINES=pf_lines, ROPE=rope is not None,
        QK_NORM=qk_norm is not None, num_warps=num_warps, num_stages=num_stages,
        **cap, **launch_args(pdl))
    if splits > 1:
        quant = merge_splits(part, lse, out, splits, pdl, quant=quant_group == D)
        if quant is not None:
            return quant
    return out


def rope_decode_attention(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, slots: torch.Tensor,
                          num_heads: int, num_kv_heads: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor, scale: float,
                          *, qk_norm: tuple | None = None, **launch) -> torch.Tensor:
    """A decode step's RoPE, K/V store and attention in one kernel (KernelConfig.decode_rope_attention): qkv [B,
    (Hq + 2 Hk) * D] the projection's rows (contiguous; left as they are), one token a request at positions [B], its
    K/V slot slots [B] (-1: not written); cos_sin_cache the float32 [P, D] RoPE table (cos half, then sin half);
    qk_norm (q_norm weight [D], k_norm weight [D], eps) of a Qwen3 layer. Each program normalises and rotates its
    group's q heads; the program whose split holds the request's last key rotates k and writes k and v at the slot
    (an e4m3 cache: k / k_scale, v / v_scale, as kv_store.rope_store_kv) before its loop reads them. The caches'
    last keys must be the step's (the slots within the page metadata's last page). launch: paged_decode_attention's
    keywords (not cuda). -> [B, Hq, D]"""
    B = qkv.shape[0]
    D = k_cache.shape[-1]
    if qkv.dim() != 2 or qkv.stride(-1) != 1 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * D:
        raise ValueError(f"rope_decode_attention: qkv must be [B, {(num_heads + 2 * num_kv_heads) * D}] with unit "
                         f"column stride, got {tuple(qkv.shape)} strides {qkv.stride()}")
    if cos_sin_cache.shape[1] != D:
        raise ValueError(f"rope_decode_attention: cos_sin_cache must be [positions, {D}] (head_dim), got "
                         f"{tuple(cos_sin_cache.shape)}")
    q = qkv.view(B, -1)[:, : num_heads * D].view(B, num_heads, D) if B else qkv.new_empty(0, num_heads, D)
    return paged_decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, scale,
                                  rope=(positions, cos_sin_cache, slots, qk_norm), **launch)


def merge_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, splits: int, pdl: bool = False,
                 quant: bool = False):
    """The split-KV decode kernels' partial outputs (split_outputs' part [B, H, splits, D], lse [B, H, splits]) merged
    into out [B, H, D]: one program a (row, head); pdl: launched as a programmatic dependent (waits for the splits).
    quant: instead of out, -> a QuantizedActivation of the merged [B, H * D] rows (in out's dtype), quantized per
    token and head (group D) as fp8_act.quantize_fp8_per_token_group quantizes them (on a GPU dividing through the
    scale's reciprocal, fp8_act.div_by_scale: the same values): q e4m3 [B, H * D], scale [B, H] row-major, no padding
    rows (the skinny_mma path's operand, which reads its strides)."""
    B, H, D = out.shape
    q = qs = None
    if quant:
        q = torch.empty(B, H * D, dtype=torch.float8_e4m3fn, device=out.device)
        qs = torch.empty(B, H, dtype=torch.float32, device=out.device)
    if B:
        _merge_kernel[(B, H)](part, lse, out, out.stride(0), out.stride(1), H, SPLITS=splits,
                              SPLITS_PAD=max(2, triton.next_power_of_2(splits)), D=D, PDL=pdl, q_ptr=q, qs_ptr=qs,
                              stride_q=q.stride(0) if quant else 0, stride_qs=qs.stride(0) if quant else 0,
                              QUANT=quant, FMAX=FP8_MAX, AMIN=MIN_AMAX, RECIP=out.is_cuda, num_warps=4,
                              **launch_args(pdl))
    return QuantizedActivation(q, qs, B, D, out.dtype) if quant else None
