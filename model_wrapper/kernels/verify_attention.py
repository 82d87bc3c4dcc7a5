"""Paged verify attention in Triton: up to 16 new tokens per request over its paged K/V, split-KV.

The sibling of kernels/decode_attention.py for multi-token decode steps (speculative verify of
chains and trees, small chunks) inside CUDA graphs (model_wrapper/cuda_graph.py). Tokens sit in a
fixed-stride layout: request r owns rows r * Q .. r * Q + Q - 1 of q (Q = the graph's tokens per
request); its first q_lens[r] rows are real, the rest padding (zero output). Page metadata as in
the decode kernel (kv_indptr, kv_indices, kv_last_page_len), so request r's KV length after the
step and its cached prefix are
    L_r = (indptr[r + 1] - indptr[r] - 1) * page + last[r],   P_r = L_r - q_lens[r]
and new token i of request r has kv index P_r + i. Which keys token i may see (attention/masks.py,
the torch backend being the specification):
    key j < P_r                 always (the cached prefix)
    key j = P_r + c, c < q_r    when bit c of mask_bits[r * Q + i] is set (causal chains: bits
                                0..i; trees: the spec_mask row), bits filled per replay
    sliding window W            and positions[r * Q + i] - pos_j < W, with pos_j = j for cached
                                keys and positions[r * Q + c] for new ones (a tree's siblings
                                share a kv span, not a path)

A program takes one (request, KV head, split): its Q new tokens times the GQA group's query heads
as the rows of one tensor-core product (row m = token m // GROUP, head m % GROUP, padded to a power
of two >= 16), a contiguous share of the request's (windowed) KV range, BLOCK_N keys a step with an
online softmax in fp32 under the per-row mask. With several splits each writes its normalised
partial output and log2-sum-exp, and a second kernel merges them per (token, head). Nothing here
reads a host value: a graph replays it over whatever metadata the static buffers hold.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.decode_attention import attend, paged_kv, split_outputs

MAX_Q = 16  # new tokens per request the mask bits hold (one int32 per token)


@triton.jit
def _verify_kernel(q_ptr, k_ptr, v_ptr, indptr_ptr, indices_ptr, last_ptr, qlen_ptr, bits_ptr, pos_ptr,
                   o_ptr, part_ptr, lse_ptr, scale_log2, window,
                   stride_qt, stride_qh, stride_kb, stride_kt, stride_ot, stride_oh,
                   PAGE: tl.constexpr, Q: tl.constexpr, QP: tl.constexpr, GROUP: tl.constexpr,
                   ROWS: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr,
                   HAS_WINDOW: tl.constexpr):
    r = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    p0 = tl.load(indptr_ptr + r)
    p1 = tl.load(indptr_ptr + r + 1)
    L = (p1 - p0 - 1) * PAGE + tl.load(last_ptr + r)
    q_r = tl.load(qlen_ptr + r)
    prefix = L - q_r
    tok0 = r.to(tl.int64) * Q  # the request's first row in the fixed-stride layout

    rows = tl.arange(0, ROWS)
    i = rows // GROUP  # token of each row
    g = rows % GROUP  # head within the group
    row_ok = (rows < Q * GROUP) & (i < q_r)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + (tok0 + i)[:, None] * stride_qt + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None], other=0.0)
    bits = tl.load(bits_ptr + tok0 + i, mask=row_ok, other=0)

    lo = 0
    if HAS_WINDOW:
        # the earliest key any real token may see: its position - window + 1
        toks = tl.arange(0, QP)
        tpos = tl.load(pos_ptr + tok0 + toks, mask=toks < q_r, other=2147483647).to(tl.int32)
        lo = tl.maximum(tl.min(tpos, 0) - window + 1, 0)
        row_pos = tl.load(pos_ptr + tok0 + i, mask=row_ok, other=0).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(L - lo, SPLITS), BLOCK_N) * BLOCK_N
    start = lo + s * chunk
    end = tl.minimum(start + chunk, L)

    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    kv_head = h * D  # column offset of this KV head within a token's row
    for n0 in range(start, end, BLOCK_N):
        t = n0 + tl.arange(0, BLOCK_N)
        ok = t < end
        k, v = paged_kv(k_ptr, v_ptr, indices_ptr, p0, t, ok, stride_kb, stride_kt, kv_head, d, PAGE)
        c = t - prefix  # column among the request's new tokens (< 0: a cached key)
        new = c >= 0
        bit = (bits[:, None] >> tl.minimum(tl.maximum(c, 0), 31)[None, :]) & 1
        vis = (row_ok[:, None] & ok[None, :]) & ((c < 0)[None, :] | (bit != 0))
        if HAS_WINDOW:
            key_pos = tl.load(pos_ptr + tok0 + c, mask=ok & new, other=0).to(tl.int32)
            key_pos = tl.where(new, key_pos, t)
            vis = vis & ((row_pos[:, None] - key_pos[None, :]) < window)
        m_i, l_i, acc = attend(q, k, v, vis, m_i, l_i, acc, scale_log2)

    seen = l_i > 0  # padding rows (and an empty split) saw nothing: zeros, lse -inf
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    in_layout = rows < Q * GROUP
    if SPLITS == 1:
        tl.store(o_ptr + (tok0 + i)[:, None] * stride_ot + (h * GROUP + g)[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=in_layout[:, None])
    else:
        lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        H = tl.num_programs(1) * GROUP
        base = ((tok0 + i) * H + h * GROUP + g) * SPLITS + s  # [tokens, H, S] flat
        tl.store(part_ptr + base[:, None] * D + d[None, :], out, mask=in_layout[:, None])
        tl.store(lse_ptr + base, lse, mask=in_layout)


@triton.jit
def _merge_kernel(part_ptr, lse_ptr, o_ptr, stride_ot, stride_oh, H, SPLITS: tl.constexpr,
                  SPLITS_PAD: tl.constexpr, D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, D)
    base = (t.to(tl.int64) * H + h) * SPLITS
    lse = tl.load(lse_ptr + base + sp, mask=sp < SPLITS, other=float("-inf"))
    mx = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(mx == float("-inf"), 0.0, mx))  # a padding row: every weight 0
    part = tl.load(part_ptr + (base + sp)[:, None] * D + d[None, :], mask=(sp < SPLITS)[:, None], other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(part * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(o_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + d, out.to(o_ptr.dtype.element_ty))


BLOCK_N = 64  # keys a step of the loop, as the decode kernel


def causal_bits(q_per_req: int) -> torch.Tensor:
    """int32 [q_per_req]: the mask bits of a chain (token i sees new tokens 0..i)."""
    return (torch.ones(q_per_req, dtype=torch.int64) << torch.arange(1, q_per_req + 1)).sub_(1).to(torch.int32)


def mask_bits(spec_mask: torch.Tensor) -> torch.Tensor:
    """bool [T, n] spec_mask rows (n <= MAX_Q; True = attend) -> int32 [T]: bit c = column c."""
    weights = torch.ones(spec_mask.shape[1], dtype=torch.int64) << torch.arange(spec_mask.shape[1])
    return (spec_mask.to(torch.int64) * weights).sum(1).to(torch.int32)


def paged_verify_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                           q_lens: torch.Tensor, bits: torch.Tensor, positions: torch.Tensor, scale: float, *,
                           q_per_req: int, window: int | None = None, splits: int = 1, block_n: int = BLOCK_N,
                           num_stages: int = 2) -> torch.Tensor:
    """q [B * Q, H, D] (Q = q_per_req rows per request, the first q_lens[r] real) -> [B * Q, H, D];
    caches [blocks, page, KVH, D]; kv_indptr [B + 1], kv_indices, kv_last_page_len [B], q_lens [B]
    int32; bits [B * Q] int32 (mask bits, see the module docstring); positions [B * Q] int (read
    only with a window). window: a token sees keys less than `window` positions back, or all."""
    T, H, D = q.shape
    _, page, KVH, _ = k_cache.shape
    if q_per_req < 1 or q_per_req > MAX_Q or T % q_per_req:
        raise ValueError(f"q_per_req: expected 1..{MAX_Q} dividing q's {T} rows, got {q_per_req}")
    B, group = T // q_per_req, H // KVH
    out, part, lse = split_outputs(q, splits)
    if T == 0:
        return out
    rows = max(16, triton.next_power_of_2(q_per_req * group))
    _verify_kernel[(B, KVH, splits)](
        q, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, q_lens, bits, positions, out, part, lse,
        scale * math.log2(math.e), 0 if window is None else window,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        PAGE=page, Q=q_per_req, QP=triton.next_power_of_2(q_per_req), GROUP=group, ROWS=rows, D=D,
        BLOCK_N=block_n, SPLITS=splits, HAS_WINDOW=window is not None,
        num_warps=8 if rows >= 64 else 4, num_stages=num_stages)
    if splits > 1:
        _merge_kernel[(T, H)](part, lse, out, out.stride(0), out.stride(1), H, SPLITS=splits,
                              SPLITS_PAD=max(2, triton.next_power_of_2(splits)), D=D, num_warps=4)
    return out
