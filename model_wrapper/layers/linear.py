"""Linear: one projection of the model (qkv, o, gate_up, down, lm_head), its weights and its one call.

The decoder asks a projection for its output and never chooses a kernel:

    y, tail = proj(x, batch, kernels, fuse_tail)     x [T, in_features] -> y [T, out_features]

`tail` is work on y that a projection may leave to the kernel consuming y (fuse_tail: the caller's
next kernel can finish it: the fused RoPE + K/V store after qkv, the residual add + RMSNorm after
o and down). It is opaque to the model, which passes it on as it came; None means y is complete.
These plain linears always return None; a wrapper of a linear with the same call (LoRA:
adapters/lora_layers.py, put in place by ModelWrapper.enable_lora) may return one.

How the weight is stored and multiplied is the linear's `method` (vLLM's quant_method):

    method.create_weights(linear, in_features, out_features)  registers linear.weight (and any scales)
    method.apply(linear, x, bias, kernels)                    -> x @ W^T (+ bias)   [T, out_features]
    method.apply_silu(linear, x, bias, kernels)               -> silu(gate) * up    [T, out_features // 2]
    method.takes_norm(linear, x, kernels, silu)               whether apply / apply_silu take a
                                                              layers/norm.PendingNorm for rows like x

UnquantizedMethod (a [out, in] weight in the model's dtype) is the only one today; the choice among
GEMV, skinny GEMM and cuBLAS stays inside kernels.linear / kernels.gate_up_silu.

Tensor parallelism (model_wrapper/parallel.py): the loader fills each rank's slice under the same
parameter names (`...qkv_proj.weight`, `...qkv_proj.bias`). A column-parallel Linear needs nothing
at run time; a RowParallelLinear multiplies its input columns without the bias (project), sums the
ranks' partial products and adds the bias once, after the sum (reduce).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from model_wrapper.layers.norm import PendingNorm
from model_wrapper.parallel import TPGroup


class LinearMethod(Protocol):
    """A weight format. `bias` comes as an argument: a row-parallel linear under TP adds it only
    after the all-reduce. A method without a fused SiLU-and-mul epilogue returns
    kernels.silu_mul(self.apply(...)) from apply_silu."""

    name: str

    def create_weights(self, linear: nn.Module, in_features: int, out_features: int) -> None: ...

    def apply(self, linear: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, kernels) -> torch.Tensor: ...

    def apply_silu(self, linear: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, kernels) -> torch.Tensor: ...

    def takes_norm(self, linear: nn.Module, x: torch.Tensor, kernels, silu: bool) -> bool: ...


class UnquantizedMethod:
    """A plain weight [out_features, in_features] in the model's dtype (the loader casts it)."""

    name = "unquantized"

    def create_weights(self, linear: nn.Module, in_features: int, out_features: int) -> None:
        linear.weight = nn.Parameter(torch.empty(out_features, in_features))

    def apply(self, linear: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, kernels) -> torch.Tensor:
        """x [T, in] -> x @ W^T (+ bias) [T, out]."""
        return kernels.linear(x, linear.weight, bias)

    def apply_silu(self, linear: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, kernels) -> torch.Tensor:
        """x [T, in] -> silu(gate) * up [T, out // 2] of the [gate | up] rows of x @ W^T (+ bias)."""
        return kernels.gate_up_silu(x, linear.weight, bias)

    def takes_norm(self, linear: nn.Module, x: torch.Tensor, kernels, silu: bool) -> bool:
        """Whether kernels.linear / gate_up_silu take a PendingNorm for rows like x [T, in]."""
        return kernels.gemv_takes_norm(x, linear.weight, silu)


UNQUANTIZED = UnquantizedMethod()


class Linear(nn.Module):
    """y = x @ W^T + b: a replicated or column-parallel projection (no collective).

    Owns weight (through its method) and bias [out_features] or None, under the names the loader
    fills. `in_features` / `out_features` are this rank's sizes.
    """

    reduces = False  # whether project() gives partial sums that reduce() completes (row-parallel under TP)
    silu_product = False  # whether the layer's call is silu(gate) * up of its product (GateUpLinear)

    def __init__(self, in_features: int, out_features: int, bias: bool, method: LinearMethod = UNQUANTIZED):
        super().__init__()
        self.in_features, self.out_features, self.method = in_features, out_features, method
        method.create_weights(self, in_features, out_features)
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor, batch, kernels, fuse_tail: bool = False):
        """x [T, in] -> (y [T, out], None): a plain linear leaves no tail (batch, fuse_tail unused)."""
        return self.reduce(self.project(x, kernels)), None

    def takes_norm(self, x: torch.Tensor, kernels) -> bool:
        """Whether this projection's kernel takes the norm before it (a layers/norm.PendingNorm in
        place of x) at rows like x [T, in]: its method's GEMV at this step size, config.gemv_add_norm."""
        return self.method.takes_norm(self, x, kernels, self.silu_product)

    def project(self, x: torch.Tensor, kernels) -> torch.Tensor:
        """x [T, in] -> this rank's product [T, out]: here the whole x @ W^T + b."""
        return self.method.apply(self, x, self.bias, kernels)

    def reduce(self, y: torch.Tensor) -> torch.Tensor:
        """project()'s output -> the projection's output; here y itself."""
        return y

    def input_quant(self, rows: int, dtype: torch.dtype, device: torch.device, kernels) -> int | None:
        """The column group by which this projection wants an input of `rows` tokens (dtype, on
        device) quantized by the kernel that produces it (a QuantizedActivation, kernels/fp8_act.py:
        the method's input_quant; FP8 block-format weights at prefill sizes), or None: a plain x."""
        quant = getattr(self.method, "input_quant", None)
        return None if quant is None else quant(self, rows, dtype, device, kernels)

    def attention_input_quant(self, rows: int, dtype: torch.dtype, device: torch.device, kernels) -> int | None:
        """The column group in which the decode attention may hand this projection (o) its input of `rows` tokens
        quantized (a QuantizedActivation from its split merge: the method's attention_input_quant; FP8 block weights
        on the skinny_mma path), or None: a plain x."""
        quant = getattr(self.method, "attention_input_quant", None)
        return None if quant is None else quant(self, rows, dtype, device, kernels)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}, {self.method.name}"


class GateUpLinear(Linear):
    """The MLP's first half: rows [gate | up] (column-parallel: this rank's gate rows, then its up
    rows), whose product the MLP wants as silu(gate) * up."""

    silu_product = True

    def silu(self, x: torch.Tensor, batch, kernels, scale=None, into: nn.Module | None = None):
        """x [T, in] -> silu(gate) * up [T, out // 2], fused into the GEMM's epilogue where the
        kernels can. scale: only a wrapper that left a tail to the norm before it takes one.
        into: the projection that consumes the result (down); where it asks for a quantized input
        (Linear.input_quant) and this method can make one, a QuantizedActivation instead."""
        if scale is not None:
            raise RuntimeError("GateUpLinear.silu: got a row scale, but a plain linear has no tail to take it with")
        quant = getattr(into, "input_quant", None)
        if quant is not None and hasattr(self.method, "input_quant"):  # an FP8 method: its apply_silu quantizes
            rows, dtype, device = _like(x)
            group = quant(rows, dtype, device, kernels)
            if group is not None:
                return self.method.apply_silu(self, x, self.bias, kernels, quant_group=group)
        return self.method.apply_silu(self, x, self.bias, kernels)


class RowParallelLinear(Linear):
    """A projection whose input columns are split over the TP ranks (o, down): each rank's product
    is a partial sum; the bias (replicated) is added once, after the all-reduce. Without TP it is
    exactly a Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup,
                 method: LinearMethod = UNQUANTIZED):
        super().__init__(in_features, out_features, bias, method)
        self.tp = tp
        self.reduces = tp.enabled

    def project(self, x: torch.Tensor, kernels) -> torch.Tensor:
        """x [T, in_r] -> this rank's partial sum x_r @ W_r^T [T, out] (with the bias without TP)."""
        return self.method.apply(self, x, None if self.reduces else self.bias, kernels)

    def reduce(self, y: torch.Tensor) -> torch.Tensor:
        """Partial sums -> the sum over the ranks (TPGroup.all_reduce) + bias; y itself without TP."""
        if not self.reduces:
            return y
        y = self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias


def _like(x) -> tuple[int, torch.dtype, torch.device]:
    """(rows, dtype, device) of an input: a tensor, a layers/norm.PendingNorm (its rows h), or a
    QuantizedActivation (its activation dtype)."""
    if isinstance(x, PendingNorm):
        x = x.h
    if isinstance(x, torch.Tensor):
        return x.shape[0], x.dtype, x.device
    return x.rows, x.dtype, x.q.device
