"""RMSNorm: the parameter holder, and the reference arithmetic (transformers' LlamaRMSNorm)."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] -> weight * x / rms(x): fp32 statistics, result in x's dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class RMSNorm(nn.Module):
    """Holds the weight and eps; the model runs it through its kernels (layers/kernels.py)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    @staticmethod
    def takes_tail(kernels) -> bool:
        """Whether add() can take a projection's tail with these kernels (leaving a row scale)."""
        return kernels.fuses_norm_scale

    def add(self, h: torch.Tensor, residual: torch.Tensor | None, kernels, tail=None, into: nn.Module | None = None):
        """The pre-norm residual stream, h [T, d] the previous block's output:
        -> (x = norm(residual + h), residual + h, scale), h and residual possibly updated in place.

        into: the projection that consumes x. Where it asks for a quantized input (Linear.input_quant:
        FP8 block weights at prefill sizes) and the kernels fuse that (kernels.rms_norm_fp8), x is
        the QuantizedActivation of norm(residual + h) from the norm's own kernel.

        residual None (the first layer): (norm(h), h, None). tail: the pending part of h that a
        projection left (adapters' LoraDelta); the kernel adds it first and leaves the division by
        rms to the kernels after the next GEMM: x is then the undivided rows and scale (a RowScale)
        their divisor; otherwise scale is None.
        """
        quant = getattr(into, "input_quant", None) if tail is None else None
        if quant is not None:
            group = quant(h.shape[0], h.dtype, h.device, kernels)
            act = None if group is None else kernels.rms_norm_fp8(h, residual, self.weight, self.eps, group)
            if act is not None:
                return act, (h if residual is None else residual), None
        if residual is None:
            return kernels.rms_norm(h, self.weight, self.eps), h, None
        if tail is not None:
            return kernels.add_rms_norm_lora(h, residual, self.weight, self.eps, tail)
        x, residual = kernels.add_rms_norm(h, residual, self.weight, self.eps)
        return x, residual, None
