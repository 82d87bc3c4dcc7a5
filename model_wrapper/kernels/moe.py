"""Fused mixture-of-experts on the GPU: token-expert pairs sorted per expert on the device, two grouped GEMMs.

    ids [T, k] --moe_align--> pairs [R] (pair p = t * k + j, sorted by expert, each expert's run padded
                              to a multiple of BLOCK_M with the sentinel P = T * k), block_expert [R / BLOCK_M]
    gate_up kernel: program (m block, n block) of expert e = block_expert[m]:
                    act[p, n] = silu(x[p // k] @ gate_e[n]) * (x[p // k] @ up_e[n])      act [P, I]
    down kernel:    out[p, :] = w[p] * (act[p] @ down_e^T)                                out [P, H]
    y = out.view(T, k, H).sum(1)

No step reads a count back to the host: the sort, the per-expert padding and the grid are all sized by the
worst case of T (R <= P + min(E, P) * (BLOCK_M - 1)), so a CUDA graph of a decode bucket replays whatever
the routing. Blocks past the last expert's run find block_expert == E and return at once. Rounding is the
reference's (layers/moe.experts_reference): each product rounded to the model dtype, silu in fp32 rounded,
times up rounded, the routing weight applied to the rounded down product; only the final sum over a
token's k experts runs in fp32 (the reference adds them one by one in the model dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.config import KernelConfig


def moe_align(ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] int64 -> (pairs [R] int32, block_expert [R // block_m] int32), on ids' device, no sync.

    pairs lists the pair indices p = t * k + j grouped by expert in ascending expert order, ascending p
    within an expert, each expert's run padded to a multiple of block_m with P = T * k; block_expert[b] is
    the expert of rows [b * block_m, (b + 1) * block_m), or num_experts past the last run."""
    T, k = ids.shape
    P = T * k
    flat = ids.reshape(-1)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.sort(flat, stable=True).indices  # pairs by expert, p ascending within one
    sorted_e = flat[order]
    rank = torch.arange(P, device=ids.device) - (torch.cumsum(counts, 0) - counts)[sorted_e]
    rows = P + min(num_experts, P) * (block_m - 1)
    rows = -(-rows // block_m) * block_m
    pairs = torch.full((rows,), P, dtype=torch.int32, device=ids.device)
    pairs[(ends - padded)[sorted_e] + rank] = order.to(torch.int32)
    starts = torch.arange(0, rows, block_m, device=ids.device)
    block_expert = torch.searchsorted(ends, starts, right=True).to(torch.int32)
    return pairs, block_expert


@triton.jit
def _moe_gemm_kernel(a_ptr, w_ptr, o_ptr, pairs_ptr, block_expert_ptr, rw_ptr, P, E, N, K, stride_a, stride_we,
                     stride_wn, stride_o, TOP_K: tl.constexpr, SILU: tl.constexpr, WEIGHTED: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m)
    if e >= E:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pairs_ptr + offs_m)
    valid = pair < P
    if SILU:
        row = pair // TOP_K  # gate_up reads the token's row of x
    else:
        row = pair  # down reads the pair's row of act
    row = tl.where(valid, row, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    w_base = w_ptr + e.to(tl.int64) * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SILU:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        a = tl.load(a_ptr + row[:, None].to(tl.int64) * stride_a + kk[None, :], mask=valid[:, None] & k_ok[None, :],
                    other=0.0)
        w = tl.load(w_base + offs_n[None, :] * stride_wn + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(a, w, acc)
        if SILU:
            wu = tl.load(w_base + (offs_n + N)[None, :] * stride_wn + kk[:, None], mask=n_ok[None, :] & k_ok[:, None],
                         other=0.0)
            acc_up = tl.dot(a, wu, acc_up)
    dtype = o_ptr.dtype.element_ty
    if SILU:
        g = acc.to(dtype).to(tl.float32)
        out = (g / (1.0 + tl.exp(-g))).to(dtype) * acc_up.to(dtype)
    else:
        out = acc.to(dtype)
    if WEIGHTED:
        rw = tl.load(rw_ptr + pair, mask=valid, other=0.0)
        out = (out.to(tl.float32) * rw.to(tl.float32)[:, None]).to(dtype)
    tl.store(o_ptr + pair[:, None].to(tl.int64) * stride_o + offs_n[None, :], out.to(dtype),
             mask=valid[:, None] & n_ok[None, :])


def fused_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
              cfg: KernelConfig = KernelConfig()) -> torch.Tensor:
    """x [T, H], weights [T, k] (model dtype or fp32), ids [T, k] int64, gate_up [E, 2I, H], down [E, H, I]
    -> [T, H] in x's dtype: the sum over each token's k experts of weight * expert(x)."""
    T, H = x.shape
    k = ids.shape[1]
    E, two_i, _ = gate_up.shape
    inter = two_i // 2
    if T == 0:
        return torch.zeros_like(x)
    x = x.contiguous()
    P = T * k
    if P <= cfg.moe_small_pairs:
        bm, bn, bk, warps, stages = cfg.moe_block_m, cfg.moe_block_n, cfg.moe_block_k, cfg.moe_warps, cfg.moe_stages
    else:
        bm, bn, bk = cfg.moe_large_block_m, cfg.moe_large_block_n, cfg.moe_large_block_k
        warps, stages = cfg.moe_large_warps, cfg.moe_large_stages
    pairs, block_expert = moe_align(ids, E, bm)
    act = torch.empty(P, inter, dtype=x.dtype, device=x.device)
    out = torch.empty(P, H, dtype=x.dtype, device=x.device)
    rw = weights.reshape(-1).contiguous()
    m_blocks = block_expert.shape[0]
    launch = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    _moe_gemm_kernel[(m_blocks, triton.cdiv(inter, bn))](
        x, gate_up, act, pairs, block_expert, rw, P, E, inter, H, x.stride(0), gate_up.stride(0), gate_up.stride(1),
        act.stride(0), TOP_K=k, SILU=True, WEIGHTED=False, **launch)
    _moe_gemm_kernel[(m_blocks, triton.cdiv(H, bn))](
        act, down, out, pairs, block_expert, rw, P, E, H, inter, act.stride(0), down.stride(0), down.stride(1),
        out.stride(0), TOP_K=k, SILU=False, WEIGHTED=True, **launch)
    return out.view(T, k, H).sum(dim=1, dtype=torch.float32).to(x.dtype)
