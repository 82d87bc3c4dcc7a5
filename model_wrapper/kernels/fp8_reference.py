"""FP8 (e4m3) linears in plain torch: the arithmetic the Triton kernels of kernels/fp8.py implement,
their fallback off CUDA (and where no kernel takes a shape), and the second opinion of their tests.
No Triton import: a CPU-only install uses it (an FP8 checkpoint on the CPU is dequantized once).

Weights: e4m3 [N, K] with float32 scales [N, KG], one per output row and per group of `group`
K-columns (KG = ceil(K / group); a per-channel or per-tensor checkpoint has KG = 1, group = K):

    W[n, k] = float(weight[n, k]) * weight_scale[n, k // group]

Activations, where a path quantizes them (prefill): per token and per `group` columns,
scale = max(amax, MIN_AMAX) / 448 and x_fp8 = e4m3(clamp(x / scale, -448, 448)) (dynamic), or
x_fp8 = e4m3(clamp(x / input_scale, ...)) with one static float32 scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

FP8_MAX = 448.0  # largest finite float8_e4m3fn
MIN_AMAX = 1e-10  # an all-zero group gets this amax: zeros quantize to zeros instead of 0 / 0


@dataclass
class QuantizedActivation:
    """An FP8 linear's input, quantized by the kernel that produced it (kernels/fp8_act.py) in the
    layout of the block-scaled GEMM (kernels/fp8.py "scaled_mm_block"):

        q      float8_e4m3fn [Mp, K]   rows M.. zero (Mp: M padded to a multiple of 16)
        scale  float32 [Mp, KG]        a scale per row and `group` columns, stride(0) == 1
        rows   M, the step's tokens
        dtype  the activation's own dtype (bf16 / fp16): the GEMM's output dtype
        x      the unquantized activation [M, K] where the producer also wrote it, else None

    x[m, k] ~ float(q[m, k]) * scale[m, k // group] (quantize_fp8_reference's rounding)."""

    q: torch.Tensor
    scale: torch.Tensor
    rows: int
    group: int
    dtype: torch.dtype
    x: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.q.shape[1]

    def dequantize(self) -> torch.Tensor:
        """-> float32 [M, K]: the values the GEMM multiplies."""
        return dequantize_fp8_weight(self.q[:self.rows], self.scale[:self.rows], self.group)


def dequantize_fp8_weight(weight: torch.Tensor, weight_scale: torch.Tensor, group: int,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """weight e4m3 [N, K], weight_scale float32 [N, KG] -> W [N, K] in dtype (the product in fp32,
    rounded once to dtype)."""
    K = weight.shape[1]
    scale = weight_scale.float().repeat_interleave(group, dim=1)[:, :K]  # [N, KG * group] -> [N, K]
    return (weight.float() * scale).to(dtype)


def quantize_fp8_reference(x: torch.Tensor, group: int,
                           input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_fp8 e4m3 [M, K], scale float32 [M, KG]): dynamic per token and group, or with
    the static scalar input_scale (then every entry of scale is it)."""
    M, K = x.shape
    kg = -(-K // group)
    xf = F.pad(x.float(), (0, kg * group - K)).view(M, kg, group)
    if input_scale is None:
        scale = xf.abs().amax(dim=2).clamp_min(MIN_AMAX) / FP8_MAX  # [M, KG]
    else:
        scale = input_scale.float().reshape(1, 1).expand(M, kg)
    q = (xf / scale[:, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(M, kg * group)[:, :K].contiguous(), scale.contiguous()


def fp8_linear_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, group: int,
                         bias: torch.Tensor | None = None, quantize_input: bool = False,
                         input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ W^T (+ bias) -> [M, N] in x's dtype, W dequantized in fp32, the product in fp32.
    quantize_input: x rounded through e4m3 first as the prefill path does it (per token and group
    dynamically, or with input_scale); otherwise the weight-only product of the decode path."""
    xf = x.float()
    if quantize_input:
        q, s = quantize_fp8_reference(x, group, input_scale)
        xf = dequantize_fp8_weight(q, s, group)  # same layout: a scale per row and per group
    y = xf @ dequantize_fp8_weight(weight, weight_scale, group).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def fp8_gate_up_silu_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, group: int,
                               bias: torch.Tensor | None = None, quantize_input: bool = False,
                               input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up of fp8_linear_reference over gate_up rows [gate | up] -> [M, N // 2], each
    product rounded to x's dtype first (as the GEMM, then silu_and_mul)."""
    gate, up = fp8_linear_reference(x, weight, weight_scale, group, bias, quantize_input, input_scale).chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)
