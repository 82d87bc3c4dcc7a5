"""MoE routing in one kernel: router logits -> softmax (fp32) -> top-k -> renormalise -> cast.

    logits [T, E] (the router GEMV's output, model dtype) -> weights [T, k], ids [T, k] int64

One program a token holds its E logits (E padded to a power of two, the padding at -inf):

    p[e]    = exp(l[e] - max l) / sum exp(...)                   fp32, as torch.softmax(dtype=float32)
    rank[e] = #{f : p[f] > p[e]  or  (p[f] == p[e] and f < e)}   the position of e in a descending sort
    ids[j]  = the e with rank[e] == j,  w[j] = p[ids[j]]          j < k: torch.topk(p, k)'s order
    w      /= sum_j w[j]                                         norm_topk_prob only
    w       -> model dtype                                        unless fp32 weights (Mixtral)

It replaces torch's softmax, topk, sum, divide and cast (five kernels) with one, and the rank is a
single [E, E] comparison instead of k rounds of argmax (k dependent reductions). Exact ties go to the
lower expert index; torch.topk breaks them as its sort happens to (layers/moe.route): only a tie of
fp32 probabilities can choose differently, and both choices are a valid top-k.

PDL: the kernel waits for the router GEMV before reading the logits, then lets the expert kernels
launch; they read weights and ids only after their own wait (kernels/moe_gemv.py relies on that order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from model_wrapper.kernels.common import DEFAULT, gdc_launch_dependents, gdc_wait, launch_args, uses_pdl
from model_wrapper.kernels.config import KernelConfig


@triton.jit
def _route_kernel(logits_ptr, w_ptr, ids_ptr, E, stride_l, TOP_K: tl.constexpr, KP: tl.constexpr, EP: tl.constexpr,
                  RENORM: tl.constexpr, PDL: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    if PDL:
        gdc_wait()  # the router GEMV is complete
        gdc_launch_dependents()
    e = tl.arange(0, EP)
    ok = e < E
    logit = tl.load(logits_ptr + t * stride_l + e, mask=ok, other=float("-inf")).to(tl.float32)
    ex = tl.exp(logit - tl.max(logit, axis=0))
    ex = tl.where(ok, ex, 0.0)
    p = ex / tl.sum(ex, axis=0)
    # rank of each expert (rows: e, columns: the others f); padding ranks last (p = 0, higher index)
    f = tl.arange(0, EP)
    pf = tl.where(f < E, p, -1.0)
    pe = tl.where(ok, p, -1.0)
    beats = (pf[None, :] > pe[:, None]) | ((pf[None, :] == pe[:, None]) & (f[None, :] < e[:, None]))
    rank = tl.sum(beats.to(tl.int32), axis=1)  # [EP]
    j = tl.arange(0, KP)
    hit = rank[None, :] == j[:, None]  # [KP, EP]: slot j holds the expert of rank j
    ids = tl.sum(tl.where(hit, e[None, :], 0), axis=1)
    w = tl.sum(tl.where(hit, p[None, :], 0.0), axis=1)
    slot_ok = j < TOP_K
    if RENORM:
        w = w / tl.sum(tl.where(slot_ok, w, 0.0), axis=0)
    tl.store(ids_ptr + t * TOP_K + j, ids.to(tl.int64), mask=slot_ok)
    tl.store(w_ptr + t * TOP_K + j, w.to(w_ptr.dtype.element_ty), mask=slot_ok)


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
                        RENORM=norm_topk_prob, PDL=pdl, num_warps=cfg.moe_route_warps, **launch_args(pdl))
    return weights, ids
