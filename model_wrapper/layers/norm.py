"""RMSNorm: the parameter holder, and the reference arithmetic (transformers' LlamaRMSNorm)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] -> weight * x / rms(x): fp32 statistics, result in x's dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@dataclass
class PendingNorm:
    """A projection's input left to its GEMV (KernelConfig.gemv_add_norm): x = weight * RMSNorm(h +
    residual), which the GEMV computes in its prologue while it also writes h + residual to
    residual_out (kernels/gemv.py). RMSNorm.add hands one only to a consumer whose takes_norm(h,
    kernels) said its kernel takes it (a plain projection at the GEMV's step sizes); the consumer
    passes it to kernels.linear / gate_up_silu (or Fp8Method's GEMV) in place of x."""

    h: torch.Tensor  # [T, d]
    residual: torch.Tensor  # [T, d], read only
    weight: torch.Tensor  # [d]
    eps: float
    residual_out: torch.Tensor  # [T, d], h + residual once the GEMV has run

    @property
    def shape(self) -> torch.Size:
        """x's shape, [T, d] (the layers read T from it)."""
        return self.h.shape

    def add_norm(self) -> tuple:
        """The GEMVs' add_norm argument: (residual, weight, eps, residual_out)."""
        return self.residual, self.weight, self.eps, self.residual_out


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

        into: the module that consumes x (a projection, an MLP). Where it asks for a quantized input
        (input_quant: FP8 block weights at prefill sizes, W8A8 FP8 experts past the decode path) and
        the kernels fuse that (kernels.rms_norm_fp8), x is the QuantizedActivation of norm(residual + h)
        from the norm's own kernel (with the normed rows as well, .x, where into.input_quant_writes_x).
        Where its takes_norm(h, kernels) says its kernel computes the norm itself
        (KernelConfig.gemv_add_norm at the GEMV's step sizes), x is a PendingNorm and the residual a
        new tensor that kernel fills; h and residual are not changed. A wrapper without these (LoRA)
        always gets finished rows.

        residual None (the first layer): (norm(h), h, None). tail: the pending part of h that a
        projection left (adapters' LoraDelta); the kernel adds it first and leaves the division by
        rms to the kernels after the next GEMM: x is then the undivided rows and scale (a RowScale)
        their divisor; otherwise scale is None.
        """
        quant = getattr(into, "input_quant", None) if tail is None else None
        if quant is not None:
            group = quant(h.shape[0], h.dtype, h.device, kernels)
            act = None if group is None else kernels.rms_norm_fp8(
                h, residual, self.weight, self.eps, group, getattr(into, "input_quant_writes_x", False))
            if act is not None:
                return act, (h if residual is None else residual), None
        if residual is None:
            return kernels.rms_norm(h, self.weight, self.eps), h, None
        if tail is not None:
            return kernels.add_rms_norm_lora(h, residual, self.weight, self.eps, tail)
        takes_norm = getattr(into, "takes_norm", None)
        if takes_norm is not None and residual.stride(-1) == 1 and takes_norm(h, kernels):
            x = PendingNorm(h, residual, self.weight, self.eps, torch.empty_like(residual))
            return x, x.residual_out, None
        x, residual = kernels.add_rms_norm(h, residual, self.weight, self.eps)
        return x, residual, None
