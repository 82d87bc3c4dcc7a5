"""Varlen causal paged attention in Triton: any mix of requests with 1..T new tokens, packed.

The attention of the mixed-step CUDA graphs (model_wrapper/mixed_graph.py): prefill chunks with a
cached prefix, plain prefills and decodes in one step, whose tokens sit packed (request after
request, as forward_tensor takes them) in a static buffer of T_b rows; rows past the step's T are
padding. Per request (int32, device): qo_indptr [R + 1] (its packed token range), and the page
metadata of the decode kernel (kv_indptr [R + 1], kv_indices, kv_last_page_len [R]), so

    L_r = (indptr[r + 1] - indptr[r] - 1) * page + last[r],  q_r = qo[r + 1] - qo[r],  P_r = L_r - q_r

and new token i of request r has kv index P_r + i. Key j is visible to it when j <= P_r + i and,
with a sliding window W, pos_i - pos_j < W (pos_j = j for cached keys, the key token's position
for new ones: attention/masks.py, the torch backend being the specification).

The grid is fixed at capture: (tiles, KV heads, splits). The host maps each tile to a run of at
most BLOCK_T packed tokens (tile_map below, per replay): tile_req (-1: padding tokens, which get
zero output), tile_tok0 (its first packed token) and tile_n (tokens; 0: an idle program):

    packed:  | r0: 1 token | r1: 37 tokens                  | r2: 5 | padding ... T_b |
    tiles:   | t0          | t1 (16)  | t2 (16)  | t3 (5)    | t4    | t5 (pad) | t6 (pad) | idle...

A program takes one (tile, KV head, split): the tile's tokens times the GQA group's query heads as
the rows of one tensor-core product (row m = token m // GROUP, head m % GROUP, padded to a power
of two >= 16), a contiguous share of the keys the tile sees (up to its last token's kv index),
BLOCK_N keys a step with an FA2-style online softmax in fp32. With several splits each writes its
normalised partial output and log2-sum-exp, and verify_attention's merge kernel combines them per
(token, head). FP8 (e4m3) caches as in decode_attention: K/V converted to q's dtype (or through its
fp16 modes, E4M3_MATH), the layer's K scale in the softmax scale, its V scale on the output (device
pointers). Nothing reads a host value.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch
import triton
import triton.language as tl

from model_wrapper.kernels.decode_attention import (attend, e4m3_operands, e4m3_scales, fp8_math_id, paged_kv,
                                                     split_outputs)
from model_wrapper.kernels.verify_attention import _merge_kernel


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, qo_ptr, indptr_ptr, indices_ptr, last_ptr, treq_ptr, ttok_ptr, tn_ptr,
                    pos_ptr, o_ptr, part_ptr, lse_ptr, ks_ptr, vs_ptr, scale_log2, window,
                    stride_qt, stride_qh, stride_kb, stride_kt, stride_ot, stride_oh,
                    PAGE: tl.constexpr, BLOCK_T: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
                    D: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr,
                    FP8: tl.constexpr, MATH: tl.constexpr, INTERPRET: tl.constexpr):
    tile = tl.num_programs(0) - 1 - tl.program_id(0)  # the map's last (longest causal) tiles start first
    h = tl.program_id(1)
    s = tl.program_id(2)
    req = tl.load(treq_ptr + tile)
    tok0 = tl.load(ttok_ptr + tile).to(tl.int64)
    n = tl.load(tn_ptr + tile)
    real = req >= 0
    r = tl.maximum(req, 0)  # padding tiles read request 0's metadata and use none of it
    q0 = tl.load(qo_ptr + r)
    q_r = tl.load(qo_ptr + r + 1) - q0
    p0 = tl.load(indptr_ptr + r)
    L = (tl.load(indptr_ptr + r + 1) - p0 - 1) * PAGE + tl.load(last_ptr + r)
    L = tl.where(real, L, 0)
    prefix = L - q_r
    first = prefix + tok0.to(tl.int32) - q0  # kv index of the tile's first token

    rows = tl.arange(0, ROWS)
    i = rows // GROUP  # token of each row within the tile
    g = rows % GROUP  # head within the group
    row_ok = (rows < BLOCK_T * GROUP) & (i < n)
    d = tl.arange(0, D)
    tok = tok0 + i
    q = tl.load(q_ptr + tok[:, None] * stride_qt + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=(row_ok & real)[:, None], other=0.0)
    row_kv = first + i  # each row's kv index: it sees keys 0..row_kv (causal)
    end = tl.where(real, tl.minimum(first + n, L), 0)

    lo = 0
    if HAS_WINDOW:
        row_pos = tl.load(pos_ptr + tok, mask=row_ok, other=0).to(tl.int32)
        min_pos = tl.min(tl.where(row_ok, row_pos, 2147483647), 0)
        # cached keys below min_pos - window + 1 are out of every row's window; new keys are all
        # scanned (their positions are the caller's, not their kv indices)
        lo = tl.maximum(tl.minimum(min_pos - window + 1, prefix), 0)
    chunk = tl.cdiv(tl.cdiv(end - lo, SPLITS), BLOCK_N) * BLOCK_N
    start = lo + s * chunk
    stop = tl.minimum(start + chunk, end)

    q, scale_log2, out_scale = e4m3_scales(q, scale_log2, ks_ptr, vs_ptr, FP8, MATH)
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    kv_head = h * D  # column offset of this KV head within a token's row
    for n0 in range(start, stop, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)
        ok = t < stop
        k, v = paged_kv(k_ptr, v_ptr, indices_ptr, p0, t, ok, stride_kb, stride_kt, kv_head, d, PAGE)
        k, v = e4m3_operands(k, v, q.dtype, FP8, MATH, INTERPRET)
        vis = (row_ok[:, None] & ok[None, :]) & (t[None, :] <= row_kv[:, None])
        if HAS_WINDOW:
            c = t - prefix  # column among the request's new tokens (< 0: a cached key)
            new = c >= 0
            key_pos = tl.load(pos_ptr + q0 + c, mask=ok & new, other=0).to(tl.int32)
            key_pos = tl.where(new, key_pos, t)
            vis = vis & ((row_pos[:, None] - key_pos[None, :]) < window)
        m_i, l_i, acc = attend(q, k, v, vis, m_i, l_i, acc, scale_log2)
    if FP8:
        acc = acc * out_scale

    seen = l_i > 0  # padding tokens (and an empty split) saw nothing: zeros, lse -inf
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    if SPLITS == 1:
        tl.store(o_ptr + tok[:, None] * stride_ot + (h * GROUP + g)[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        H = tl.num_programs(1) * GROUP
        base = (tok * H + h * GROUP + g) * SPLITS + s  # [tokens, H, S] flat
        tl.store(part_ptr + base[:, None] * D + d[None, :], out, mask=row_ok[:, None])
        tl.store(lse_ptr + base, lse, mask=row_ok)


BLOCK_ROWS = 64  # query rows (tokens x GQA heads) a program
# how e4m3 K/V reach the tensor cores (decode_attention.FP8_MATHS, its docstring): "q_dtype" converts them to q's
# dtype (e4m3 -> bf16 through a slow pipe, V read from shared memory a byte at a time); the fp16 modes as in the
# decode kernel. H100, benchmarks/bench_fp8_attention.py (session 39, e3), Llama-3-8B heads, ms a layer: 1 x 4k
# q_dtype 0.678, fp16_vreg 0.562, bits_vreg 0.575 (bf16 cache 0.502); 4 x 1k 0.206 / 0.182 / 0.183 (0.170). But the
# engine (FP8 + FP8 KV, 256 prompts of 512 + 128, e7) ran 8328 tok/s with q_dtype against 7720 with fp16_vreg, its
# 4096-token steps (prefill chunks beside running decodes) 60-67 against 75-85 ms: q_dtype stays until that is understood
E4M3_MATH = "q_dtype"
BLOCK_N = 64  # keys a step of the loop


def tile_tokens(num_heads: int, num_kv_heads: int, block_rows: int = BLOCK_ROWS) -> int:
    """Tokens per tile: block_rows rows over the GQA group (padded to a power of two), at least 1."""
    return max(1, block_rows // triton.next_power_of_2(num_heads // num_kv_heads))


def max_tiles(tokens: int, requests: int, block_t: int) -> int:
    """The most tiles a step of at most `tokens` packed rows (padding included) and `requests`
    requests needs: each request's partial last tile, and the padding's."""
    return -(-tokens // block_t) + requests + 1


def tile_map(q_lens_cpu: torch.Tensor, tokens: int, block_t: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Host int32 [3, n_tiles]: rows tile_req (-1: padding), tile_tok0, tile_n of a step whose
    requests bring q_lens_cpu [B] tokens, packed into `tokens` rows (the rest padding); unused tiles
    get (-1, 0, 0). out: a [3, n_tiles] int32 host buffer to fill (n_tiles >= max_tiles(tokens, B,
    block_t)). In NumPy on views of the tensors: a replay pays microseconds, not torch's per-op cost."""
    q = q_lens_cpu.numpy().astype(np.int64)
    T = int(q.sum())
    per = (q + block_t - 1) // block_t  # tiles of each request
    n_real = int(per.sum())
    pad = -(-(tokens - T) // block_t)
    if out is None:
        out = torch.empty(3, max_tiles(tokens, q.shape[0], block_t), dtype=torch.int32)
    if n_real + pad > out.shape[1]:
        raise ValueError(f"tile_map: {n_real + pad} tiles do not fit the buffer's {out.shape[1]}")
    m = out.numpy()
    req = np.repeat(np.arange(q.shape[0]), per)
    k = np.arange(n_real) - (np.cumsum(per) - per)[req]  # tile within its request
    qo = np.cumsum(q) - q
    m[0] = -1
    m[1:] = 0
    m[0, :n_real] = req
    m[1, :n_real] = qo[req] + k * block_t
    m[2, :n_real] = np.minimum(q[req] - k * block_t, block_t)
    if pad:
        p = T + np.arange(pad) * block_t
        m[1, n_real:n_real + pad] = p
        m[2, n_real:n_real + pad] = np.minimum(tokens - p, block_t)
    return out


def fits(dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int) -> bool:
    """What the kernel handles: q of a 16-bit float dtype, K/V of that dtype or float8_e4m3fn, a
    power-of-two head_dim >= 16 (caches contiguous NHD)."""
    return (dtype in (torch.float16, torch.bfloat16) and kv_dtype in (dtype, torch.float8_e4m3fn)
            and head_dim >= 16 and head_dim & (head_dim - 1) == 0)


def prefill_splits(tiles: int, num_kv_heads: int, sms: int, max_splits: int = 8) -> int:
    """KV splits per (tile, KV head) for a graph whose steps run about `tiles` tiles: none where the
    programs fill the SMs twice; else a power of two giving about two programs per SM."""
    programs = max(1, tiles * num_kv_heads)
    if programs >= 2 * sms:
        return 1
    want = -(-2 * sms // programs)
    return min(max_splits, 1 << (want - 1).bit_length())


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, qo_indptr: torch.Tensor,
                            kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                            tiles: torch.Tensor, positions: torch.Tensor, scale: float, *, block_t: int,
                            window: int | None = None, splits: int = 1, block_n: int = BLOCK_N,
                            num_warps: int | None = None, num_stages: int = 2, k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None, fp8_math: str | None = None) -> torch.Tensor:
    """q [T_b, H, D] packed (rows may be strided) -> [T_b, H, D]; caches [blocks, page, KVH, D] of
    q's dtype or float8_e4m3fn (read as e4m3 * k_scale / v_scale: float32 one-element device
    tensors); qo_indptr, kv_indptr [R + 1], kv_indices, kv_last_page_len [R] int32; tiles [3, n]
    int32 (tile_map with this block_t, covering every row of q); positions [T_b] int (read only
    with a window). window: a token sees keys less than `window` positions back, or all. fp8_math: how e4m3
    K/V enter the products (a key of decode_attention.FP8_MATHS; None: E4M3_MATH); every mode computes the same
    attention over the same e4m3 values."""
    T, H, D = q.shape
    _, page, KVH, _ = k_cache.shape
    group = H // KVH
    out, part, lse = split_outputs(q, splits)
    if T == 0:
        return out
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if fp8 and (k_scale is None or v_scale is None):
        raise ValueError("paged_prefill_attention: an e4m3 cache needs k_scale and v_scale")
    fp8_math = E4M3_MATH if fp8_math is None else fp8_math
    math_id = fp8_math_id(fp8_math, fp8, q.device, "paged_prefill_attention")
    rows = max(16, triton.next_power_of_2(block_t * group))
    if num_warps is None:  # a 128-row fp32 accumulator of 128 columns spills over 4 warps' registers
        num_warps = 8 if rows >= 128 else 4
    _prefill_kernel[(tiles.shape[1], KVH, splits)](
        q, k_cache, v_cache, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, tiles[0], tiles[1], tiles[2],
        positions, out, part, lse, k_scale if fp8 else qo_indptr, v_scale if fp8 else qo_indptr,
        scale * math.log2(math.e), 0 if window is None else window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        PAGE=page, BLOCK_T=block_t, GROUP=group, ROWS=rows, D=D,
        BLOCK_N=block_n, SPLITS=splits, HAS_WINDOW=window is not None, FP8=fp8, MATH=math_id,
        INTERPRET=os.environ.get("TRITON_INTERPRET") == "1", num_warps=num_warps, num_stages=num_stages)
    if splits > 1:
        _merge_kernel[(T, H)](part, lse, out, out.stride(0), out.stride(1), H, SPLITS=splits,
                              SPLITS_PAD=max(2, triton.next_power_of_2(splits)), D=D, num_warps=4)
    return out
