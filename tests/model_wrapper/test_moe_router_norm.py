"""The decoder's wiring of KernelConfig.gemv_add_norm_router on the CPU: RMSNorm.add hands a sparse layer's
post-attention norm to its router kernel (layers/moe.SparseMoE.takes_norm), kernels/moe_route.moe_router_route_norm
computes the add + RMSNorm in its prologue, writes the new residual out of place and the normalized rows the
experts (and Qwen2-MoE's shared expert) read, and the next layer reads that residual. The CUDA kernels object
(FlashInferKernels) needs FlashInfer; here a TorchKernels takes the PendingNorm through the same Triton kernel under
the interpreter, and decode steps must give the logits of the same model on plain TorchKernels (the unfused norm,
torch's router and routing; tests/model_wrapper/test_moe.py holds those to transformers) within fp32 rounding (the
kernel's projection sums in another order than F.linear). The GPU test: tests/kernels/test_moe_kernel.py
(test_router_norm_in_decode_graphs_cuda)."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import INTERPRET  # first: it sets up the interpreter

from conftest import make_checkpoint, rel_err  # noqa: E402
from test_add_norm_wiring import decode_steps  # noqa: E402  (a prefill, then decode steps of one and two tokens)
from model_wrapper.layers.kernels import TorchKernels  # noqa: E402
from text_generator import TextGenerator  # noqa: E402

if not INTERPRET:  # on a GPU the model runs FlashInferKernels
    pytest.skip("the interpreter's wiring test (CPU)", allow_module_level=True)


class InterpretedRouterNorm(TorchKernels):
    """TorchKernels whose sparse layers' routers take the post-attention norm where the config says so
    (FlashInferKernels' condition without FlashInfer), through kernels/moe_route.py; counts the fused launches."""

    def __init__(self, *args):
        super().__init__(*args)
        self.fused = 0

    def router_takes_norm(self, x, gate_weight):
        from model_wrapper.kernels.moe_route import router_route_fits

        return self.config.adds_norm(x.shape[0], "router") and router_route_fits(x, gate_weight, self.config)

    def moe_router_norm(self, x, gate_weight, spec):
        from model_wrapper.kernels.moe_route import moe_router_route_norm

        self.fused += 1
        return moe_router_route_norm(x.h, gate_weight, spec.top_k, spec.norm_topk_prob, spec.fp32_weights,
                                     x.add_norm(), self.config)


# sparse layers a model (conftest: Qwen3-MoE / Qwen2-MoE 3 layers, the middle one dense; Mixtral 2): fused launches
# a step of up to max_tokens tokens
@pytest.mark.parametrize("family,sparse", [("qwen3_moe", 2), ("qwen2_moe", 2), ("mixtral", 2)])
@pytest.mark.parametrize("max_tokens", [1, 2])
def test_the_norm_inside_the_router_gives_the_unfused_models_logits(tmp_path, family, sparse, max_tokens):
    path = make_checkpoint(tmp_path / family, family)
    want = decode_steps(TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32))
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32)
    k = gen.model_wrapper.kernels
    cfg = dataclasses.replace(k.config, gemv_add_norm=True, gemv_add_norm_router=True,
                              gemv_add_norm_max_tokens=max_tokens)
    kernels = gen.model_wrapper.kernels = InterpretedRouterNorm(k.inv_freq, k.dtype, cfg)
    got = decode_steps(gen)
    assert kernels.fused == sparse * 3 * max_tokens  # three steps of one token, three of two
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-5
