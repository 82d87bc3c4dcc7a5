"""The W8A8 FP8 experts written out in float64 (KernelConfig.moe_fp8_w8a8's oracle): shared by the kernel tests
and the model tests that run the fused MoE kernels on FP8 checkpoints."""

from __future__ import annotations

import torch


def _deq(q, scale):
    """e4m3 [..., C] and its per-128-column scales -> float64 on the CPU."""
    cols = torch.arange(q.shape[-1]) // 128
    return q.cpu().double() * scale.cpu().double()[..., cols]


def w8a8_experts_reference(x, w, ids, gq, gs, dq, ds):
    """FP8 experts multiplied W8A8 (KernelConfig.moe_fp8_w8a8), written out: x quantized per token and 128
    columns by the reference quantizer (kernels/fp8_reference.quantize_fp8_reference, on the CPU), each
    expert's products in float64 over the dequantized e4m3 operands, rounded as the reference experts round
    (gate and up products to x's dtype, silu in fp32 rounded, times up rounded), the activation quantized the
    same way before down, down's product rounded, times the routing weight rounded; the k experts summed in
    fp32 -> [T, H] in x's dtype."""
    from model_wrapper.kernels.fp8_reference import quantize_fp8_reference

    def quant(a):
        return _deq(*quantize_fp8_reference(a.cpu(), 128))

    dt = x.dtype
    T, k = ids.shape
    inter = gq.shape[1] // 2
    xq = quant(x)
    ids_c, w_c = ids.cpu(), w.cpu().float()
    part = torch.zeros(T, k, x.shape[1], dtype=torch.float32)  # each pair's rounded term
    for e in ids_c.unique().tolist():  # an expert's pairs at once (the quantization is per row: the same values)
        t, j = (ids_c == e).nonzero(as_tuple=True)
        h = (xq[t] @ _deq(gq[e], gs[e]).t()).to(dt).float()
        act = ((h[:, :inter] / (1 + torch.exp(-h[:, :inter]))).to(dt) * h[:, inter:].to(dt)).to(dt)
        o = (quant(act) @ _deq(dq[e], ds[e]).t()).to(dt)
        part[t, j] = (o.float() * w_c[t, j, None]).to(dt).float()
    y = torch.zeros(T, x.shape[1], dtype=torch.float32)
    for j in range(k):  # summed in the order of the k experts, as the reference experts sum
        y += part[:, j]
    return y.to(dt).to(x.device)


# w8a8_check's bounds, from session 48's c2 (H100; benchmarks/results/session48: 60 cases, H 256-2048, I 128-768,
# 16-128 experts, 3-257 tokens, swapped and unswapped tiles): the kernels' largest error against the exact product
# was at most 1.08x the oracle's own (mean 1.015x), and their mean distance from the oracle at most 1.6e-3 of the
# largest entry, where the weight-only path (no activation quantization) sits 1.1e-2 from it.
EXACT_MAX_RATIO = 1.25
EXACT_MEAN_RATIO = 1.05
ORACLE_MEAN = 4e-3


def w8a8_check(got, x, w, ids, gq, gs, dq, ds, label=""):
    """Holds a W8A8 FP8 experts result got [T, H] (any dtype or device) to its arithmetic: x [T, H], w / ids [T, k],
    e4m3 experts gq [E, 2I, H] / dq [E, H, I] with their per-128-column scales gs / ds. Against the exact product
    (float64, x unquantized, the dequantized weights) got must be as close as the float64 W8A8 oracle above
    (w8a8_experts_reference) is: its largest and mean errors within EXACT_MAX_RATIO / EXACT_MEAN_RATIO of the
    oracle's. And it must be the products of the same quantized operands: on average within ORACLE_MEAN of the
    largest entry from the oracle. Not the oracle's values entry by entry: a sum that lands one bf16 bit away (the
    e4m3 tensor cores keep fewer accumulator bits than fp32) can move an activation across an e4m3 step before
    down, which moves an output by a few percent of the largest entry (2.7e-2 measured); a wrong scale, group or
    operand moves the means far more. -> (the oracle [T, H] float64 on the CPU, the largest distance of got from
    it: a bound for sums of such results)."""
    from model_wrapper.layers.moe import experts_reference

    x, w, ids = x.cpu(), w.cpu(), ids.cpu()
    got = got.cpu().double()
    oracle = w8a8_experts_reference(x, w, ids, gq, gs, dq, ds).cpu().double()
    exact = experts_reference(x.double(), w.double(), ids, _deq(gq, gs), _deq(dq, ds))
    scale = float(exact.abs().max()) + 1e-30
    mine, theirs = (got - exact).abs(), (oracle - exact).abs()
    assert float(mine.max()) <= EXACT_MAX_RATIO * float(theirs.max()) + 1e-6 * scale, (label, float(mine.max()),
                                                                                        float(theirs.max()))
    assert float(mine.mean()) <= EXACT_MEAN_RATIO * float(theirs.mean()) + 1e-6 * scale, (label, float(mine.mean()),
                                                                                          float(theirs.mean()))
    off = (got - oracle).abs()
    assert float(off.mean()) <= ORACLE_MEAN * scale, (label, float(off.mean()) / scale)
    return oracle, float(off.max())
