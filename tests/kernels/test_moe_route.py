"""The one-kernel MoE routing (kernels/moe_route.py) against torch's (layers/moe.route: transformers' softmax,
topk, renormalisation and cast), under Triton's interpreter on the CPU and on CUDA (marked cuda).

Random logits: the same experts in the same order, the same weights. Ties (equal logits, where torch.topk's
choice is its sort's): a valid top-k taking the lower expert indices, with the weights torch gives the tied
values. Expert counts that are not powers of two, top-1 to top-8, with and without renormalisation, weights
in the model dtype or fp32 (Mixtral), and the router's projection plus routing as SparseMoE runs them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")
from triton_interpret import DEVICE, on_cuda_skip  # noqa: E402  (sets the interpreter up before the kernels import)
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe_route import moe_route  # noqa: E402
from model_wrapper.layers.moe import MoESpec, route  # noqa: E402


# the two top-k of the kernels: the [E, E] rank and the bitonic top-k of packed keys (KernelConfig.moe_route_sort)
TOPK = {"rank": KernelConfig(moe_route_sort=False), "sort": KernelConfig(moe_route_sort=True)}


def _check(logits, k, norm, fp32_weights, same_ids=True, cfg=TOPK["rank"]):
    """same_ids: no two logits of a row are equal (fp32 random), so the experts must be torch's; else
    (logits in bf16 / fp16 repeat values) the chosen probabilities must be torch's, slot by slot."""
    spec = MoESpec(logits.shape[1], k, 8, norm_topk_prob=norm, fp32_weights=fp32_weights)
    want_w, want_ids = route(logits.cpu(), spec)
    got_w, got_ids = moe_route(logits, k, norm, fp32_weights, cfg)
    assert got_ids.dtype == torch.int64 and got_w.dtype == want_w.dtype
    if same_ids:
        assert got_ids.cpu().tolist() == want_ids.tolist()
    probs = torch.softmax(logits.cpu().float(), -1)
    assert torch.equal(probs.gather(1, got_ids.cpu()), probs.gather(1, want_ids))
    assert all(len(set(row)) == k for row in got_ids.cpu().tolist())
    tol = 1e-6 if got_w.dtype == torch.float32 else 8e-3  # bf16: at most one rounding step apart
    torch.testing.assert_close(got_w.cpu(), want_w, rtol=tol, atol=tol)


@pytest.mark.parametrize("T,E,k", [(1, 8, 2), (3, 60, 4), (16, 128, 8), (5, 8, 1), (2, 300, 6), (4, 2, 2)])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("topk", list(TOPK))
def test_route_matches_torch(T, E, k, norm, topk):
    g = torch.Generator().manual_seed(T * 1000 + E)
    logits = torch.randn(T, E, generator=g).to(DEVICE)
    _check(logits, k, norm, fp32_weights=False, cfg=TOPK[topk])


@pytest.mark.parametrize("dtype,fp32_weights", [(torch.bfloat16, False), (torch.bfloat16, True),
                                                (torch.float16, False)])
@pytest.mark.parametrize("topk", list(TOPK))
def test_route_in_the_model_dtype(dtype, fp32_weights, topk):
    """Logits in the model dtype (the router GEMV's output): weights rounded to it, or kept fp32."""
    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(9, 64, generator=g) * 3).to(dtype).to(DEVICE)
    _check(logits, 8, True, fp32_weights, same_ids=False, cfg=TOPK[topk])


@pytest.mark.parametrize("topk", list(TOPK))
def test_ties_take_the_lower_expert_index(topk):
    """Equal logits: torch.topk picks some k of the tied experts; the kernel the k lowest indices, with the
    same weights (every tied expert has the same probability)."""
    cfg = TOPK[topk]
    logits = torch.zeros(3, 16)
    logits[1, [2, 5, 9, 11]] = 1.0  # four tied leaders, top-2: experts 2 and 5
    logits[2, [3, 7]] = 2.0  # two leaders, then 14 tied: top-4 takes 3, 7, 0, 1
    w, ids = moe_route(logits.to(DEVICE), 2, True, False, cfg)
    assert ids.cpu().tolist() == [[0, 1], [2, 5], [3, 7]]
    want_w, _ = route(logits, MoESpec(16, 2, 8, norm_topk_prob=True))
    torch.testing.assert_close(w.cpu(), want_w, rtol=1e-6, atol=1e-6)
    w4, ids4 = moe_route(logits.to(DEVICE), 4, False, False, cfg)
    assert ids4.cpu().tolist() == [[0, 1, 2, 3], [2, 5, 9, 11], [3, 7, 0, 1]]
    want_w4, want_ids4 = route(logits, MoESpec(16, 4, 8, norm_topk_prob=False))
    torch.testing.assert_close(w4.cpu(), want_w4, rtol=1e-6, atol=1e-6)
    # both are a top-4 of the same probabilities: the chosen values agree position by position
    probs = torch.softmax(logits, -1)
    assert torch.equal(probs.gather(1, ids4.cpu()), probs.gather(1, want_ids4))


def test_bad_top_k_is_refused():
    with pytest.raises(ValueError, match="top_k must be in 1..8"):
        moe_route(torch.zeros(2, 8, device=DEVICE), 9, True, False)


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("T", [1, 3, 32, 4096])
@pytest.mark.parametrize("topk", list(TOPK))
def test_route_matches_torch_cuda(T, topk):
    g = torch.Generator().manual_seed(T)
    logits = (torch.randn(T, 128, generator=g) * 2).to(torch.bfloat16).cuda()
    _check(logits, 8, True, False, same_ids=False, cfg=TOPK[topk])


@pytest.mark.parametrize("T,E,H,k", [(1, 128, 256, 8), (2, 60, 96, 4), (1, 8, 64, 2)])
@pytest.mark.parametrize("tile", [16384, 512])
@pytest.mark.parametrize("topk", list(TOPK))
def test_router_projection_and_routing_in_one_kernel(T, E, H, k, tile, topk):
    """moe_router_route: its logits are x @ gate^T (float64 oracle, within fp32 rounding), and its routing
    is torch's (layers/moe.route) on those logits: the same experts, the same weights. A small tile splits
    the experts over several programs (the last one to finish routes); a second launch routes again (the
    count was reset)."""
    from model_wrapper.kernels.moe_route import moe_router_route, router_route_fits

    g = torch.Generator().manual_seed(T * 100 + E)
    cfg = dataclasses.replace(TOPK[topk], gemv_tile=tile)
    spec = MoESpec(E, k, 8, norm_topk_prob=True)
    for step in range(2):
        x = torch.randn(T, H, generator=g).to(DEVICE)
        gate = (torch.randn(E, H, generator=g) / H**0.5).to(DEVICE)
        assert router_route_fits(x, gate, cfg)
        w, ids, logits = moe_router_route(x, gate, k, True, False, cfg)
        torch.testing.assert_close(logits.cpu().double(), x.cpu().double() @ gate.cpu().double().T, rtol=1e-5,
                                   atol=1e-5)
        want_w, want_ids = route(logits.cpu(), spec)
        assert ids.cpu().tolist() == want_ids.tolist(), step
        torch.testing.assert_close(w.cpu(), want_w, rtol=1e-6, atol=1e-6)
    assert not router_route_fits(x, gate, KernelConfig(moe_fused_router=False))
    assert not router_route_fits(torch.randn(KernelConfig().gemv_max_tokens + 1, H).to(DEVICE), gate, cfg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] if DEVICE == "cpu" else [torch.bfloat16],
                         ids=str)
@pytest.mark.parametrize("T,E,H,k", [(1, 128, 256, 8), (2, 60, 96, 4)])
@pytest.mark.parametrize("tile", [16384, 512])
def test_router_with_add_norm_is_the_norm_then_the_router(dtype, T, E, H, k, tile):
    """moe_router_route_norm = add_rms_norm (kernels/norm.py, in place on copies), then moe_router_route: the
    normalized rows it returns (program 0 writes them for the experts) and the new residual equal the standalone
    kernel's, h and the residual are unchanged, and the routing is that of the unfused rows (the same experts and
    weights; under the interpreter the same operations, so bit-equal; on CUDA the sum of squares may reduce in
    another order: rows within a rounding, routing checked on its own rows). One program or several (tile 512),
    hidden not a power of two, a second launch (the count reset)."""
    from model_wrapper.kernels.moe_route import moe_router_route, moe_router_route_norm
    from model_wrapper.kernels.norm import add_rms_norm

    g = torch.Generator().manual_seed(T * 10 + E)
    cfg = KernelConfig(gemv_tile=tile)
    for _ in range(2):
        h, r = (torch.randn(T, H, generator=g).to(DEVICE, dtype) for _ in range(2))
        nw = (1 + 0.1 * torch.randn(H, generator=g)).to(DEVICE, dtype)
        gate = (torch.randn(E, H, generator=g) / H**0.5).to(DEVICE, dtype)
        h0, r0 = h.clone(), r.clone()
        r_out = torch.empty_like(r)
        w, ids, xn = moe_router_route_norm(h, gate, k, True, False, (r, nw, 1e-6, r_out), cfg)
        want_x, want_r = h.clone(), r.clone()
        add_rms_norm(want_x, want_r, nw, 1e-6)
        assert torch.equal(r_out, want_r) and torch.equal(h, h0) and torch.equal(r, r0)
        if DEVICE == "cpu":
            assert torch.equal(xn, want_x)
        else:
            torch.testing.assert_close(xn.float(), want_x.float(), rtol=2 ** -7, atol=1e-2)
        want_w, want_ids, _ = moe_router_route(xn, gate, k, True, False, cfg)
        assert torch.equal(ids, want_ids) and torch.equal(w, want_w)


def test_router_with_add_norm_refuses_a_misshapen_residual():
    from model_wrapper.kernels.moe_route import moe_router_route_norm

    h = torch.zeros(1, 64, device=DEVICE)
    gate = torch.zeros(8, 64, device=DEVICE)
    r_out = torch.empty_like(h)
    with pytest.raises(ValueError, match=r"residual must be a \[T, H\] = \[1, 64\]"):
        moe_router_route_norm(h, gate, 2, True, False, (torch.zeros(2, 64, device=DEVICE), h[0], 1e-6, r_out))
