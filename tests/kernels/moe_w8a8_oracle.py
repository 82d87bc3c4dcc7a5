"""The W8A8 FP8 experts written out in float64 (KernelConfig.moe_fp8_w8a8's oracle): shared by the kernel tests
and the model tests that run the fused MoE kernels on FP8 checkpoints."""

from __future__ import annotations

import torch


def w8a8_experts_reference(x, w, ids, gq, gs, dq, ds):
    """FP8 experts multiplied W8A8 (KernelConfig.moe_fp8_w8a8), written out: x quantized per token and 128
    columns by the reference quantizer (kernels/fp8_reference.quantize_fp8_reference, on the CPU), each
    expert's products in float64 over the dequantized e4m3 operands, rounded as the reference experts round
    (gate and up products to x's dtype, silu in fp32 rounded, times up rounded), the activation quantized the
    same way before down, down's product rounded, times the routing weight rounded; the k experts summed in
    fp32 -> [T, H] in x's dtype."""
    from model_wrapper.kernels.fp8_reference import quantize_fp8_reference

    def deq(q, scale):  # e4m3 [..., C] and its per-128-column scales -> float64
        cols = torch.arange(q.shape[-1]) // 128
        return q.cpu().double() * scale.cpu().double()[..., cols]

    def quant(a):
        return deq(*quantize_fp8_reference(a.cpu(), 128))

    dt = x.dtype
    T, k = ids.shape
    inter = gq.shape[1] // 2
    xq = quant(x)
    y = torch.zeros(T, x.shape[1], dtype=torch.float32)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            h = (xq[t] @ deq(gq[e], gs[e]).t()).to(dt).float()
            act = ((h[:inter] / (1 + torch.exp(-h[:inter]))).to(dt) * h[inter:].to(dt)).to(dt)
            o = (quant(act[None])[0] @ deq(dq[e], ds[e]).t()).to(dt)
            y[t] += (o.float() * w[t, j].cpu().float()).to(dt).float()
    return y.to(dt).to(x.device)
