"""KernelConfig.moe_gemv_route: the router kernel writes only the logits (moe_route.moe_router_logits) and the
register-tile expert GEMVs (kernels/moe_gemv.py) take the top-k in their prologues (moe_route.route_topk).

Under Triton's interpreter on the CPU (fp32 / fp16) and on CUDA (marked cuda, bf16 and FP8 experts at Qwen3-30B-A3B's
shape). The oracles: the existing chain (the router + routing kernel, moe_route.moe_router_route, then the same
GEMVs reading its ids and weights: the ids, order and weights the gate_up GEMV writes and the layer's output must be
bit for bit that chain's), torch's routing (layers/moe.route) on the logits, and the reference experts
(layers/moe.experts_reference). Ties come from duplicated router rows (equal logits): the lower expert index first,
as the routing kernel takes them. A step that the GEMVs do not take (the sorted path) routes first and matches too.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")
from triton_interpret import DEVICE, INTERPRET, on_cuda_skip  # noqa: E402  (sets the interpreter up first)
from conftest import dequantize_fp8_blockwise, quantize_fp8_blockwise  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import fused_moe  # noqa: E402
from model_wrapper.kernels.moe_route import PendingRoute, moe_router_logits, moe_router_route  # noqa: E402
from model_wrapper.layers.moe import MoESpec, experts_reference, route  # noqa: E402

# interpreter shapes: register tiles of 256 / 512 weights (H = 48 and I = 40 pad to 64), every step on the GEMVs;
# the router's experts over several programs (gemv_tile 512)
SMALL = KernelConfig(moe_decode_pairs=1 << 20, moe_fp8_decode_pairs=1 << 20, moe_decode_pairs_per_expert=1 << 20,
                     moe_gemv_tile=256, moe_gemv_down_tile=512, moe_fp8_gemv_tile=1024, moe_fp8_gemv_down_tile=2048,
                     gemv_tile=512, gemv_max_tokens=4)
TOPK = {"sort": SMALL, "rank": dataclasses.replace(SMALL, moe_route_sort=False)}


def _case(T, E, H, inter, dtype, device, seed=0, ties=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    gate = torch.randn(E, H, generator=g) / H**0.5
    if ties:  # experts 2k and 2k + 1 share a router row: every logit appears twice
        gate = gate[torch.arange(E) // 2 * 2]
    gate_up = torch.randn(E, 2 * inter, H, generator=g) * H**-0.5
    down = torch.randn(E, H, inter, generator=g) * inter**-0.5
    return (t.to(dtype).to(device) for t in (x, gate, gate_up, down))


def _both(x, gate, gate_up, down, k, norm, fp32_weights, cfg, scales=None):
    """-> ((weights, ids, y) of the routing kernel's chain, (weights, ids, y, logits) of the GEMVs' routing)."""
    scales = scales or {}
    w, ids, _ = moe_router_route(x, gate, k, norm, fp32_weights, cfg)
    y = fused_moe(x, w, ids, gate_up, down, cfg, **scales)
    on = dataclasses.replace(cfg, moe_gemv_route=True)
    pending, xn = moe_router_logits(x, gate, k, norm, fp32_weights, on)
    assert isinstance(pending, PendingRoute) and xn is None
    y2 = fused_moe(x, pending, None, gate_up, down, on, **scales)
    return (w, ids, y), (pending.weights, pending.ids, y2, pending.logits)


def _same(a, b):
    assert a.dtype == b.dtype and torch.equal(a, b), (a, b)


@pytest.mark.parametrize("T,E,k", [(1, 16, 4), (2, 12, 3), (3, 8, 2), (1, 8, 1)])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("topk", list(TOPK))
def test_gemv_routing_is_the_routing_kernels(T, E, k, norm, topk):
    """Random logits (fp32: no two equal): the GEMVs' ids, order and weights are the routing kernel's, bit for bit,
    and torch's experts; the output is the chain's, bit for bit, and the reference's. Expert counts that are not
    powers of two, top-1 (slots padded to 2) to top-4."""
    dtype = torch.float32
    x, gate, gate_up, down = _case(T, E, 48, 40, dtype, DEVICE, seed=T * 100 + E)
    (w, ids, y), (w2, ids2, y2, logits) = _both(x, gate, gate_up, down, k, norm, False, TOPK[topk])
    _same(ids2, ids)
    _same(w2, w)
    _same(y2, y)
    want_w, want_ids = route(logits.cpu(), MoESpec(E, k, 40, norm_topk_prob=norm))
    assert ids2.cpu().tolist() == want_ids.tolist()
    torch.testing.assert_close(w2.cpu(), want_w, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y2, experts_reference(x, w2, ids2, gate_up, down), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("topk", list(TOPK))
def test_ties_take_the_lower_expert_index(topk):
    """Duplicated router rows (each logit twice): the routing kernel's choice (the lower index of a tied pair first,
    both members of a pair where k reaches it), the same probabilities torch.topk picks."""
    x, gate, gate_up, down = _case(2, 16, 48, 40, torch.float32, DEVICE, seed=3, ties=True)
    (w, ids, y), (w2, ids2, y2, logits) = _both(x, gate, gate_up, down, 5, True, False, TOPK[topk])
    _same(ids2, ids)
    _same(w2, w)
    _same(y2, y)
    for row in ids2.cpu().tolist():  # a tied pair (2i, 2i + 1) comes in that order, and a lone member is the lower
        for a, b in zip(row, row[1:]):
            if a // 2 == b // 2:
                assert a < b, row
        assert row[-1] % 2 == 0 or row[-2] == row[-1] - 1, row
    probs = torch.softmax(logits.cpu().float(), -1)
    _, want_ids = route(logits.cpu(), MoESpec(16, 5, 40, norm_topk_prob=True))
    assert torch.equal(probs.gather(1, ids2.cpu()), probs.gather(1, want_ids))


@pytest.mark.skipif(not INTERPRET, reason="interpreter case (fp16 / fp32 weights; bf16 on CUDA below)")
@pytest.mark.parametrize("fp32_weights", [False, True])
def test_model_dtype_logits_and_weights(fp32_weights):
    """fp16 logits and experts: the routing weights rounded to fp16 (or kept fp32, Mixtral) where the down GEMV
    applies them, as the routing kernel stores them."""
    x, gate, gate_up, down = _case(2, 16, 48, 40, torch.float16, DEVICE, seed=11)
    (w, ids, y), (w2, ids2, y2, _) = _both(x, gate, gate_up, down, 4, True, fp32_weights, SMALL)
    assert w2.dtype == (torch.float32 if fp32_weights else torch.float16)
    _same(ids2, ids)
    _same(w2, w)
    _same(y2, y)


def test_fp8_experts():
    """e4m3 experts with a scale per row and 128 columns (H = 200, I = 136: two groups, the second partly filled)."""
    x, gate, gate_up, down = _case(1, 16, 200, 136, torch.float32, DEVICE, seed=5)
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    scales = dict(gate_up_scale=gs, down_scale=ds)
    (w, ids, y), (w2, ids2, y2, _) = _both(x, gate, gq, dq, 4, True, False, SMALL, scales)
    _same(ids2, ids)
    _same(w2, w)
    _same(y2, y)
    ref = experts_reference(x, w2, ids2, dequantize_fp8_blockwise(gq, gs, x.dtype),
                            dequantize_fp8_blockwise(dq, ds, x.dtype))
    torch.testing.assert_close(y2, ref, rtol=1e-5, atol=1e-5)


def test_a_step_the_gemvs_do_not_take_routes_first():
    """The sorted path (moe_decode_pairs 0) and the K-looped decode kernels get the PendingRoute resolved by the
    routing kernel: the chain's output."""
    x, gate, gate_up, down = _case(3, 8, 48, 40, torch.float32, DEVICE, seed=9)
    for cfg in (dataclasses.replace(SMALL, moe_decode_pairs=0, moe_block_m=16, moe_block_n=16, moe_block_k=32,
                                    moe_stages=1),
                dataclasses.replace(SMALL, moe_decode_gemv=False, moe_decode_block_k=32, moe_decode_down_block_k=32,
                                    moe_decode_stages=1)):
        (w, ids, y), (_, _, y2, _) = _both(x, gate, gate_up, down, 2, True, False, cfg)
        torch.testing.assert_close(y2, y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] if INTERPRET else [torch.bfloat16], ids=str)
def test_router_logits_with_add_norm(dtype):
    """moe_router_logits with the add + RMSNorm prologue: the normalized rows, the new residual and the logits are
    moe_router_route_norm's (the same kernel but for its routing), h and the residual unchanged."""
    from model_wrapper.kernels.moe_route import moe_router_route_norm

    g = torch.Generator().manual_seed(2)
    T, E, H = 1, 16, 96
    h, r = (torch.randn(T, H, generator=g).to(DEVICE, dtype) for _ in range(2))
    nw = (1 + 0.1 * torch.randn(H, generator=g)).to(DEVICE, dtype)
    gate = (torch.randn(E, H, generator=g) / H**0.5).to(DEVICE, dtype)
    h0, r0 = h.clone(), r.clone()
    r_out, r_out2 = torch.empty_like(r), torch.empty_like(r)
    w, ids, xn = moe_router_route_norm(h, gate, 4, True, False, (r, nw, 1e-6, r_out), SMALL)
    pending, xn2 = moe_router_logits(h, gate, 4, True, False, SMALL, (r, nw, 1e-6, r_out2))
    _same(xn2, xn)
    _same(r_out2, r_out)
    assert torch.equal(h, h0) and torch.equal(r, r0)
    want_w, want_ids = route(pending.logits.cpu(), MoESpec(E, 4, 8, norm_topk_prob=True))
    assert ids.cpu().tolist() == want_ids.tolist()
    rw, rids = pending.resolve(SMALL)
    _same(rids, ids)
    _same(rw, w)
    with pytest.raises(ValueError, match=r"moe_router_logits: residual must be a \[T, H\]"):
        moe_router_logits(h, gate, 4, True, False, SMALL, (torch.zeros(2, H, device=DEVICE, dtype=dtype), nw, 1e-6,
                                                            r_out2))


# CUDA: Qwen3-30B-A3B's expert shape, the default configuration with the switch on and off
@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("experts", ["bf16", "fp8"])
def test_switch_on_is_bit_equal_at_qwen3_shape_cuda(T, experts):
    """The default config's chain against the switch on, at 1 and 2 tokens, bf16 and FP8 experts (FP8 at 2 tokens
    takes the sorted path: routed first), eagerly and in a CUDA graph replayed on new inputs (with PDL)."""
    H, inter, E, k = 2048, 768, 128, 8
    g = torch.Generator(device="cuda").manual_seed(T)
    gate = torch.randn(E, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    gate_up = torch.randn(E, 2 * inter, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    down = torch.randn(E, H, inter, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    scales = {}
    if experts == "fp8":
        (gate_up, gs), (down, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
        scales = dict(gate_up_scale=gs, down_scale=ds)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
    off, on = KernelConfig(), KernelConfig(moe_gemv_route=True)

    def chain_off(x):
        w, ids, _ = moe_router_route(x, gate, k, True, False, off)
        return w, ids, fused_moe(x, w, ids, gate_up, down, off, **scales)

    def chain_on(x):
        pending, _ = moe_router_logits(x, gate, k, True, False, on)
        return pending.weights, pending.ids, fused_moe(x, pending, None, gate_up, down, on, **scales)

    takes_gemv = experts == "bf16" or T == 1
    for _ in range(3):
        x.copy_(torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g))
        a, b = chain_off(x), chain_on(x)
        _same(b[2], a[2])
        if takes_gemv:
            _same(b[1], a[1])
            _same(b[0], a[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain_on(x)
    for _ in range(10):
        x.copy_(torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g))
        graph.replay()
        want = chain_off(x.clone())
        _same(out[2], want[2])
        if takes_gemv:
            _same(out[1], want[1])
            _same(out[0], want[0])
