"""MoE routing in one kernel: router logits -> softmax (fp32) -> top-k -> renormalise -> cast.

    logits [T, E] (the router GEMV's output, model dtype) -> weights [T, k], ids [T, k] int64

One program a token holds its E logits (E padded to a power of two, the padding at -inf):

    p[e]    = exp(l[e] - max l) / sum exp(...)                   fp32, as torch.softmax(dtype=float32)
    rank[e] = #{f : p[f] > p[e]  or  (p[f] == p[e] and f < e)}   the position of e in a descending sort
    ids[j]  = the e with rank[e] == j,  w[j] = p[ids[j]]          j < k: torch.topk(p, k)'s order
    w      /= sum_j w[j]                                         norm_topk_prob only
    w       -> model dtype                                        unless fp32 weights (Mixtral)

It replaces torch's softmax, topk, sum, divide and cast (five kernels) with one, and the rank is a
single [E, E] comparison instead of k rounds of argmax (k dependent reductions). Or (KernelConfig.moe_route_sort)
a bitonic top-k (tl.topk) of int64 keys, p's bits above E_pad - 1 - e: the same order (p >= 0, so its bits
order as p does; equal p, the lower index first), about a fifth of the instructions in the sm90 SASS. Exact ties go to the
lower expert index; torch.topk breaks them as its sort happens to (layers/moe.route): only a tie of
fp32 probabilities can choose differently, and both choices are a valid top-k.

PDL: the kernel waits for the router GEMV before reading the logits, then lets the expert kernels
launch; they read weights and ids only after their own wait (kernels/moe_gemv.py relies on that order).

moe_router_route: the router's projection and the routing in one launch, for decode steps of a few
tokens (KernelConfig.moe_fused_router, up to gemv_max_tokens):

    program b of cdiv(E, BLOCK_E): logits[t, rows of b] = x[t] . gate[rows]  (fp32 sums, rounded to the
                                   model dtype, as kernels/gemv.py: the GEMV it replaces)
    the last program to finish (an atomic count, reset by that program for the next step) routes
    every token from the logits the others wrote, as the routing kernel does.

Its weight rows are loaded before its PDL wait (they stream in while the norm before drains).
With add_norm (moe_router_route_norm; KernelConfig.gemv_add_norm_router) that norm is its prologue, as in
kernels/gemv.py: every program normalizes the rows from h and the residual (kernels/norm.add_rms_norm_row,
the standalone kernel's arithmetic), and program 0 writes h + residual and the normalized rows out of place
for the experts after it (they read x after their PDL wait, when this kernel is complete); no program of the
launch reads what program 0 writes, so none can see a half-written row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import (DEFAULT, device_counters, gdc_launch_dependents, gdc_wait, last_to_arrive,
                                         launch_args, uses_pdl)
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.norm import add_rms_norm_row


@triton.jit
def _route_row(logits_ptr, w_ptr, ids_ptr, t, E, stride_l, TOP_K: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr,
               RENORM: tl.constexpr, L2: tl.constexpr, SORT: tl.constexpr):
    """Route token t: its E logits (L2: read past the L1 cache: other programs of the kernel wrote them). SORT:
    the top-k by a bitonic top-k of packed keys instead of the [E, E] rank (the same experts and weights)."""
    e = tl.arange(0, EP)
    ok = e < E
    if L2:
        logit = tl.load(logits_ptr + t * stride_l + e, mask=ok, other=float("-inf"), cache_modifier=".cg")
    else:
        logit = tl.load(logits_ptr + t * stride_l + e, mask=ok, other=float("-inf"))
    logit = logit.to(tl.float32)
    ex = tl.exp(logit - tl.max(logit, axis=0))
    ex = tl.where(ok, ex, 0.0)
    p = ex / tl.sum(ex, axis=0)
    j = tl.arange(0, KP)
    if SORT:
        # key = p's bits (p >= 0: they order as p does) above EP - 1 - e (equal p: the lower index first); padding
        # -1, below every expert; the KP largest keys, descending, are the top-k in torch.topk's order
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (EP - 1 - e).to(tl.int64)
        top = tl.topk(tl.where(ok, key, -1), KP)
        ids = EP - 1 - (top & 0xFFFFFFFF)
        w = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    else:
        # rank of each expert (rows: e, columns: the others f); padding ranks last (p = 0, higher index)
        f = tl.arange(0, EP)
        pf = tl.where(f < E, p, -1.0)
        pe = tl.where(ok, p, -1.0)
        beats = (pf[None, :] > pe[:, None]) | ((pf[None, :] == pe[:, None]) & (f[None, :] < e[:, None]))
        rank = tl.sum(beats.to(tl.int32), axis=1)  # [EP]
        hit = rank[None, :] == j[:, None]  # [KP, EP]: slot j holds the expert of rank j
        ids = tl.sum(tl.where(hit, e[None, :], 0), axis=1)
        w = tl.sum(tl.where(hit, p[None, :], 0.0), axis=1)
    slot_ok = j < TOP_K
    if RENORM:
        w = w / tl.sum(tl.where(slot_ok, w, 0.0), axis=0)
    tl.store(ids_ptr + t * TOP_K + j, ids.to(tl.int64), mask=slot_ok)
    tl.store(w_ptr + t * TOP_K + j, w.to(w_ptr.dtype.element_ty), mask=slot_ok)


@triton.jit
def _route_kernel(logits_ptr, w_ptr, ids_ptr, E, stride_l, TOP_K: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr,
                  RENORM: tl.constexpr, PDL: tl.constexpr, SORT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    if PDL:
        gdc_wait()  # the router GEMV is complete
        gdc_launch_dependents()
    _route_row(logits_ptr, w_ptr, ids_ptr, t, E, stride_l, TOP_K, KP, EP, RENORM, False, SORT)


@triton.jit
def _router_route_kernel(x_ptr, g_ptr, logits_ptr, w_ptr, ids_ptr, count_ptr, r_ptr, nw_ptr, ro_ptr, xn_ptr, eps, E, H,
                         stride_x, stride_g, stride_l, stride_r, stride_ro, stride_xn, M: tl.constexpr,
                         HP: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr,
                         EP: tl.constexpr, RENORM: tl.constexpr, PDL: tl.constexpr, SORT: tl.constexpr,
                         NORM: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    cols = tl.arange(0, HP)
    live = rows < E
    g = tl.load(g_ptr + rows[:, None].to(tl.int64) * stride_g + cols[None, :], mask=live[:, None] & (cols < H)[None, :],
                other=0.0)
    if NORM:  # x is h: the rows are nw * RMSNorm(h + r) (module docstring)
        nw = tl.load(nw_ptr + cols, mask=cols < H, other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()  # the kernel that wrote x (the norm, or with NORM the one that wrote h) is complete
    dtype = logits_ptr.dtype.element_ty
    first = tl.program_id(0) == 0
    for m in tl.static_range(M):
        if NORM:
            xn = add_rms_norm_row(x_ptr + m * stride_x, r_ptr + m * stride_r, ro_ptr + m * stride_ro, nw, cols, H, eps,
                                  first, True)
            tl.store(xn_ptr + m * stride_xn + cols, xn, mask=(cols < H) & first)
            x = xn.to(tl.float32)
        else:
            x = tl.load(x_ptr + m * stride_x + cols, mask=cols < H, other=0.0).to(tl.float32)
        acc = tl.sum(g.to(tl.float32) * x[None, :], axis=1)
        tl.store(logits_ptr + m * stride_l + rows, acc.to(dtype), mask=live)
    # every thread's logits stored; the last program reads all programs' logits (through L2)
    if last_to_arrive(count_ptr, tl.num_programs(0)):
        for t in range(M):  # a loop, not unrolled: two unrolled [EP, EP] rankings spill at M = 2
            _route_row(logits_ptr, w_ptr, ids_ptr, t, E, stride_l, TOP_K, KP, EP, RENORM, True, SORT)
        tl.atomic_xchg(count_ptr, 0)  # ready for the next launch (a graph replays this one)


def router_route_fits(x: torch.Tensor, gate: torch.Tensor, cfg: KernelConfig) -> bool:
    """Whether moe_router_route takes the step: 1..cfg.gemv_max_tokens tokens (where the router's projection
    would be kernels/gemv.py's), cfg.moe_fused_router, a row of at most cfg.gemv_tile weights."""
    return (cfg.moe_fused_router and x.dim() == 2 and 0 < x.shape[0] <= cfg.gemv_max_tokens and x.dtype == gate.dtype
            and x.stride(-1) == 1 and gate.stride(-1) == 1 and triton.next_power_of_2(x.shape[1]) <= cfg.gemv_tile)


def moe_router_route(x: torch.Tensor, gate: torch.Tensor, top_k: int, norm_topk_prob: bool, fp32_weights: bool,
                     cfg: KernelConfig = DEFAULT) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, H], the router's weight gate [E, H] -> (weights [T, top_k], ids [T, top_k] int64, logits [T, E] in
    x's dtype): moe_route(x @ gate^T) in one launch, for the steps router_route_fits accepts."""
    return _router_route(x, gate, top_k, norm_topk_prob, fp32_weights, cfg, None)[:3]


def moe_router_route_norm(h: torch.Tensor, gate: torch.Tensor, top_k: int, norm_topk_prob: bool, fp32_weights: bool,
                          add_norm: tuple, cfg: KernelConfig = DEFAULT,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The residual add + RMSNorm and the router in one launch. add_norm = (residual [T, H], norm_weight [H], eps,
    residual_out [T, H]) (layers/norm.PendingNorm.add_norm) -> (weights [T, top_k], ids [T, top_k] int64, the
    normalized rows xn [T, H] in h's dtype), where xn = norm_weight * RMSNorm(h + residual) (kernels/norm.py's
    arithmetic) is what moe_router_route routes, and residual_out <- h + residual; h and residual unchanged."""
    residual, _, _, residual_out = add_norm
    for name, t in (("residual", residual), ("residual_out", residual_out)):
        if t.shape != h.shape or t.dtype != h.dtype or t.stride(-1) != 1:
            raise ValueError(f"moe_router_route_norm: {name} must be a [T, H] = {list(h.shape)} {h.dtype} tensor "
                             f"with unit column stride, got {list(t.shape)} {t.dtype} strides {t.stride()}")
    w, ids, _, xn = _router_route(h, gate, top_k, norm_topk_prob, fp32_weights, cfg, add_norm)
    return w, ids, xn


def _router_route(x, gate, top_k, norm_topk_prob, fp32_weights, cfg, add_norm):
    """-> (weights, ids, logits, the normalized rows or None): the launch of moe_router_route(_norm)."""
    T, H = x.shape
    E = gate.shape[0]
    if not 0 < top_k <= E:
        raise ValueError(f"moe_router_route: top_k must be in 1..{E} (the experts), got {top_k}")
    logits = torch.empty(T, E, dtype=x.dtype, device=x.device)
    weights = torch.empty(T, top_k, dtype=torch.float32 if fp32_weights else x.dtype, device=x.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=x.device)
    hp = triton.next_power_of_2(H)
    block_e = min(triton.next_power_of_2(E), max(1, cfg.gemv_tile // hp))
    pdl = uses_pdl(x.device, cfg)
    # without a norm the add_norm pointers are placeholders the kernel never reads (NORM=False)
    r, nw, eps, r_out = add_norm if add_norm is not None else (x, x, 0.0, x)
    xn = torch.empty_like(x) if add_norm is not None else x
    count = device_counters("moe_route", 1, x.device)  # finished programs (the last one routes)
    _router_route_kernel[(triton.cdiv(E, block_e),)](
        x, gate, logits, weights, ids, count, r, nw, r_out, xn, eps, E, H, x.stride(0), gate.stride(0),
        logits.stride(0), r.stride(0), r_out.stride(0), xn.stride(0), M=T, HP=hp, BLOCK_E=block_e, TOP_K=top_k,
        KP=max(2, triton.next_power_of_2(top_k)), EP=max(2, triton.next_power_of_2(E)), RENORM=norm_topk_prob,
        PDL=pdl, SORT=cfg.moe_route_sort, NORM=add_norm is not None, num_warps=cfg.gemv_warps, **launch_args(pdl))
    return weights, ids, logits, (xn if add_norm is not None else None)


def moe_route(logits: torch.Tensor, top_k: int, norm_topk_prob: bool, fp32_weights: bool,
              cfg: KernelConfig = DEFAULT) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, top_k] in logits' dtype, or float32 with fp32_weights; ids [T, top_k]
    int64): layers/moe.route's result in one kernel (ties to the lower expert index)."""
    T, E = logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"moe_route: top_k must be in 1..{E} (the experts), got {top_k}")
    weights = torch.empty(T, top_k, dtype=torch.float32 if fp32_weights else logits.dtype, device=logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    if T == 0:
        return weights, ids
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    pdl = uses_pdl(logits.device, cfg)
    _route_kernel[(T,)](logits, weights, ids, E, logits.stride(0), TOP_K=top_k,
                        KP=max(2, triton.next_power_of_2(top_k)), EP=max(2, triton.next_power_of_2(E)),
                        RENORM=norm_topk_prob, PDL=pdl, SORT=cfg.moe_route_sort, num_warps=cfg.moe_route_warps,
                        **launch_args(pdl))
    return weights, ids
