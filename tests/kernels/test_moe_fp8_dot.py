"""FP8 experts' decode GEMVs with their products on the tensor cores (kernels/moe_fp8_dot.py: KernelConfig.moe_fp8_dot
for gate_up, moe_fp8_dot_down for down and the k-sum after it) against moe_gemv.py's FMA GEMVs and the reference
experts on the dequantized weights, under Triton's interpreter (fp32 / fp16) and on CUDA (bf16, marked cuda). The
product of two values of the dtype is exact in fp32, so only the order of the fp32 sums differs from the FMA GEMVs:
within fp32 rounding before the rounding to the dtype. H = 200 and I = 136 (two 128-column scale groups, the second
partly filled; chunks of 128 columns) in the interpreter; the Qwen3-30B-A3B shape on CUDA, PDL on and off, graph
replay on new routings."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")
from triton_interpret import INTERPRET, on_cuda_skip  # noqa: E402  (sets the interpreter up before the kernels import)
from conftest import dequantize_fp8_blockwise, quantize_fp8_blockwise  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import fused_moe  # noqa: E402
from model_wrapper.kernels.moe_gemv import moe_gemv  # noqa: E402
from model_wrapper.layers.moe import MoESpec, experts_reference, route  # noqa: E402

interpreter_only = pytest.mark.skipif(not INTERPRET, reason="interpreter case")


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


def _cuda_close(got, x, w, ids, gate_up, down):
    """Bounded by the reference's own bf16 error against float64, with slack for the fp32 sums."""
    ref = experts_reference(x, w, ids, gate_up, down)
    exact = experts_reference(x.double(), w.double(), ids, gate_up.double(), down.double())
    err, ref_err = (got.double() - exact).abs().max(), (ref.double() - exact).abs().max()
    assert err <= 2 * ref_err + 1e-3, (err, ref_err)


FMA = KernelConfig(moe_decode_pairs=1 << 20, moe_fp8_decode_pairs=1 << 20, moe_decode_pairs_per_expert=1 << 20,
                   moe_fp8_gemv_tile=1024, moe_fp8_gemv_down_tile=4096)
SMALL = dict(moe_fp8_dot_block_n=32, moe_fp8_dot_block_k=128, moe_fp8_dot_down_block_n=32,
             moe_fp8_dot_down_block_k=128)
DOTS = {"gate_up": dataclasses.replace(FMA, moe_fp8_dot=True, **SMALL),
        "down": dataclasses.replace(FMA, moe_fp8_dot_down=True, **SMALL),
        "both": dataclasses.replace(FMA, moe_fp8_dot=True, moe_fp8_dot_down=True, **SMALL),
        "both-swap": dataclasses.replace(FMA, moe_fp8_dot=True, moe_fp8_dot_down=True, moe_fp8_dot_swap=True, **SMALL)}


def _fp8(x, w, ids, gate_up, down):
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    ref = experts_reference(x, w, ids, dequantize_fp8_blockwise(gq, gs, x.dtype),
                            dequantize_fp8_blockwise(dq, ds, x.dtype))
    return (gq, gs, dq, ds), ref


@interpreter_only
@pytest.mark.parametrize("which", list(DOTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("T,k,routing", [(1, 2, "random"), (3, 3, "random"), (2, 2, "ties")])
def test_fp8_gemvs_on_tensor_cores_match_the_fma_gemvs(which, dtype, T, k, routing):
    x, w, ids, gate_up, down = _case(T, 8, k, 200, 136, dtype, "cpu", routing)
    (gq, gs, dq, ds), ref = _fp8(x, w, ids, gate_up, down)
    got = moe_gemv(x, w, ids, gq, dq, DOTS[which], gate_up_scale=gs, down_scale=ds)
    assert got.dtype == dtype and got.shape == x.shape
    _close(got, moe_gemv(x, w, ids, gq, dq, FMA, gate_up_scale=gs, down_scale=ds), dtype)
    _close(got, ref, dtype)


CUDA_DOTS = {"both": dataclasses.replace(FMA, moe_fp8_dot=True, moe_fp8_dot_down=True),
             "both-no-pdl": dataclasses.replace(FMA, moe_fp8_dot=True, moe_fp8_dot_down=True, pdl=False),
             "gate_up-64x128": dataclasses.replace(FMA, moe_fp8_dot=True, moe_fp8_dot_block_n=64,
                                                   moe_fp8_dot_block_k=128),
             "down-64": dataclasses.replace(FMA, moe_fp8_dot_down=True, moe_fp8_dot_down_block_n=64),
             # Triton's one-value rounding of the dequantized weights instead of the packed one
             "both-unpacked": dataclasses.replace(FMA, moe_fp8_dot=True, moe_fp8_dot_down=True,
                                                  moe_fp8_packed_round=False),
             # the weights as the mma's first operand
             "both-swap": dataclasses.replace(FMA, moe_fp8_dot=True, moe_fp8_dot_down=True, moe_fp8_dot_swap=True),
             "both-swap-unpacked": dataclasses.replace(FMA, moe_fp8_dot=True, moe_fp8_dot_down=True,
                                                       moe_fp8_dot_swap=True, moe_fp8_packed_round=False)}


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("path", list(CUDA_DOTS))
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("E,k,H,inter", [(128, 8, 2048, 768), (64, 8, 384, 200)])
def test_fp8_gemvs_on_tensor_cores_cuda(path, T, E, k, H, inter):
    x, w, ids, gate_up, down = _case(T, E, k, H, inter, torch.bfloat16, "cuda")
    (gq, gs, dq, ds), _ = _fp8(x, w, ids, gate_up, down)
    got = fused_moe(x, w, ids, gq, dq, CUDA_DOTS[path], gate_up_scale=gs, down_scale=ds)
    _cuda_close(got, x, w, ids, dequantize_fp8_blockwise(gq, gs, x.dtype), dequantize_fp8_blockwise(dq, ds, x.dtype))


@pytest.mark.cuda
@on_cuda_skip
def test_fp8_dots_graph_replay_follows_new_routing_cuda():
    """Captured once in a CUDA graph (PDL on) and replayed on other routings: what eager calls without PDL give,
    bit for bit."""
    x, w, ids, gate_up, down = _case(1, 128, 8, 2048, 768, torch.bfloat16, "cuda")
    (gq, gs, dq, ds), _ = _fp8(x, w, ids, gate_up, down)
    cfg = CUDA_DOTS["both"]
    fused_moe(x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds)
    for seed, routing in ((1, "random"), (2, "ties"), (3, "random")):
        x2, w2, ids2, _, _ = _case(1, 128, 8, 2048, 768, torch.bfloat16, "cuda", routing, seed)
        x.copy_(x2), w.copy_(w2), ids.copy_(ids2)
        graph.replay()
        want = fused_moe(x2, w2, ids2, gq, dq, dataclasses.replace(cfg, pdl=False), gate_up_scale=gs, down_scale=ds)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
