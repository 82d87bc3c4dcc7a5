"""GPU test (`pytest -m cuda`) of KernelConfig.moe_gemv_route: a MoE model whose router kernel writes only the logits
and whose expert GEMVs take the top-k in their prologues (kernels/moe_gemv.py, moe_route.route_topk), against the same
model with the switch off (the router kernel's last program routes), in decode graphs at batch 1 and 2 (both take the
fused router and the GEMVs), bf16 and FP8 experts, the router with
and without the post-attention add + RMSNorm prologue. The routing is the same arithmetic and the experts' kernels the
same: the steps' logits are bit for bit equal. Spies (calling through) check that the GEMVs got the pending routing."""

from __future__ import annotations

import pytest
import torch

from conftest import make_checkpoint

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("flashinfer")

from model_wrapper.kernels import KernelConfig  # noqa: E402
from test_add_norm_cuda import MOE, _decode  # noqa: E402
from test_moe_router_norm_cuda import _load  # noqa: E402


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("experts", ["bf16", "fp8"])
@pytest.mark.parametrize("router_norm", [True, False])
def test_moe_decode_graphs_with_the_routing_in_the_expert_gemvs(tmp_path, batch, experts, router_norm, monkeypatch):
    import model_wrapper.kernels.moe as moe
    from model_wrapper.kernels.moe_route import PendingRoute

    path = make_checkpoint(tmp_path / "moe", "qwen3_moe", **MOE)
    off = _load(path, experts, KernelConfig(gemv_add_norm_router=router_norm))
    a = _decode(off, batch)
    del off
    seen = []
    fn = moe.moe_gemv

    def spied(x, weights, *args, **kw):
        seen.append(isinstance(weights, PendingRoute))
        return fn(x, weights, *args, **kw)

    monkeypatch.setattr(moe, "moe_gemv", spied)
    on = _load(path, experts, KernelConfig(gemv_add_norm_router=router_norm, moe_gemv_route=True))
    b = _decode(on, batch)
    assert on.model_wrapper.graphs._graphs, "no graph was captured"
    assert any(seen), "the expert GEMVs never routed"  # (16 experts, top-3: 3 or 6 pairs, the GEMVs' steps)
    for x, y in zip(a, b):
        assert torch.equal(x, y)
