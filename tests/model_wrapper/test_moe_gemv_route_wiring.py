"""The decoder's wiring of KernelConfig.moe_gemv_route on the CPU: at decode steps the sparse layers' router kernel
writes only the logits (kernels/moe_route.moe_router_logits, with and without the post-attention add + RMSNorm
prologue), the layer hands the PendingRoute to its experts (layers/moe.SparseMoE.forward) and the register-tile GEMVs
route from it (kernels/moe_gemv.py). The CUDA kernels object (FlashInferKernels) needs FlashInfer; here a TorchKernels
takes the same host functions through the Triton kernels under the interpreter (the same dispatch: moe_router,
moe_router_norm, kernels/moe.gemv_routes). Oracle: the same model with the switch off (the router kernel's last
program routes, the GEMVs read its ids and weights): the same arithmetic, so the decode steps' logits are bit for
bit equal; Qwen3-MoE (top-3, a dense layer between the sparse ones), Qwen2-MoE (shared expert) and Mixtral (fp32
routing weights). The GPU test: tests/model_wrapper/test_moe_gemv_route_cuda.py."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import INTERPRET  # first: it sets up the interpreter

from conftest import make_checkpoint  # noqa: E402
from test_add_norm_wiring import decode_steps  # noqa: E402  (a prefill, then decode steps of one and two tokens)
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import gemv_routes  # noqa: E402
from model_wrapper.kernels.moe_route import router_route_fits  # noqa: E402
from model_wrapper.layers.kernels import FlashInferKernels, TorchKernels  # noqa: E402
from text_generator import TextGenerator  # noqa: E402


def test_the_gemvs_route_one_token_steps_of_qwen3_30b_a3b():
    """Qwen3-30B-A3B's shape (128 experts, top-8, H 2048, I 768): one token takes the GEMVs in bf16 and FP8, two do
    not (FP8 experts sort from 16 pairs: the router, which does not know the experts' dtype, routes then); off by
    default."""
    on = KernelConfig(moe_gemv_route=True)
    assert gemv_routes(1, 128, 2048, 768, 8, on)
    assert not gemv_routes(2, 128, 2048, 768, 8, on)
    assert not gemv_routes(1, 128, 2048, 768, 8, KernelConfig())
    assert not gemv_routes(1, 128, 2048, 768, 8, dataclasses.replace(on, moe_decode_gemv=False))
    assert gemv_routes(2, 128, 2048, 768, 8, dataclasses.replace(on, moe_fp8_decode_pairs=16))


if not INTERPRET:  # on a GPU the model runs FlashInferKernels (the CUDA test)
    pytestmark = pytest.mark.skip(reason="the interpreter's wiring test (CPU)")


class InterpretedMoE(TorchKernels):
    """TorchKernels whose sparse layers run FlashInferKernels' MoE dispatch (router_takes_norm, moe_router(_norm),
    moe_experts: the Triton kernels, here interpreted) at decode steps; counts the steps the GEMVs routed."""

    router_takes_norm = FlashInferKernels.router_takes_norm
    _gemv_routes = FlashInferKernels._gemv_routes

    def __init__(self, *args):
        super().__init__(*args)
        self._triton = True  # FlashInferKernels' marker that the Triton kernels run (here under the interpreter)
        self.routed = 0

    def moe_router(self, x, gate_weight, spec):
        if not router_route_fits(x, gate_weight, self.config):  # prefill: torch's router and routing (both arms)
            return super().moe_router(x, gate_weight, spec)
        w, ids = FlashInferKernels.moe_router(self, x, gate_weight, spec)
        self.routed += ids is None
        return w, ids

    def moe_router_norm(self, x, gate_weight, spec):
        w, ids, xn = FlashInferKernels.moe_router_norm(self, x, gate_weight, spec)
        self.routed += ids is None
        return w, ids, xn

    def moe_experts(self, x, weights, ids, gate_up, down, gate_up_scale=None, down_scale=None):
        if x.shape[0] > 2:  # prefill: the reference (both arms)
            return super().moe_experts(x, weights, ids, gate_up, down, gate_up_scale, down_scale)
        return FlashInferKernels.moe_experts(self, x, weights, ids, gate_up, down, gate_up_scale, down_scale)


def _steps(path, **switches):
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32)
    k = gen.model_wrapper.kernels
    cfg = dataclasses.replace(k.config, gemv_add_norm_max_tokens=2, **switches)
    kernels = gen.model_wrapper.kernels = InterpretedMoE(k.inv_freq, k.dtype, cfg)
    return decode_steps(gen), kernels.routed


# sparse layers a model (conftest: Qwen3-MoE / Qwen2-MoE 3 layers, the middle one dense; Mixtral 2)
@pytest.mark.parametrize("family,sparse", [("qwen3_moe", 2), ("qwen2_moe", 2), ("mixtral", 2)])
@pytest.mark.parametrize("router_norm", [True, False])
def test_the_gemvs_routing_gives_the_routing_kernels_logits(tmp_path, family, sparse, router_norm):
    path = make_checkpoint(tmp_path / family, family)
    want, routed_off = _steps(path, gemv_add_norm_router=router_norm, moe_gemv_route=False)
    got, routed = _steps(path, gemv_add_norm_router=router_norm, moe_gemv_route=True)
    assert routed_off == 0 and routed == sparse * 6  # three steps of one token, three of two
    for a, b in zip(got, want):
        assert torch.equal(a, b)
