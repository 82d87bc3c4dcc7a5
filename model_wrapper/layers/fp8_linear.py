"""Fp8Method: a linear whose weight stays float8_e4m3fn with float32 scales (the CUDA path).

One storage for every FP8 checkpoint format (model_wrapper/quantization.py), filled by the loader:

    linear.weight        float8_e4m3fn [N, K]
    linear.weight_scale  float32 [N, KG]: a scale per output row and per group of `group` K-columns,
                         KG = ceil(K / group)
    linear.input_scale   float32 [] (static activations only)

    W[n, k] = weight[n, k].float() * weight_scale[n, k // group]

    block   (fp8, [128, 128]): group 128; the checkpoint's [ceil(N/128), ceil(K/128)] block scales
            repeated along the rows (repeat_interleave), so row n has its block row's scales
    channel (compressed-tensors): group K, KG 1, the checkpoint's [N, 1]
    tensor  (compressed-tensors): group K, KG 1, the one scalar on every row

A scale per row makes the fused projections a concatenation (q, k and v rows keep their own
scales) and column-parallel TP a row slice. A row-parallel TP shard (o, down) whose first K-column
is not a multiple of `group` would cut blocks: the loader dequantizes such a layer to the model
dtype and gives it UnquantizedMethod instead (exact, and it only happens for odd shard widths).

Where it runs: on CUDA GPUs with e4m3 support only (runs_e4m3: compute capability 8.9+, L4 / L40S / H100 /
H200; Triton has no e4m3 type before it). On an older GPU (A100: sm80), as on the CPU, the loader
dequantizes every FP8 weight once at load into the model dtype (UnquantizedMethod): the CPU path is the reference, dequantized weights and
unquantized activations, which is exactly transformers' model on the dequantized weights. On
CUDA apply() calls model_wrapper.kernels.fp8 (FP8 tensor cores and weight-only GEMVs; activations
may be quantized per token there, or with input_scale, a speed choice within the GPU accuracy
bounds); without Triton it falls back to dequantize-then-F.linear (correct, slow).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from model_wrapper.layers.norm import PendingNorm
from model_wrapper.kernels.fp8_reference import QuantizedActivation

E4M3 = torch.float8_e4m3fn


@functools.lru_cache(maxsize=None)
def runs_e4m3(device: torch.device | str) -> bool:
    """Whether `device` runs the e4m3 kernels (FP8 weights kept e4m3, the Triton FP8 KV-cache paths): a CUDA GPU of
    compute capability 8.9 or more. Triton refuses its e4m3 type (fp8e4nv) before sm89, so an A100 takes FP8
    checkpoints dequantized at load and no FP8 KV cache. (Cached: validation asks every step.)"""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, group: int) -> torch.Tensor:
    """weight e4m3 [..., N, K], scale float32 [..., N, KG] -> float32 [..., N, K]: each element
    times the scale of its row and K-group of `group` columns."""
    k = weight.shape[-1]
    cols = scale.repeat_interleave(group, dim=-1)[..., :k] if scale.shape[-1] > 1 else scale
    return weight.float() * cols


class Fp8Method:
    """The LinearMethod (layers/linear.py) of an FP8 weight; one instance per linear (its group).

    group:  K-columns per scale (128 for block scales; in_features for channel / tensor scales)
    static: the linear has an input_scale (static activation quantization)
    """

    name = "fp8"

    def __init__(self, group: int, static: bool = False):
        self.group, self.static = group, static

    def create_weights(self, linear: nn.Module, in_features: int, out_features: int) -> None:
        kg = -(-in_features // self.group)
        linear.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=E4M3), requires_grad=False)
        linear.weight_scale = nn.Parameter(torch.empty(out_features, kg, dtype=torch.float32), requires_grad=False)
        linear.input_scale = (nn.Parameter(torch.empty((), dtype=torch.float32), requires_grad=False)
                              if self.static else None)

    def apply(self, linear: nn.Module, x, bias: torch.Tensor | None, kernels) -> torch.Tensor:
        """x [T, in] (model dtype) -> x @ W^T (+ bias) [T, out] in x's dtype. x a PendingNorm
        (takes_norm): the GEMV with the add + RMSNorm in its prologue; x the QuantizedActivation its
        producer made where input_quant asked for one: the block-scaled GEMM on it."""
        if isinstance(x, PendingNorm):
            return _kernels(x.h).fp8_gemv(x.h, linear.weight, linear.weight_scale, self.group, bias,
                                         cfg=kernels.config, add_norm=x.add_norm())
        if isinstance(x, QuantizedActivation):
            return _fp8().fp8_linear_quantized(x, linear.weight, self.block_scale(linear), bias, linear.weight_scale,
                                               kernels.config, self.group)
        fp8 = _kernels(x)
        if fp8 is not None:
            return fp8.fp8_linear(x, linear.weight, linear.weight_scale, self.group, bias, linear.input_scale,
                                  kernels.config, self.block_scale(linear))
        return F.linear(x, self.dequantized(linear, x.dtype), bias)

    def apply_silu(self, linear: nn.Module, x, bias: torch.Tensor | None, kernels, quant_group: int | None = None):
        """x [T, in] (or a PendingNorm / QuantizedActivation, as apply) -> silu(gate) * up [T, out // 2]
        of the [gate | up] rows; quant_group (the next projection's input_quant): a QuantizedActivation
        of it where a prefill path runs (SiLU-and-mul and the quantization in one kernel)."""
        if isinstance(x, PendingNorm):
            return _kernels(x.h).fp8_gemv(x.h, linear.weight, linear.weight_scale, self.group, bias, silu=True,
                                         cfg=kernels.config, add_norm=x.add_norm())
        fp8 = _fp8() if isinstance(x, QuantizedActivation) else _kernels(x)
        if fp8 is not None:
            return fp8.fp8_gate_up_silu(x, linear.weight, linear.weight_scale, self.group, bias, linear.input_scale,
                                        kernels.config, self.block_scale(linear), quant_group)
        return kernels.silu_mul(F.linear(x, self.dequantized(linear, x.dtype), bias))

    def takes_norm(self, linear: nn.Module, x: torch.Tensor, kernels, silu: bool) -> bool:
        """Whether apply / apply_silu take a PendingNorm for rows like x: config.adds_norm (qkv; silu:
        gate_up) where the step runs the weight-only GEMV (kernels/fp8.fp8_path "gemv"), x with unit
        column stride."""
        cfg = kernels.config
        if x.dim() != 2 or x.stride(-1) != 1 or not cfg.adds_norm(x.shape[0], "gate_up" if silu else "qkv"):
            return False
        fp8 = _kernels(x)
        return fp8 is not None and fp8.fp8_path(x, linear.weight, linear.weight_scale, self.group, cfg, silu) == "gemv"

    def input_quant(self, linear: nn.Module, rows: int, dtype: torch.dtype, device: torch.device,
                    kernels) -> int | None:
        """The column group by which the kernel producing this linear's input of `rows` tokens (dtype,
        on device) may quantize it (a QuantizedActivation, kernels/fp8_act.py), or None: 128 for the
        block-scaled GEMM (block format), the input width for the row-wise one (one weight scale a
        row, KernelConfig.fp8_fused_act_quant_per_token); CUDA, prefill sizes, dynamic activations
        (kernels/fp8.py quantized_input_group)."""
        if device.type != "cuda" or self.static:
            return None
        fp8 = _fp8()
        if fp8 is None:
            return None
        return fp8.quantized_input_group(rows, dtype, device, linear.weight, linear.weight_scale,
                                         self.block_scale(linear), kernels.config, self.group)

    def attention_input_quant(self, linear: nn.Module, rows: int, dtype: torch.dtype, device: torch.device,
                              kernels) -> int | None:
        """The column group (128) in which the decode attention's split merge may quantize this linear's input of
        `rows` tokens (kernels/fp8.py attention_output_group: block weights on "skinny_mma", dynamic activations),
        or None."""
        if device.type != "cuda" or self.static:
            return None
        fp8 = _fp8()
        if fp8 is None:
            return None
        return fp8.attention_output_group(rows, dtype, device, linear.weight, linear.weight_scale, self.group,
                                          kernels.config)

    def block_scale(self, linear: nn.Module) -> torch.Tensor | None:
        """The weight's scales as 128 x 128 blocks, float32 [K / 128, N / 128] with stride(0) == 1
        (cuBLASLt's block-scaled GEMM, kernels/fp8.py "scaled_mm_block"), or None where they are not
        blocks. Made once (prepare, called by the loader) and kept on the linear; a linear filled
        another way makes them on its first call outside a CUDA graph capture."""
        if "fp8_block_scale" not in linear.__dict__:
            if linear.weight.is_cuda and torch.cuda.is_current_stream_capturing():
                return None  # the check below reads the device: never inside a capture
            self.prepare(linear)
        return linear.__dict__["fp8_block_scale"]

    def prepare(self, linear: nn.Module) -> None:
        """After the weights are filled: keep the block scales of block_scale. They exist where the
        group is 128, N and K are multiples of 128 and each 128-row band of weight_scale repeats one
        row (a block checkpoint's scales as fp8_weights.row_scales lays them out, not a TP shard
        starting inside a band)."""
        s = linear.weight_scale
        n, k = linear.weight.shape
        blocks = None
        if self.group == 128 and n % 128 == 0 and k % 128 == 0 and not self.static:
            compact = s[::128]  # [N / 128, KG]
            if torch.equal(compact.repeat_interleave(128, dim=0), s):
                blocks = compact.contiguous().t()
        linear.__dict__["fp8_block_scale"] = blocks

    def dequantized(self, linear: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The weight as W [out, in] in dtype (the fallback's, and a test's, view of it)."""
        return dequantize(linear.weight, linear.weight_scale, self.group).to(dtype)


def _kernels(x: torch.Tensor):
    """model_wrapper.kernels.fp8 for a CUDA x where Triton imports, else None (the torch fallback)."""
    return _fp8() if x.is_cuda else None


def _fp8():
    """model_wrapper.kernels.fp8, or None without Triton."""
    try:
        from model_wrapper.kernels import fp8
    except ImportError:
        return None
    return fp8
