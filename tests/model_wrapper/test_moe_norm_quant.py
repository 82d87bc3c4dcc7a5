"""KernelConfig.moe_w8a8_norm_quant on the CPU: where a sparse layer's FP8 experts run the W8A8 grouped GEMMs (past
the decode path), its post-attention norm (layers/norm.RMSNorm.add) quantizes the rows for them in its own kernel
(kernels/fp8_act.add_rms_norm_fp8, which also writes the normed rows for the router) and fused_moe skips its quantize
kernel for x. The CUDA kernels object (FlashInferKernels) needs FlashInfer; here a TorchKernels takes the same
calls through the same Triton kernels under the interpreter. Oracle: the layer on the same normed rows given as a
plain tensor, which fused_moe quantizes with its own kernel (kernels/fp8_act.quantize_fp8_per_token_group): the
same output bit for bit, with one quantize launch fewer. The GPU test: tests/kernels/test_moe_kernel.py
(test_norm_quantized_x_cuda)."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import INTERPRET  # first: it sets up the interpreter

from conftest import make_checkpoint  # noqa: E402
from fp8_checkpoints import write_fp8  # noqa: E402
from model_wrapper.config import ModelConfig  # noqa: E402
from model_wrapper.kernels import moe as moe_kernels  # noqa: E402
from model_wrapper.kernels.fp8_reference import QuantizedActivation  # noqa: E402
from model_wrapper.layers.kernels import TorchKernels  # noqa: E402
from model_wrapper.layers.moe import SparseMoE  # noqa: E402
from model_wrapper.layers.norm import RMSNorm  # noqa: E402
from model_wrapper.loader import load_model  # noqa: E402

if not INTERPRET:  # on a GPU the model runs FlashInferKernels
    pytest.skip("the interpreter's wiring test (CPU)", allow_module_level=True)


class InterpretedMoE(TorchKernels):
    """TorchKernels whose sparse layers run fused_moe (FlashInferKernels' calls without FlashInfer) and whose norms
    quantize for them where the config says so (FlashInferKernels' moe_input_quant / rms_norm_fp8)."""

    def moe_experts(self, x, weights, ids, gate_up, down, gate_up_scale=None, down_scale=None, x_quant=None):
        return moe_kernels.fused_moe(x, weights, ids, gate_up, down, self.config, gate_up_scale, down_scale, x_quant)

    def moe_input_quant(self, rows, top_k, num_experts):
        return moe_kernels.takes_quantized_x(rows, top_k, num_experts, self.config)

    def rms_norm_fp8(self, x, residual, weight, eps, group, write_x=False):
        from model_wrapper.kernels.fp8_act import add_rms_norm_fp8

        return add_rms_norm_fp8(x, residual, weight, eps, group, write_x)


@pytest.fixture(scope="module")
def fp8_layer(tmp_path_factory):
    """A block-FP8 Qwen3-MoE's first sparse layer with its experts kept e4m3 on the CPU (hidden 256, 16 experts,
    top 4, intermediate 384: three 128-column groups)."""
    root = tmp_path_factory.mktemp("moe_norm_quant")
    src = make_checkpoint(root / "src", "qwen3_moe", moe_intermediate_size=384, hidden_size=256, num_experts=16,
                          num_experts_per_tok=4, num_attention_heads=8)
    fp8, _, _ = write_fp8(src, root / "q", "block")
    model = load_model(fp8, ModelConfig.from_pretrained(fp8), dtype=torch.float32, device=torch.device("cpu"),
                       keep_fp8=True)
    layer = next(layer.mlp for layer in model.model.layers if isinstance(layer.mlp, SparseMoE))
    assert layer.experts.gate_up_proj.dtype == torch.float8_e4m3fn
    return layer


@pytest.mark.parametrize("T", [6, 21])
def test_the_norm_quantizes_the_experts_rows(fp8_layer, T, monkeypatch):
    layer, H = fp8_layer, 256
    g = torch.Generator().manual_seed(T)
    h, residual = torch.randn(T, H, generator=g), torch.randn(T, H, generator=g)
    norm = RMSNorm(H, 1e-6)
    norm.weight.data = 1 + 0.1 * torch.randn(H, generator=g)
    cfg = dataclasses.replace(TorchKernels(torch.ones(8), torch.float32).config, moe_w8a8_norm_quant=True,
                              moe_w8a8_norm_quant_min_pairs=16)  # (6 x 4 and 21 x 4 pairs)
    on = InterpretedMoE(torch.ones(8), torch.float32, cfg)
    off = InterpretedMoE(torch.ones(8), torch.float32, dataclasses.replace(cfg, moe_w8a8_norm_quant=False))
    assert layer.input_quant(T, h.dtype, h.device, on) == 128
    assert layer.input_quant(T, h.dtype, h.device, off) is None
    quantized = []
    real = moe_kernels.quantize_fp8_per_token_group
    monkeypatch.setattr(moe_kernels, "quantize_fp8_per_token_group",
                        lambda x, group: quantized.append(x) or real(x, group))

    res_on = residual.clone()
    x, res_out, _ = norm.add(h, res_on, on, into=layer)
    assert isinstance(x, QuantizedActivation) and x.x is not None and x.group == 128
    assert torch.equal(res_out, residual + h)
    y_on = layer(x, None, on)[0]
    assert len(quantized) == 1  # gate_up's output only
    quantized.clear()
    y_off = layer(x.x, None, off)[0]  # the same normed rows, quantized by fused_moe's own kernel
    assert len(quantized) == 2
    assert torch.equal(y_on, y_off)

    x_off, _, _ = norm.add(h, residual.clone(), off, into=layer)  # switch off: finished rows
    assert isinstance(x_off, torch.Tensor)


def test_decode_path_steps_take_finished_rows(fp8_layer):
    """At a step the decode path takes (a token, 4 pairs: weight-only GEMVs) the norm hands over plain rows; so it
    does below moe_w8a8_norm_quant_min_pairs and past moe_small_pairs (the prefill tiles quantize x themselves)."""
    cfg = dataclasses.replace(TorchKernels(torch.ones(8), torch.float32).config, moe_w8a8_norm_quant=True,
                              moe_w8a8_norm_quant_min_pairs=24, moe_small_pairs=64)
    kernels = InterpretedMoE(torch.ones(8), torch.float32, cfg)
    cpu = torch.device("cpu")
    # pairs (top 4): 4 (the decode path: to 16 here), 20 (below the bound), 24, 64, 68 (past the small tiles)
    assert [fp8_layer.input_quant(T, torch.float32, cpu, kernels) for T in (1, 5, 6, 16, 17)] == \
        [None, None, 128, 128, None]
    norm = RMSNorm(256, 1e-6)
    x, _, _ = norm.add(torch.randn(1, 256), torch.randn(1, 256), kernels, into=fp8_layer)
    assert isinstance(x, torch.Tensor)
