"""The Triton K/V writes into the paged caches [num_blocks, block_size, kv_heads, head_dim]
(contiguous; flat slot s = block * block_size + offset is row s of the [blocks * block_size,
kv_heads * head_dim] view; slot -1 writes nothing, so a padded graph batch simply carries -1):

store_kv       this step's K and V rows at their slots, one launch (attention/kv_store.KVStore's
               plain path on CUDA).
rope_store_kv  RoPE on q and k in place and k, v written at their slots in one launch, with the
               qkv LoRA delta and a deferred RMSNorm factor (lora_epilogues.RowScale) applied
               first where given, and Qwen3's per-head q / k RMSNorms before RoPE where given
               (KVStore.rope_write, the fused path). A program a token and head; a prefill's
               step (KernelConfig.rope_store_block_t_min_tokens up, no LoRA, no row scale): a
               program a head and rope_store_block_t tokens, as one tile.

An FP8 (e4m3) cache stores round(x / scale) clamped to +-448 (FP8_MAX), x in float32, with the
layer's K and V scales read from device pointers (so a CUDA graph sees a later change of scale);
a 16-bit cache stores the row as it is (the scales are not read).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, uses_pdl
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.fp8 import round_to_e4m3
from model_wrapper.kernels.lora_epilogues import RowScale, lora_add, rank_args, row_scale, rope_lora_tiles, scale_args


FP8_MAX = 448.0  # the largest finite float8_e4m3fn


@triton.jit
def _to_cache(x, scale_ptr, FP8: tl.constexpr, dtype):
    """x as the cache stores it: round(x / scale) in e4m3 (clamped to +-FP8_MAX) where FP8, else x."""
    y = x  # one return (Triton refuses a function whose returns differ in type, constexpr branch or not)
    if FP8:  # IEEE division (div_rn, not the GPU's approximate `/`): the same e4m3 as torch's x / scale;
        # rounded on the e4m3 grid in fp32 first: sm90's fp32 -> e4m3 conversion does not round to nearest
        # even (it goes through fp16), so the conversion after round_to_e4m3 must be exact
        q = tl.minimum(tl.maximum(tl.math.div_rn(x.to(tl.float32), tl.load(scale_ptr)), -448.0), 448.0)
        y = round_to_e4m3(q).to(dtype)
    return y


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, stride_k, stride_v, width,
                     BLOCK: tl.constexpr, FP8: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = (offs < width) & (slot >= 0)
    k = tl.load(k_ptr + t * stride_k + offs, mask=m)
    v = tl.load(v_ptr + t * stride_v + offs, mask=m)
    tl.store(kc_ptr + slot * width + offs, _to_cache(k, ks_ptr, FP8, kc_ptr.dtype.element_ty), mask=m)
    tl.store(vc_ptr + slot * width + offs, _to_cache(v, vs_ptr, FP8, vc_ptr.dtype.element_ty), mask=m)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
    """k, v [T, kv_heads, head_dim] (each row contiguous); caches [blocks, block_size, kv_heads,
    head_dim] contiguous, of k's dtype or float8_e4m3fn; slots [T] int64, -1 = skip. k_scale,
    v_scale: float32 one-element tensors on the device, the layer's scales (an e4m3 cache only)."""
    T = k.shape[0]
    width = k.shape[1] * k.shape[2]
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if T:
        _store_kv_kernel[(T,)](k, v, k_cache, v_cache, slots, k_scale if fp8 else slots, v_scale if fp8 else slots,
                               k.stride(0), v.stride(0), width, BLOCK=triton.next_power_of_2(width), FP8=fp8)


@triton.jit
def _rotate_half_pair(x1, x2, cos, sin, dtype):
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    return (a * cos - b * sin).to(dtype), (b * cos + a * sin).to(dtype)


@triton.jit
def _qk_norm(x1, x2, qn_ptr, kn_ptr, is_q, half, eps, D: tl.constexpr, AXIS: tl.constexpr):
    """Qwen3's q (is_q) or k norm (weights [D] at qn_ptr / kn_ptr) of a head's halves x1, x2 (their D / 2 columns
    along AXIS: one row, or a tile of rows), the reference's rounding (layers/norm.rms_norm: fp32 statistics,
    x / rms rounded, times the weight rounded)."""
    if is_q:
        w1 = tl.load(qn_ptr + half).to(tl.float32)
        w2 = tl.load(qn_ptr + D // 2 + half).to(tl.float32)
    else:
        w1 = tl.load(kn_ptr + half).to(tl.float32)
        w2 = tl.load(kn_ptr + D // 2 + half).to(tl.float32)
    dtype = x1.dtype
    a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
    r = tl.math.rsqrt((tl.sum(a1 * a1, axis=AXIS, keep_dims=True) + tl.sum(a2 * a2, axis=AXIS, keep_dims=True)) / D
                      + eps)
    return (w1 * (a1 * r).to(dtype).to(tl.float32)).to(dtype), (w2 * (a2 * r).to(dtype).to(tl.float32)).to(dtype)


@triton.jit
def _rope_store_kernel(qkv_ptr, pos_ptr, cs_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, s_ptr, bq_ptr, bk_ptr, bv_ptr, rank_ptr,
                       lslot_ptr, ss_ptr, qn_ptr, kn_ptr, R, stride_qkv, stride_sp, stride_sm, stride_ss, stride_cs, HQ,
                       HK, nb, inv_n, eps, qk_eps, D: tl.constexpr, LORA: tl.constexpr, BLOCK_R: tl.constexpr,
                       RPAD: tl.constexpr, NUM_SPLITS: tl.constexpr, PDL: tl.constexpr, SCALED: tl.constexpr,
                       NB: tl.constexpr, FP8: tl.constexpr, QK_NORM: tl.constexpr):
    """Program (token, head): head < HQ rotates q head `head` in place; otherwise, for kv head
    j = head - HQ, rotates k head j in place and writes it and v head j at the token's cache slot.
    SCALED: qkv (and s) project add_lora_rms_norm's unnormalised rows: each is first multiplied by
    the token's RMSNorm factor and rounded (written back too: qkv ends as the true projection).
    FP8: the caches are e4m3 and take k / scale, v / scale (scales at ks_ptr, vs_ptr).
    QK_NORM: the q (k) head is RMS-normalised with the weight at qn_ptr (kn_ptr) [D] before RoPE, the
    reference's rounding (layers/norm.rms_norm: fp32 statistics, x / rms rounded, times the weight rounded).
    Everything is read before anything is written (a store would hold later loads back)."""
    t = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dtype = qkv_ptr.dtype.element_ty
    half = tl.arange(0, D // 2)
    full = tl.arange(0, D)
    ok = half < D // 2
    j = tl.maximum(head - HQ, 0)
    kv = head >= HQ
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the GEMM that wrote qkv is complete
    if LORA:
        lslot = tl.load(lslot_ptr + t)
        b1, b2, bvt, sub, rank, rank_v = rope_lora_tiles(bq_ptr, bk_ptr, bv_ptr, rank_ptr, lslot, head, j, half, full,
                                                          ok, HQ, HK, R, D, BLOCK_R, RPAD)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cs_ptr + pos * stride_cs + half)
    sin = tl.load(cs_ptr + pos * stride_cs + D // 2 + half)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    row = qkv_ptr + t * stride_qkv
    if head < HQ:
        base = row + head * D  # q head `head`
    else:
        base = row + HQ * D + j * D  # k head j
    vbase = row + (HQ + HK) * D + j * D  # v head j (for a kv head)
    x1 = tl.load(base + half)
    x2 = tl.load(base + D // 2 + half)
    v = tl.load(vbase + full, mask=(full < D) & kv, other=0.0)
    rs = 1.0
    if SCALED:
        rs = row_scale(ss_ptr, t, nb, inv_n, eps, NB)
        x1 = (x1.to(tl.float32) * rs).to(dtype)
        x2 = (x2.to(tl.float32) * rs).to(dtype)
        v = (v.to(tl.float32) * rs).to(dtype)
    if LORA:
        x1 = lora_add(x1, b1, s_ptr, rank, lslot, t, sub, R, stride_sp, stride_sm, stride_ss, BLOCK_R, NUM_SPLITS, rs)
        x2 = lora_add(x2, b2, s_ptr, rank, lslot, t, sub, R, stride_sp, stride_sm, stride_ss, BLOCK_R, NUM_SPLITS, rs)
        v = lora_add(v, bvt, s_ptr, rank_v, lslot, t, 2, R, stride_sp, stride_sm, stride_ss, BLOCK_R, NUM_SPLITS, rs)
    if QK_NORM:  # on the projection's final rows (after the row scale and the LoRA delta)
        x1, x2 = _qk_norm(x1, x2, qn_ptr, kn_ptr, head < HQ, half, qk_eps, D, 0)
    o1, o2 = _rotate_half_pair(x1, x2, cos, sin, dtype)
    tl.store(base + half, o1)
    tl.store(base + D // 2 + half, o2)
    if kv:  # v back, and k and v into the cache
        if SCALED or LORA:
            tl.store(vbase + full, v)
        if slot >= 0:
            cache = slot * (HK * D) + j * D
            cdt = kc_ptr.dtype.element_ty
            tl.store(kc_ptr + cache + half, _to_cache(o1, ks_ptr, FP8, cdt))
            tl.store(kc_ptr + cache + D // 2 + half, _to_cache(o2, ks_ptr, FP8, cdt))
            tl.store(vc_ptr + cache + full, _to_cache(v, vs_ptr, FP8, cdt))


@triton.jit
def _rope_store_rows_kernel(qkv_ptr, pos_ptr, cs_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, qn_ptr, kn_ptr, T,
                            stride_qkv, stride_cs, HQ, HK, qk_eps, D: tl.constexpr, BLOCK_T: tl.constexpr,
                            PDL: tl.constexpr, FP8: tl.constexpr, QK_NORM: tl.constexpr):
    """_rope_store_kernel's step for a prefill's many tokens, without LoRA or a row scale: program (token block,
    head) takes BLOCK_T tokens' rows of one head as one [BLOCK_T, D / 2] tile pair (a program a token and head
    is mostly launch and reduction latency there). The same operations and roundings per row."""
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    dtype = qkv_ptr.dtype.element_ty
    half = tl.arange(0, D // 2)
    full = tl.arange(0, D)
    tm = t < T
    j = tl.maximum(head - HQ, 0)
    kv = head >= HQ
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the GEMM that wrote qkv is complete
    pos = tl.load(pos_ptr + t, mask=tm, other=0).to(tl.int64)
    cos = tl.load(cs_ptr + pos[:, None] * stride_cs + half[None, :], mask=tm[:, None], other=0.0)
    sin = tl.load(cs_ptr + pos[:, None] * stride_cs + D // 2 + half[None, :], mask=tm[:, None], other=0.0)
    row = qkv_ptr + t[:, None] * stride_qkv
    col = tl.where(kv, HQ * D + j * D, head * D)  # q head `head`, or k head j
    x1 = tl.load(row + col + half[None, :], mask=tm[:, None], other=0.0)
    x2 = tl.load(row + col + D // 2 + half[None, :], mask=tm[:, None], other=0.0)
    if QK_NORM:
        x1, x2 = _qk_norm(x1, x2, qn_ptr, kn_ptr, head < HQ, half, qk_eps, D, 1)
    slot = tl.load(slot_ptr + t, mask=tm & kv, other=-1).to(tl.int64)  # (a q head: neither is used)
    v = tl.load(row + (HQ + HK) * D + j * D + full[None, :], mask=tm[:, None] & kv, other=0.0)
    o1, o2 = _rotate_half_pair(x1, x2, cos, sin, dtype)
    tl.store(row + col + half[None, :], o1, mask=tm[:, None])
    tl.store(row + col + D // 2 + half[None, :], o2, mask=tm[:, None])
    if kv:
        sm = (tm & (slot >= 0))[:, None]
        cache = (slot * (HK * D) + j * D)[:, None]
        cdt = kc_ptr.dtype.element_ty
        tl.store(kc_ptr + cache + half[None, :], _to_cache(o1, ks_ptr, FP8, cdt), mask=sm)
        tl.store(kc_ptr + cache + D // 2 + half[None, :], _to_cache(o2, ks_ptr, FP8, cdt), mask=sm)
        tl.store(vc_ptr + cache + full[None, :], _to_cache(v, vs_ptr, FP8, cdt), mask=sm)


def rope_store_kv(qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, num_heads: int,
                  num_kv_heads: int, head_dim: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slots: torch.Tensor, d=None, scale: RowScale | None = None,
                  cfg: KernelConfig = DEFAULT, k_scale: torch.Tensor | None = None,
                  v_scale: torch.Tensor | None = None, qk_norm=None) -> None:
    """In place on qkv [T, (Hq + 2 Hk) * D] (rows contiguous): the qkv LoRA delta d (a LoraDelta, sub-
    modules q, k, v; None = no LoRA) added, q and k rotated (neox form, cos / sin from the float32
    [P, D] table: cos half then sin half), and k and v written at flat `slots` of the caches
    [blocks, block_size, Hk, D] (contiguous; slot -1 writes nothing): RoPE, the K/V store and the
    LoRA expand in one launch. scale: qkv and d.s project add_lora_rms_norm's unnormalised rows;
    its RowScale normalises them first. An e4m3 cache stores k / k_scale and v / v_scale (float32
    one-element tensors on the device, the layer's scales). qk_norm: (q_norm weight [D], k_norm weight [D],
    eps) of a Qwen3 layer: each q and k head RMS-normalised before RoPE (the rotated q, k in qkv are the
    normalised ones)."""
    T = qkv.shape[0]
    if not T:
        return
    lora = d is not None
    pdl = uses_pdl(qkv.device, cfg) and not lora and scale is None
    s = d.s if lora else qkv
    bq, bk, bv = d.b if lora else (qkv, qkv, qkv)
    ss, nb, inv_n, eps = scale_args(scale, qkv)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    qn, kn, qk_eps = qk_norm if qk_norm is not None else (qkv, qkv, 0.0)
    if not lora and scale is None and T >= cfg.rope_store_block_t_min_tokens:  # a prefill's step: token tiles
        bt = cfg.rope_store_block_t
        _rope_store_rows_kernel[(triton.cdiv(T, bt), num_heads + num_kv_heads)](
            qkv, positions, cos_sin_cache, k_cache, v_cache, slots, k_scale if fp8 else slots,
            v_scale if fp8 else slots, qn, kn, T, qkv.stride(0), cos_sin_cache.stride(0), num_heads, num_kv_heads,
            float(qk_eps), D=head_dim, BLOCK_T=bt, PDL=pdl, FP8=fp8, QK_NORM=qk_norm is not None,
            num_warps=cfg.rope_rows_warps, **launch_args(pdl))
        return
    _rope_store_kernel[(T, num_heads + num_kv_heads)](
        qkv, positions, cos_sin_cache, k_cache, v_cache, slots, k_scale if fp8 else slots,
        v_scale if fp8 else slots, s, bq, bk, bv, d.ranks if lora else slots,
        d.token_slot if lora else slots, ss, qn, kn, d.rank if lora else 1, qkv.stride(0), s.stride(0) if lora else 0,
        s.stride(1) if lora else 0, d.slot_stride if lora else 0, cos_sin_cache.stride(0), num_heads, num_kv_heads, nb,
        inv_n, eps, float(qk_eps), D=head_dim, LORA=lora, **rank_args(d.rank if lora else 16), NUM_SPLITS=s.shape[0] if lora else 1,
        PDL=pdl, SCALED=scale is not None, NB=triton.next_power_of_2(nb), FP8=fp8, QK_NORM=qk_norm is not None,
        num_warps=cfg.rope_warps, **launch_args(pdl))
