"""The one-kernel expert chain of a decode step (kernels/moe_chain.py: gate_up -> SiLU -> down per group of
intermediate rows, fp32 partials, their sum) against the two-kernel path it replaces (kernels/moe_gemv.py) and the
reference experts (layers/moe.experts_reference), under Triton's interpreter (fp32 / fp16) and on CUDA (bf16, marked
cuda). Only down's fp32 sum runs in another order than in the two-kernel path, so the two agree within fp32
rounding before the one rounding to the model dtype. Shapes: hidden not a power of two (padded), intermediate
sizes whose last group of rows is partly filled, top-1 to top-8, one and several tokens (moe_chain_max_tokens),
routing ties (every token on the same experts), FP8 experts (e4m3 with per-row, 128-column scales) against the
reference on the dequantized weights; on CUDA the Qwen3-30B-A3B shape, PDL on and off, graph replay on new
routings."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")
from triton_interpret import INTERPRET, on_cuda_skip  # noqa: E402  (sets the interpreter up before the kernels import)
from conftest import dequantize_fp8_blockwise, quantize_fp8_blockwise  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import fused_moe  # noqa: E402
from model_wrapper.kernels.moe_chain import chain_fits, moe_chain  # noqa: E402
from model_wrapper.kernels.moe_gemv import moe_gemv  # noqa: E402
from model_wrapper.layers.moe import MoESpec, experts_reference, route  # noqa: E402

interpreter_only = pytest.mark.skipif(not INTERPRET, reason="interpreter case")
# the chain at up to 4 tokens, groups of 16 rows in loop steps of 4 (bf16) / 8 (FP8); the two-kernel GEMVs with
# small tiles as the A/B arm
CHAIN = KernelConfig(moe_chain=True, moe_chain_max_tokens=4, moe_chain_rows=16, moe_chain_block=4,
                     moe_fp8_chain_block=8, moe_decode_pairs=1 << 20, moe_fp8_decode_pairs=1 << 20,
                     moe_decode_pairs_per_expert=1 << 20)
GEMV = dataclasses.replace(CHAIN, moe_chain=False, moe_gemv_tile=1024, moe_gemv_down_tile=4096,
                           moe_fp8_gemv_tile=1024, moe_fp8_gemv_down_tile=4096)


def _case(T, E, k, H, inter, dtype, device, routing="random", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype).to(device)
    gate_up = (torch.randn(E, 2 * inter, H, generator=g) * H ** -0.5).to(dtype).to(device)
    down = (torch.randn(E, H, inter, generator=g) * inter ** -0.5).to(dtype).to(device)
    logits = torch.randn(T, E, generator=g).to(dtype).to(device)
    if routing == "ties":  # equal logits: every token picks the same experts
        logits.zero_()
    weights, ids = route(logits, MoESpec(E, k, inter, norm_topk_prob=True))
    return x, weights, ids, gate_up, down


def _close(got, want, dtype):
    """Within fp32 rounding of down's sum, then one rounding of the dtype (fp32: 1e-5 relative)."""
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_chain_fits_only_where_switched_on():
    cfg = dataclasses.replace(KernelConfig(), moe_chain=True)
    assert chain_fits(1, 2048, 768, 8, cfg) and chain_fits(1, 2048, 768, 8, cfg, fp8=True)
    assert not chain_fits(2, 2048, 768, 8, cfg)  # moe_chain_max_tokens 1
    assert not chain_fits(1, 2048, 768, 8, KernelConfig())  # off by default
    assert not chain_fits(1, 2048, 768, 8, dataclasses.replace(cfg, moe_chain_rows=12))  # not a power of 2
    assert not chain_fits(1, 2048, 768, 8, dataclasses.replace(cfg, moe_chain_rows=256), fp8=True)  # > a scale group
    assert not chain_fits(1, 8192, 768, 8, cfg)  # gate + up rows past the tile


@interpreter_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("T,E,k,H,inter,routing", [(1, 8, 2, 48, 40, "random"), (1, 16, 8, 200, 136, "random"),
                                                   (3, 8, 3, 96, 64, "random"), (2, 8, 2, 64, 24, "ties")])
def test_chain_matches_the_two_kernel_gemvs_and_the_reference(dtype, T, E, k, H, inter, routing):
    x, w, ids, gate_up, down = _case(T, E, k, H, inter, dtype, "cpu", routing)
    assert chain_fits(T, H, inter, k, CHAIN)
    got = moe_chain(x, w, ids, gate_up, down, CHAIN)
    assert got.dtype == dtype and got.shape == (T, H)
    _close(got, moe_gemv(x, w, ids, gate_up, down, GEMV), dtype)
    _close(got, experts_reference(x, w, ids, gate_up, down), dtype)
    torch.testing.assert_close(fused_moe(x, w, ids, gate_up, down, CHAIN), got, rtol=0, atol=0)  # the dispatch


@interpreter_only
@pytest.mark.parametrize("T,k,routing", [(1, 2, "random"), (3, 3, "random"), (2, 2, "ties")])
def test_fp8_chain_matches_the_reference_on_dequantized_weights(T, k, routing):
    """H = 200 and I = 136: two scale groups of gate_up's rows (the second partly filled); down's columns in
    groups of 16 rows, each inside one 128-column scale group."""
    x, w, ids, gate_up, down = _case(T, 8, k, 200, 136, torch.float32, "cpu", routing)
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    got = moe_chain(x, w, ids, gq, dq, CHAIN, gate_up_scale=gs, down_scale=ds)
    ref = experts_reference(x, w, ids, dequantize_fp8_blockwise(gq, gs, x.dtype),
                            dequantize_fp8_blockwise(dq, ds, x.dtype))
    _close(got, ref, torch.float32)
    _close(got, moe_gemv(x, w, ids, gq, dq, GEMV, gate_up_scale=gs, down_scale=ds), torch.float32)


def _cuda_close(got, x, w, ids, gate_up, down):
    """Bounded by the reference's own bf16 error against float64, with slack for the fp32 sums."""
    ref = experts_reference(x, w, ids, gate_up, down)
    exact = experts_reference(x.double(), w.double(), ids, gate_up.double(), down.double())
    err, ref_err = (got.double() - exact).abs().max(), (ref.double() - exact).abs().max()
    assert err <= 2 * ref_err + 1e-3, (err, ref_err)


CUDA_CHAIN = {"chain": dataclasses.replace(CHAIN, moe_chain_block=KernelConfig().moe_chain_block,
                                           moe_fp8_chain_block=KernelConfig().moe_fp8_chain_block),
              "chain-no-pdl": dataclasses.replace(CHAIN, pdl=False)}


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("path", list(CUDA_CHAIN))
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("E,k,H,inter", [(8, 2, 256, 128), (128, 8, 2048, 768), (64, 8, 384, 200)])
def test_chain_matches_reference_cuda(path, T, E, k, H, inter):
    cfg = CUDA_CHAIN[path]
    x, w, ids, gate_up, down = _case(T, E, k, H, inter, torch.bfloat16, "cuda")
    got = fused_moe(x, w, ids, gate_up, down, cfg)
    _cuda_close(got, x, w, ids, gate_up, down)
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    got = fused_moe(x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds)
    _cuda_close(got, x, w, ids, dequantize_fp8_blockwise(gq, gs, x.dtype), dequantize_fp8_blockwise(dq, ds, x.dtype))


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_chain_graph_replay_follows_new_routing_cuda(fp8):
    """Captured once in a CUDA graph (PDL on) and replayed on other routings: what eager calls without PDL give,
    bit for bit (the reduction order does not depend on the scheduling)."""
    x, w, ids, gate_up, down = _case(1, 128, 8, 2048, 768, torch.bfloat16, "cuda")
    scales = {}
    if fp8:
        (gate_up, gs), (down, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
        scales = dict(gate_up_scale=gs, down_scale=ds)
    cfg = CUDA_CHAIN["chain"]
    fused_moe(x, w, ids, gate_up, down, cfg, **scales)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w, ids, gate_up, down, cfg, **scales)
    for seed, routing in ((1, "random"), (2, "ties"), (3, "random")):
        x2, w2, ids2, _, _ = _case(1, 128, 8, 2048, 768, torch.bfloat16, "cuda", routing, seed)
        x.copy_(x2), w.copy_(w2), ids.copy_(ids2)
        graph.replay()
        want = fused_moe(x2, w2, ids2, gate_up, down, dataclasses.replace(cfg, pdl=False), **scales)
        torch.testing.assert_close(out, want, rtol=0, atol=0)

