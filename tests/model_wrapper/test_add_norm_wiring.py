"""The decoder's wiring of KernelConfig.gemv_add_norm on the CPU: RMSNorm.add hands a PendingNorm to qkv or
the dense gate_up (a MoE model's qkv too), the GEMV computes the norm in its prologue and writes the new residual
out of place, and the next layer reads that residual. The CUDA kernels object (FlashInferKernels) needs
FlashInfer; here TorchKernels takes the PendingNorm through the same Triton kernels under the interpreter
(kernels/gemv.py) at 1-2 token steps, and decode steps must give the logits of the
same model on TorchKernels (the unfused norms; tests/model_wrapper/test_forward_parity.py holds that to
transformers), within fp32 rounding (the GEMV sums in another order than F.linear). The GPU test of the
switch itself: test_add_norm_cuda.py."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import INTERPRET  # first: it sets up the interpreter

from conftest import PagedHarness, make_checkpoint, rel_err  # noqa: E402
from model_wrapper.layers.kernels import TorchKernels  # noqa: E402
from model_wrapper.layers.norm import PendingNorm  # noqa: E402
from text_generator import TextGenerator  # noqa: E402

if not INTERPRET:  # on a GPU the model runs FlashInferKernels: test_add_norm_cuda.py
    pytest.skip("the interpreter's wiring test (CPU)", allow_module_level=True)


class InterpretedNormKernels(TorchKernels):
    """TorchKernels whose projections take a PendingNorm where the config's adds_norm says so, through the
    Triton GEMV (FlashInferKernels' dispatch of the fused path, without FlashInfer); counts the fused launches."""

    def __init__(self, *args):
        super().__init__(*args)
        self.fused = 0

    def gemv_takes_norm(self, x, weight, silu):
        return self.config.adds_norm(x.shape[0], "gate_up" if silu else "qkv")

    def linear(self, x, weight, bias=None):
        if isinstance(x, PendingNorm):
            from model_wrapper.kernels.gemv import gemv

            self.fused += 1
            return gemv(x.h, weight, bias, add_norm=x.add_norm())
        return super().linear(x, weight, bias)

    def gate_up_silu(self, x, weight, bias=None):
        if isinstance(x, PendingNorm):
            from model_wrapper.kernels.gemv import gemv

            self.fused += 1
            return gemv(x.h, weight, bias, silu=True, add_norm=x.add_norm())
        return super().gate_up_silu(x, weight, bias)


def decode_steps(gen):
    """A prefill of two prompts (no fusion: 10 tokens), then decode steps of one and of two tokens."""
    h = PagedHarness(gen, 32, 4, seed=1)
    g = torch.Generator().manual_seed(0)
    h.step({0: torch.randint(0, 50, (7,), generator=g).tolist(), 1: torch.randint(0, 50, (3,), generator=g).tolist()},
           is_prefill=True)
    out = []
    for s in range(3):
        out.append(h.step({0: [5 + s]}, is_prefill=False))
        out.append(h.step({0: [9], 1: [11 + s]}, is_prefill=False))
    return out


# fused launches a step: every norm but the first layer's input norm (no residual yet), the final one and,
# in the MoE model (3 layers, the middle one dense), the sparse layers' post-attention norms (the router
# takes finished rows)
@pytest.mark.parametrize("family,per_step", [("llama", 3), ("qwen2", 3), ("qwen3_moe", 3)])
def test_norms_inside_the_gemvs_give_the_unfused_models_logits(tmp_path, family, per_step):
    path = make_checkpoint(tmp_path / family, family)
    want = decode_steps(TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32))
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32)
    k = gen.model_wrapper.kernels
    cfg = dataclasses.replace(k.config, gemv_add_norm=True, gemv_add_norm_max_tokens=2, gemv_add_norm_qkv=True)
    kernels = gen.model_wrapper.kernels = InterpretedNormKernels(k.inv_freq, k.dtype, cfg)
    got = decode_steps(gen)
    assert kernels.fused == per_step * len(want)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-5
