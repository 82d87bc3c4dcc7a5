"""The fused MoE kernels (model_wrapper/kernels/moe*.py) against the reference experts (layers/moe.py).

Under Triton's interpreter on the CPU (fp32: the interpreter mishandles bf16 dots) and on CUDA in bf16
(marked cuda). The paths of fused_moe are forced in turn through KernelConfig: the decode path (a GEMV
per token-expert pair, no sort: the register-tile kernels of moe_gemv.py or the K-looped ones of
moe_decode.py) and the sorted path (moe_align, fused or torch ops, then grouped GEMMs and the k-sum). On
CUDA also with PDL off, and the router GEMV -> routing kernel -> experts chain replayed in a graph.
Token counts cover one token, a few, a block's worth and more; expert counts and top-k vary, with experts
that receive no token, routing ties (every token routed to the same experts) and FP8 experts (e4m3 with
per-row, 128-column scales) checked against the reference on weights dequantized here, group by group.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")
from triton_interpret import INTERPRET, on_cuda_skip  # noqa: E402  (sets the interpreter up before the kernels import)
from conftest import dequantize_fp8_blockwise, quantize_fp8_blockwise  # noqa: E402
from moe_w8a8_oracle import w8a8_check, w8a8_experts_reference  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import fused_moe, takes_decode_path  # noqa: E402
from model_wrapper.kernels.moe_align import moe_align, moe_align_reference  # noqa: E402
from model_wrapper.layers.kernels import TorchKernels  # noqa: E402
from model_wrapper.layers.moe import MoESpec, dequantize_experts, experts_reference, route  # noqa: E402

interpreter_only = pytest.mark.skipif(not INTERPRET, reason="interpreter case")
# small tiles, so that the interpreter's tiny shapes span several programs and K steps
DECODE_LOOP = KernelConfig(moe_decode_pairs=1 << 20, moe_fp8_decode_pairs=1 << 20, moe_decode_pairs_per_expert=1 << 20,
                           moe_decode_block_n=16,
                           moe_decode_block_k=32, moe_decode_down_block_n=8, moe_decode_down_block_k=32,
                           moe_decode_stages=1, moe_decode_gemv=False)
# the register-tile GEMVs (kernels/moe_gemv.py): H = 48 and I = 40 pad to 64, 256 weights a tile: 2 gate_up
# columns a program, 2 or 4 down rows of each of the token's k experts
DECODE = dataclasses.replace(DECODE_LOOP, moe_decode_gemv=True, moe_gemv_tile=256, moe_gemv_down_tile=512)
SORTED = KernelConfig(moe_decode_pairs=0, moe_block_m=16, moe_block_n=16, moe_block_k=32, moe_stages=1,
                      moe_small_pairs=40, moe_large_block_m=32, moe_large_block_n=16, moe_large_block_k=32,
                      moe_large_stages=1, moe_align_chunk=32, moe_fp8_w8a8=False)  # (FP8 experts: weight-only)
SORTED_TORCH_ALIGN = dataclasses.replace(SORTED, moe_fused_align=False)


def _case(T, E, k, H, inter, dtype, device, routing="random", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype).to(device)
    gate_up = (torch.randn(E, 2 * inter, H, generator=g) * H ** -0.5).to(dtype).to(device)
    down = (torch.randn(E, H, inter, generator=g) * inter ** -0.5).to(dtype).to(device)
    logits = torch.randn(T, E, generator=g).to(dtype).to(device)
    if routing == "skew":  # every token prefers the same experts: the others receive nothing
        logits[:, :k] += 20.0
    elif routing == "ties":  # equal logits: top-k breaks the ties, every token picks the same experts
        logits.zero_()
    weights, ids = route(logits, MoESpec(E, k, inter, norm_topk_prob=True))
    return x, weights, ids, gate_up, down


def _expected_align(ids: torch.Tensor, E: int, bm: int):
    """moe_align's result, built with Python lists: each expert's pairs in ascending order, padded to bm."""
    flat = ids.reshape(-1).tolist()
    P = len(flat)
    pairs, block_expert = [], []
    for e in range(E):
        run = [p for p, x in enumerate(flat) if x == e]
        run += [P] * (-len(run) % bm)
        pairs += run
        block_expert += [e] * (len(run) // bm)
    rows = P + min(E, P) * (bm - 1)
    rows = -(-rows // bm) * bm
    return pairs + [P] * (rows - len(pairs)), block_expert + [E] * (rows // bm - len(block_expert))


@pytest.mark.parametrize("align", [moe_align, moe_align_reference], ids=["fused", "torch"])
def test_align_groups_pairs_by_expert_and_pads_blocks(align):
    ids = torch.tensor([[3, 0], [0, 2], [3, 1], [0, 3]])
    pairs, block_expert = align(ids, 5, 4)
    P = ids.numel()
    rows = pairs.tolist()
    # expert 0: pairs 1, 2, 6 (ids[0,1], ids[1,0], ids[3,0]); 1: 5; 2: 3; 3: 0, 4, 7; 4: none
    assert rows[:4] == [1, 2, 6, P] and rows[4:8] == [5, P, P, P] and rows[8:12] == [3, P, P, P]
    assert rows[12:16] == [0, 4, 7, P] and all(r == P for r in rows[16:])
    assert block_expert.tolist()[:4] == [0, 1, 2, 3] and all(e == 5 for e in block_expert.tolist()[4:])


@interpreter_only
@pytest.mark.parametrize("T,E,k,bm,chunk,routing", [
    (1, 8, 2, 16, 128, "random"), (3, 8, 3, 4, 4, "random"), (16, 6, 2, 8, 8, "skew"), (257, 16, 4, 16, 32, "random"),
    (100, 128, 8, 16, 64, "random"), (33, 300, 6, 16, 16, "ties"), (40, 5, 1, 8, 8, "ties")])
def test_fused_align_matches_the_list_built_sort(T, E, k, bm, chunk, routing):
    """The two-kernel align over chunks smaller and larger than the step, expert counts that are not
    powers of two (up to 300), experts with no pair and all pairs on a few experts."""
    _, _, ids, _, _ = _case(T, E, k, 4, 4, torch.float32, "cpu", routing)
    pairs, block_expert = moe_align(ids, E, bm, chunk)
    want_pairs, want_blocks = _expected_align(ids, E, bm)
    assert pairs.dtype == block_expert.dtype == torch.int32
    assert pairs.tolist() == want_pairs and block_expert.tolist() == want_blocks


def test_the_decode_path_takes_few_pairs_on_many_experts():
    """Default bounds: Qwen3-30B-A3B's decode (128 experts, top-8) up to 4 tokens, Mixtral's (8 experts,
    top-2) up to 4; the config's switches move them, 0 turns the path off."""
    cfg = KernelConfig()
    assert takes_decode_path(8, 128, cfg) and takes_decode_path(32, 128, cfg) and not takes_decode_path(40, 128, cfg)
    assert takes_decode_path(8, 8, cfg) and not takes_decode_path(10, 8, cfg)
    assert takes_decode_path(16, 8, dataclasses.replace(cfg, moe_decode_pairs_per_expert=2))
    assert not takes_decode_path(1, 128, dataclasses.replace(cfg, moe_decode_pairs=0))
    assert takes_decode_path(4 * 16, 4, DECODE) and not takes_decode_path(4 * 16, 4, SORTED)
    # FP8 experts: as bf16, up to four Qwen3-30B-A3B tokens (moe_fp8_decode_pairs; the sort beyond)
    assert takes_decode_path(32, 128, cfg, fp8=True) and not takes_decode_path(40, 128, cfg, fp8=True)


CASES = [(1, 8, 2, "random"), (4, 8, 1, "random"), (3, 8, 3, "random"), (16, 4, 2, "random"), (16, 32, 2, "skew"),
         (5, 8, 2, "ties")]


@interpreter_only
@pytest.mark.parametrize("cfg", [DECODE, DECODE_LOOP, SORTED, SORTED_TORCH_ALIGN],
                         ids=["decode-gemv", "decode-loop", "sorted", "sorted-torch-align"])
@pytest.mark.parametrize("T,E,k,routing", CASES + [(257, 16, 4, "random")])
def test_fused_moe_matches_reference_interpreter(cfg, T, E, k, routing):
    if cfg in (DECODE, DECODE_LOOP) and T == 257:
        pytest.skip("the decode path is for a few pairs (the interpreter takes minutes here)")
    x, w, ids, gate_up, down = _case(T, E, k, 48, 40, torch.float32, "cpu", routing)
    got = fused_moe(x, w, ids, gate_up, down, cfg)
    ref = experts_reference(x, w, ids, gate_up, down)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@interpreter_only
@pytest.mark.parametrize("T,E,k,routing", [(5, 8, 2, "random"), (21, 8, 2, "skew"), (257, 16, 4, "random")])
def test_fused_moe_with_tma_weight_tiles_matches_reference_interpreter(T, E, k, routing, monkeypatch):
    """The grouped GEMMs' weight tiles through tensor descriptors (KernelConfig.moe_tma_weights and
    moe_tma_small_weights; Hopper only, so the device check is patched): I = 40 is not a multiple of the 16-row
    tiles (the last tile reads the next expert's rows, or past the tensor, and stores none of them) and H = 48
    not of the 32-column K steps (the descriptor's zeros past K). Every launch took descriptors (logged)."""
    from model_wrapper.kernels import moe

    made = []
    real = moe.weight_descriptor
    monkeypatch.setattr(moe, "sm90", lambda device: True)
    monkeypatch.setattr(moe, "weight_descriptor", lambda *a: made.append(a[1:]) or real(*a))
    cfg = dataclasses.replace(SORTED, moe_tma_weights=True, moe_tma_small_weights=True)
    x, w, ids, gate_up, down = _case(T, E, k, 48, 40, torch.float32, "cpu", routing)
    got = fused_moe(x, w, ids, gate_up, down, cfg)
    assert made == [(16, 32), (16, 32)]  # the small tiles' [BLOCK_N, BLOCK_K] (SORTED's)
    torch.testing.assert_close(got, experts_reference(x, w, ids, gate_up, down), rtol=1e-5, atol=1e-5)


# the FP8 cases' wider rows in fewer, larger tiles (the interpreter's time grows with the programs); FP8
# tiles span twice the configured columns: 64 (inside one 128-column group) and 256 (two groups a tile)
DECODE_FP8 = dataclasses.replace(DECODE_LOOP, moe_decode_block_n=64, moe_decode_block_k=32,
                                 moe_decode_down_block_n=32, moe_decode_down_block_k=32)
DECODE_FP8_WIDE = dataclasses.replace(DECODE_FP8, moe_decode_block_k=128, moe_decode_down_block_k=128)
# register tiles: rows of H = 200 and I = 136 pad to 256 (two groups, the second partly filled); two gate_up
# columns and two rows of each down a program
# (the tiles dequantized to the model dtype: moe_fp8_direct off)
DECODE_FP8_GEMV = dataclasses.replace(DECODE, moe_fp8_direct=False, moe_fp8_gemv_tile=1024, moe_fp8_gemv_down_tile=2048)
# the same with the e4m3 tiles kept in registers and each group's sum scaled (KernelConfig.moe_fp8_direct, the
# default); and H, I under one group (KP <= 128: a scale a row) below
DECODE_FP8_DIRECT = dataclasses.replace(DECODE, moe_fp8_direct=True, moe_fp8_direct_tile=1024,
                                        moe_fp8_direct_down_tile=2048)
# and at other warp counts (moe_gemv_warps at 1 token, moe_fp8_direct_multi_warps beyond)
DECODE_FP8_DIRECT_WARPS = dataclasses.replace(DECODE_FP8_DIRECT, moe_gemv_warps=2, moe_fp8_direct_multi_warps=1)


@interpreter_only
@pytest.mark.parametrize("cfg,H,I", [(DECODE_FP8, 200, 136), (DECODE_FP8_WIDE, 200, 136), (DECODE_FP8_GEMV, 200, 136),
                                     (SORTED, 200, 136), (DECODE_FP8_DIRECT, 200, 136), (DECODE_FP8_DIRECT, 96, 40),
                                     (DECODE_FP8_DIRECT_WARPS, 200, 136), (DECODE_FP8_DIRECT_WARPS, 96, 40)],
                         ids=["decode", "decode-wide", "decode-gemv", "sorted", "decode-direct", "decode-direct-1g",
                              "decode-direct-warps", "decode-direct-warps-1g"])
@pytest.mark.parametrize("T,E,k,routing", [(1, 8, 2, "random"), (3, 8, 3, "skew"), (6, 4, 2, "ties")])
def test_fp8_experts_match_reference_on_dequantized_weights_interpreter(cfg, H, I, T, E, k, routing):
    """H = 200 and I = 136: two scale groups each, the second partly filled (H = 96, I = 40: one group a row)."""
    x, w, ids, gate_up, down = _case(T, E, k, H, I, torch.float32, "cpu", routing)
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    got = fused_moe(x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds)
    ref = experts_reference(x, w, ids, dequantize_fp8_blockwise(gq, gs, x.dtype),
                            dequantize_fp8_blockwise(dq, ds, x.dtype))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


W8A8_SORTED = dataclasses.replace(SORTED, moe_fp8_w8a8=True, moe_w8a8_large_block_m=32, moe_w8a8_large_block_n=16,
                                  moe_w8a8_large_stages=1, moe_w8a8_swap=False)  # (swapped small tiles: below)


@interpreter_only
@pytest.mark.parametrize("T,E,k,routing", [(3, 8, 3, "skew"), (6, 4, 2, "ties"), (21, 8, 2, "random")])
def test_fp8_experts_w8a8_are_the_products_of_quantized_activations_interpreter(T, E, k, routing):
    """KernelConfig.moe_fp8_w8a8: the sorted path's grouped GEMMs multiply e4m3 activations (x per token, gate_up's
    output per pair, 128 columns a scale) by the e4m3 experts, one product per 128 columns. H = 200 and
    I = 136: two groups each, the second partly filled; 21 tokens x 2 (42 pairs > moe_small_pairs): the
    prefill tiles. Against the float64 products of the same quantized operands
    (moe_w8a8_oracle.w8a8_experts_reference); an activation that rounds across an e4m3 boundary in one sum
    order and not the other moves an output by well under 1e-2 of its largest entry, a wrong scale or group by
    far more."""
    x, w, ids, gate_up, down = _case(T, E, k, 200, 136, torch.float32, "cpu", routing)
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    got = fused_moe(x, w, ids, gq, dq, W8A8_SORTED, gate_up_scale=gs, down_scale=ds)
    want = w8a8_experts_reference(x, w, ids, gq, gs, dq, ds)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-2, err
    weight_only = fused_moe(x, w, ids, gq, dq, SORTED, gate_up_scale=gs, down_scale=ds)
    assert not torch.equal(got, weight_only)  # (the switch took the W8A8 kernels)


@interpreter_only
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("T,E,k,routing", [(3, 8, 3, "skew"), (6, 4, 2, "ties"), (21, 8, 2, "random")])
def test_fp8_experts_w8a8_swapped_products_interpreter(T, E, k, routing, tma, monkeypatch):
    """KernelConfig.moe_w8a8_swap: the W8A8 small tiles (up to moe_small_pairs pairs; 21 x 2 = 42 pairs are past
    it and take the prefill tiles unswapped) multiply W a^T, the weight rows on the M side, against the same float64
    oracle as above. Pointer loads over H = 200, I = 136 (groups partly filled, rows past I); weight tiles through
    tensor descriptors (the device check patched: on Hopper the swapped tiles take them, moe_tma_small_weights or
    not) over H = 256, I = 144 (rows of a multiple of 16 bytes; I's second group 16 columns): the descriptor's
    [BLOCK_N, 128] tiles go to the products as loaded."""
    from model_wrapper.kernels import moe

    H, I = (256, 144) if tma else (200, 136)
    made = []
    if tma:
        real = moe.weight_descriptor
        monkeypatch.setattr(moe, "sm90", lambda device: True)
        monkeypatch.setattr(moe, "weight_descriptor", lambda *a: made.append(a[1:]) or real(*a))
    cfg = dataclasses.replace(W8A8_SORTED, moe_w8a8_swap=True)  # (on Hopper its small tiles take descriptors)
    assert moe.w8a8_swaps(cfg, T * k, True, torch.device("cpu")) == (T * k <= cfg.moe_small_pairs)
    x, w, ids, gate_up, down = _case(T, E, k, H, I, torch.float32, "cpu", routing)
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    got = fused_moe(x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds)
    want = w8a8_experts_reference(x, w, ids, gq, gs, dq, ds)
    err = float((got - want).abs().max() / want.abs().max())
    assert err < 1e-2, err
    assert made == ([(16, 128), (16, 128)] if tma else [])  # (past the small tiles moe_tma_weights: 16-row tiles)


@interpreter_only
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-weights", "w8a8"])
@pytest.mark.parametrize("T,E,k,routing", [(3, 8, 3, "skew"), (21, 8, 2, "random")])
def test_grid_by_column_blocks_first_is_the_same_products_interpreter(T, E, k, routing, fp8):
    """KernelConfig.moe_grid_n_first (the default): the grouped GEMMs' programs numbered column block first compute
    the same tiles, so the output is the pair-block-first grid's bit for bit (small tiles at 3 x 3 pairs, prefill
    tiles at 21 x 2), and the reference's (weight-only: the dequantized experts; W8A8: the float64 oracle)."""
    x, w, ids, gate_up, down = _case(T, E, k, 200, 136, torch.float32, "cpu", routing)
    if fp8:
        (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
        cfg, kw = W8A8_SORTED, dict(gate_up_scale=gs, down_scale=ds)
        ref = w8a8_experts_reference(x, w, ids, gq, gs, dq, ds)
        gate_up, down = gq, dq
    else:
        cfg, kw = SORTED, {}
        ref = experts_reference(x, w, ids, gate_up, down)
    want = fused_moe(x, w, ids, gate_up, down, dataclasses.replace(cfg, moe_grid_n_first=False), **kw)
    got = fused_moe(x, w, ids, gate_up, down, dataclasses.replace(cfg, moe_grid_n_first=True), **kw)
    assert torch.equal(got, want)
    assert float((got - ref).abs().max() / ref.abs().max()) < (1e-2 if fp8 else 1e-5)


def test_grid_n_first_only_where_the_pair_blocks_fit_the_second_grid_dimension():
    """moe.grid_n_first: the pair blocks go to the grid's second dimension (at most 65535) only where they fit it;
    a step of more (about 4M pairs at 64-pair blocks) keeps them in the first, as without the switch."""
    from model_wrapper.kernels import moe

    assert moe.grid_n_first(136, True) and moe.grid_n_first(65535, True)
    assert not moe.grid_n_first(65536, True)
    assert not moe.grid_n_first(136, False)
    assert moe._grid(136, 12, True) == (12, 136) and moe._grid(136, 12, False) == (136, 12)


def test_w8a8_check_tells_the_w8a8_products_from_near_misses():
    """moe_w8a8_oracle.w8a8_check, the CUDA W8A8 tests' rule, on the CPU: the oracle's own values and the
    interpreter's W8A8 kernels pass; the weight-only products (no activation quantization), the oracle with one
    scale group of down's weights doubled, and the kernels' result with a token's rows swapped fail."""
    x, w, ids, gate_up, down = _case(8, 4, 2, 256, 256, torch.float32, "cpu", "random")
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    oracle, _ = w8a8_check(w8a8_experts_reference(x, w, ids, gq, gs, dq, ds), x, w, ids, gq, gs, dq, ds)
    got = fused_moe(x, w, ids, gq, dq, W8A8_SORTED, gate_up_scale=gs, down_scale=ds)
    w8a8_check(got, x, w, ids, gq, gs, dq, ds)
    ds2 = ds.clone()
    ds2[:, :, 1] *= 2
    near_misses = {"weight-only": fused_moe(x, w, ids, gq, dq, SORTED, gate_up_scale=gs, down_scale=ds),
                   "a group's scale": w8a8_experts_reference(x, w, ids, gq, gs, dq, ds2),
                   "rows swapped": got[[1, 0, *range(2, 8)]]}
    for name, wrong in near_misses.items():
        with pytest.raises(AssertionError):
            w8a8_check(wrong, x, w, ids, gq, gs, dq, ds, label=name)


def test_w8a8_small_tiles_swap_on_hopper_only(monkeypatch):
    """moe.w8a8_swaps: the W8A8 small tiles swap on Hopper CUDA devices (the device check patched) and off CUDA
    (the interpreter), not on other GPUs; never past moe_small_pairs, for weight-only experts, or with the switch
    off."""
    from model_wrapper.kernels import moe

    cfg, cuda = KernelConfig(), torch.device("cuda", 0)
    small = cfg.moe_small_pairs
    for hopper in (True, False):
        monkeypatch.setattr(moe, "sm90", lambda device: hopper)
        assert moe.w8a8_swaps(cfg, 256, True, cuda) == hopper
    assert moe.w8a8_swaps(cfg, small, True, torch.device("cpu"))
    assert not moe.w8a8_swaps(cfg, small + 1, True, torch.device("cpu"))
    assert not moe.w8a8_swaps(cfg, 256, False, torch.device("cpu"))
    assert not moe.w8a8_swaps(dataclasses.replace(cfg, moe_w8a8_swap=False), 256, True, torch.device("cpu"))


def test_dequantize_experts_and_torch_kernels_fp8():
    """dequantize_experts against the group-by-group oracle; TorchKernels.moe_experts with scales is the
    reference on those weights; one scale without the other is refused."""
    x, w, ids, gate_up, down = _case(4, 8, 2, 200, 136, torch.float32, "cpu")
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    for dt in (torch.float32, torch.bfloat16):
        assert torch.equal(dequantize_experts(gq, gs, dt), dequantize_fp8_blockwise(gq, gs, dt))
    kern = TorchKernels(torch.ones(4), torch.float32)
    got = kern.moe_experts(x, w, ids, gq, dq, gs, ds)
    ref = experts_reference(x, w, ids, dequantize_fp8_blockwise(gq, gs, x.dtype),
                            dequantize_fp8_blockwise(dq, ds, x.dtype))
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    with pytest.raises(ValueError, match="both gate_up_scale and down_scale"):
        kern.moe_experts(x, w, ids, gq, dq, gs, None)


def _cuda_close(got, x, w, ids, gate_up, down):
    ref = experts_reference(x, w, ids, gate_up, down)
    exact = experts_reference(x.double(), w.double(), ids, gate_up.double(), down.double())
    # bounded by the reference's own bf16 error against float64, with slack for the fp32 final sum
    err, ref_err = (got.double() - exact).abs().max(), (ref.double() - exact).abs().max()
    assert err <= 2 * ref_err + 1e-3, (err, ref_err)


DECODE_CUDA = KernelConfig(moe_decode_pairs=1 << 20, moe_fp8_decode_pairs=1 << 20, moe_decode_pairs_per_expert=1 << 20)
CUDA_PATHS = {"default": KernelConfig(), "decode": DECODE_CUDA,
              "decode-loop": dataclasses.replace(DECODE_CUDA, moe_decode_gemv=False),
              "decode-no-pdl": dataclasses.replace(DECODE_CUDA, pdl=False),
              # the register-tile GEMVs' switches: ptxas's own load order (bf16); FP8 experts' one-value rounding
              # and tiles of the bf16 tiles' bytes (session 33's FP8 GEMVs)
              "decode-interleaved": dataclasses.replace(DECODE_CUDA, moe_gemv_loads_first=False),
              "decode-fp8-s33": dataclasses.replace(DECODE_CUDA, moe_fp8_packed_round=False, moe_fp8_gemv_tile=32768,
                                                    moe_fp8_gemv_down_tile=32768, moe_fp8_direct=False),
              # FP8 experts' tiles dequantized to the model dtype in the GEMVs' registers (moe_fp8_direct off; on: the
              # e4m3 tiles kept, groups scaled after their sums, the default), with tiles of 32k e4m3 weights
              "decode-fp8-dequant": dataclasses.replace(DECODE_CUDA, moe_fp8_direct=False),
              "decode-fp8-direct-32k": dataclasses.replace(DECODE_CUDA, moe_fp8_direct_tile=32768,
                                                           moe_fp8_direct_down_tile=32768),
              # the GEMVs at other warp counts: 4 at 1 token (moe_gemv_warps), 8 beyond (bf16: moe_gemv_multi_warps,
              # FP8 experts: moe_fp8_direct_multi_warps)
              "decode-warps": dataclasses.replace(DECODE_CUDA, moe_gemv_warps=4, moe_gemv_multi_warps=8,
                                                  moe_fp8_direct_multi_warps=8),
              # (FP8 experts: weight-only, against the reference on the dequantized weights; W8A8 has its own tests)
              "sorted": KernelConfig(moe_decode_pairs=0, moe_fp8_w8a8=False),
              "sorted-torch-align": KernelConfig(moe_decode_pairs=0, moe_fused_align=False, moe_fp8_w8a8=False),
              # the align's chunks of moe_align_chunk pairs at decode sizes too (the default there: moe_align_small_chunk)
              "sorted-align128": KernelConfig(moe_decode_pairs=0, moe_fp8_w8a8=False, moe_align_small_chunk=128),
              # the prefill tiles' weights through TMA descriptors (KernelConfig.moe_tma_weights; FP8 experts' rows of
              # 200 e4m3 bytes do not fit one, so there the pointer loads run)
              "sorted-tma": KernelConfig(moe_decode_pairs=0, moe_fp8_w8a8=False, moe_tma_weights=True),
              "sorted-tma-small": KernelConfig(moe_decode_pairs=0, moe_fp8_w8a8=False, moe_tma_small_weights=True)}


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("path", list(CUDA_PATHS))
@pytest.mark.parametrize("T", [1, 3, 16, 257, 4096])
@pytest.mark.parametrize("E,k", [(8, 2), (64, 8), (128, 8)])
def test_fused_moe_matches_reference_cuda(path, T, E, k):
    if path.startswith("decode") and T > 257:
        pytest.skip("the decode path is for a few pairs")
    x, w, ids, gate_up, down = _case(T, E, k, 256, 128, torch.bfloat16, "cuda", "skew" if T == 257 else "random")
    _cuda_close(fused_moe(x, w, ids, gate_up, down, CUDA_PATHS[path]), x, w, ids, gate_up, down)


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("path", ["decode", "decode-fp8-s33", "decode-fp8-dequant", "decode-fp8-direct-32k",
                                  "decode-warps", "decode-loop", "sorted"])
@pytest.mark.parametrize("T", [1, 16, 257, 4096])
def test_fp8_experts_match_reference_cuda(path, T):
    if path.startswith("decode") and T > 257:
        pytest.skip("the decode path is for a few pairs")
    x, w, ids, gate_up, down = _case(T, 64, 8, 384, 200, torch.bfloat16, "cuda", "ties" if T == 16 else "random")
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    got = fused_moe(x, w, ids, gq, dq, CUDA_PATHS[path], gate_up_scale=gs, down_scale=ds)
    _cuda_close(got, x, w, ids, dequantize_fp8_blockwise(gq, gs, x.dtype), dequantize_fp8_blockwise(dq, ds, x.dtype))


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("tma,swap", [(False, False), (True, False), (True, True)], ids=["pointers", "tma", "swap"])
@pytest.mark.parametrize("T", [3, 16, 257, 4096])
def test_fp8_experts_w8a8_cuda(T, tma, swap):
    """KernelConfig.moe_fp8_w8a8 on the GPU in bf16 (3 and 16 tokens: the small tiles of the sorted path, its
    decode bound moved; 257 and 4096: 2056 / 32768 pairs, the prefill tiles from 2049): against the float64
    products of the same quantized operands (moe_w8a8_oracle.w8a8_check: as close to the exact product as they are,
    and near them on average; sampled tokens at 4096), and within FP8 activations' error of the weight-only path;
    with the small tiles' products swapped (moe_w8a8_swap, the default: TMA weight tiles with it on Hopper) and
    unswapped, with pointer loads or TMA."""
    x, w, ids, gate_up, down = _case(T, 64, 8, 384, 256, torch.bfloat16, "cuda", "random")
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    cfg = KernelConfig(moe_decode_pairs=0, moe_fp8_decode_pairs=0, moe_tma_weights=tma,  # (the default: W8A8)
                       moe_tma_small_weights=tma, moe_w8a8_swap=swap)
    assert cfg.moe_fp8_w8a8
    got = fused_moe(x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds)
    rows = torch.arange(T) if T <= 257 else torch.randperm(T, generator=torch.Generator().manual_seed(0))[:64]
    w8a8_check(got[rows], x[rows], w[rows], ids[rows], gq, gs, dq, ds)
    weight_only = fused_moe(x, w, ids, gq, dq, dataclasses.replace(cfg, moe_fp8_w8a8=False), gate_up_scale=gs,
                            down_scale=ds)
    assert float((got.float() - weight_only.float()).abs().max() / weight_only.float().abs().max()) < 0.15


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("T", [8, 32, 300])
def test_norm_quantized_x_cuda(T):
    """fused_moe's x_quant (KernelConfig.moe_w8a8_norm_quant: the add + RMSNorm before the experts quantizes x,
    fp8_act.add_rms_norm_fp8) on the GPU at the Qwen3-30B-A3B expert shape: the W8A8 GEMMs (small tiles at 8 and 32
    tokens, prefill tiles at 300) give the output of fused_moe quantizing the same normed rows itself, bit for bit."""
    from model_wrapper.kernels.fp8_act import add_rms_norm_fp8

    x, w, ids, gate_up, down = _case(T, 128, 8, 2048, 768, torch.bfloat16, "cuda", "random")
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    residual = torch.randn_like(x)
    act = add_rms_norm_fp8(x, residual, torch.ones(2048, dtype=torch.bfloat16, device="cuda"), 1e-6, 128,
                           write_x=True)
    cfg = KernelConfig(moe_w8a8_norm_quant=True)
    assert not takes_decode_path(T * 8, 128, cfg, fp8=True)  # (the W8A8 grouped GEMMs)
    want = fused_moe(act.x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds)
    got = fused_moe(act.x, w, ids, gq, dq, cfg, gate_up_scale=gs, down_scale=ds, x_quant=act)
    assert torch.equal(got, want)


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("T", [1, 3])
def test_fp8_packed_rounding_is_the_same_values_cuda(T):
    """The FP8 GEMVs' packed rounding of the dequantized weights (cvt.rn.bf16x2.f32, two at a time) rounds as
    Triton's one-value conversion does: the same output bit for bit, at the Qwen3-30B-A3B expert shape, with the
    tiles of 8k, 16k and 32k e4m3 weights (KernelConfig.moe_fp8_gemv_tile, moe_fp8_gemv_down_tile)."""
    x, w, ids, gate_up, down = _case(T, 16, 8, 2048, 768, torch.bfloat16, "cuda")
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    for tile in (8192, 16384, 32768):
        packed, plain = (dataclasses.replace(DECODE_CUDA, moe_fp8_gemv_tile=tile, moe_fp8_gemv_down_tile=tile,
                                             moe_fp8_packed_round=p, moe_fp8_direct=False) for p in (True, False))
        assert torch.equal(fused_moe(x, w, ids, gq, dq, packed, gate_up_scale=gs, down_scale=ds),
                           fused_moe(x, w, ids, gq, dq, plain, gate_up_scale=gs, down_scale=ds))


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("path", ["decode", "decode-loop", "sorted", "sorted-align128"])
def test_graph_replay_follows_new_routing(path):
    """Both paths captured once in a CUDA graph and replayed on other routings (new ids and weights
    copied into the captured buffers) give what eager calls give: nothing depends on the host."""
    cfg = CUDA_PATHS[path]
    x, w, ids, gate_up, down = _case(8, 64, 8, 256, 128, torch.bfloat16, "cuda")
    fused_moe(x, w, ids, gate_up, down, cfg)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w, ids, gate_up, down, cfg)
    for seed, routing in ((1, "random"), (2, "skew"), (3, "ties")):
        x2, w2, ids2, _, _ = _case(8, 64, 8, 256, 128, torch.bfloat16, "cuda", routing, seed)
        x.copy_(x2), w.copy_(w2), ids.copy_(ids2)
        graph.replay()
        torch.testing.assert_close(out, fused_moe(x2, w2, ids2, gate_up, down, cfg), rtol=0, atol=0)


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("T", [1, 4, 8, 32])
def test_router_routing_experts_chain_in_a_graph_cuda(T):
    """The sparse layer's chain as SparseMoE runs it on CUDA (router GEMV, routing kernel, experts, all with
    PDL: the decode path's down kernel reads ids and weights before its wait) captured in one graph at
    Qwen3-30B-A3B's shape and replayed on new inputs: bit for bit the chain without PDL, run eagerly."""
    from model_wrapper.kernels.moe_route import moe_route
    from model_wrapper.kernels.ops import gemv, gemv_fits

    g = torch.Generator(device="cuda").manual_seed(T)
    H, inter, E, k = 2048, 768, 128, 8
    gate = torch.randn(E, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    gate_up = torch.randn(E, 2 * inter, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    down = torch.randn(E, H, inter, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)

    def chain(x, cfg):
        logits = gemv(x, gate, cfg=cfg) if gemv_fits(x, gate, cfg) else torch.nn.functional.linear(x, gate)
        w, ids = moe_route(logits, k, True, False, cfg)
        return fused_moe(x, w, ids, gate_up, down, cfg)

    cfg = KernelConfig()
    chain(x, cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(x, cfg)
    for _ in range(20):
        x.copy_(torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g))
        graph.replay()
        torch.testing.assert_close(out, chain(x.clone(), dataclasses.replace(cfg, pdl=False)), rtol=0, atol=0)
