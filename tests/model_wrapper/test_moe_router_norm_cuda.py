"""GPU test (`pytest -m cuda`) of KernelConfig.gemv_add_norm_router: a MoE model's post-attention add + RMSNorm
inside its router + routing kernel (kernels/moe_route.moe_router_route_norm), against the same model with the
switch off (the add_rms_norm kernel, then the router kernel), in decode graphs at batch 1 and 2 (max tokens 2:
the fused path at both), bf16 and FP8 experts. The fused prologue may round the normalized rows an ulp apart
(tests/kernels/test_moe_route.py), which may route a near-tied token apart: the steps agree within a bf16 bound,
and their greedy tokens wherever the top two logits are further apart than the two runs differ
(test_add_norm_cuda._agree). A spy on the kernel's entry point (calling through) checks that the fused path ran."""

from __future__ import annotations

import pytest
import torch

from conftest import make_checkpoint, quantize_fp8_blockwise

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("flashinfer")

from model_wrapper.kernels import KernelConfig  # noqa: E402
from test_add_norm_cuda import MOE, _agree, _decode  # noqa: E402
from text_generator import TextGenerator  # noqa: E402


def _load(path, experts, cfg):
    """The bf16 model in decode graphs; experts "fp8": every layer's experts to e4m3 + scales in place."""
    from model_wrapper.layers.moe import SparseMoE

    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                        kernel_config=cfg)
    if experts == "fp8":
        for m in gen.model_wrapper.model.modules():
            if isinstance(m, SparseMoE):
                ex = m.experts
                for name in ("gate_up_proj", "down_proj"):
                    q, scale = quantize_fp8_blockwise(getattr(ex, name).data)
                    setattr(ex, name, torch.nn.Parameter(q, requires_grad=False))
                    setattr(ex, name + "_scale", scale)
    return gen


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("experts", ["bf16", "fp8"])
def test_moe_decode_graphs_with_the_norm_in_the_router(tmp_path, batch, experts, monkeypatch):
    import model_wrapper.kernels.moe_route as moe_route

    path = make_checkpoint(tmp_path / "moe", "qwen3_moe", **MOE)
    off = _load(path, experts, KernelConfig(gemv_add_norm_router=False))
    a = _decode(off, batch)
    del off
    seen = []
    fn = moe_route.moe_router_route_norm

    def spied(*args, **kw):
        seen.append(1)
        return fn(*args, **kw)

    monkeypatch.setattr(moe_route, "moe_router_route_norm", spied)
    on = _load(path, experts, KernelConfig(gemv_add_norm_router=True, gemv_add_norm_max_tokens=2))
    b = _decode(on, batch)
    assert on.model_wrapper.graphs._graphs, "no graph was captured"
    assert seen, "the router never took the norm"
    _agree(a, b)
