"""The FP8 (e4m3) linears (model_wrapper/kernels/fp8.py) against a direct computation written here:
W = float(weight) * scale per row and K-group, products in float64; where a path quantizes the
activations, x rounded through e4m3 per token and group (amax / 448) by a loop over the groups.
Under Triton's interpreter on the CPU (fp8 loads, conversions and tl.dot on e4m3 run there; the
16-bit tensor-core products in fp16, as the interpreter computes bf16 dots wrongly), and every
path through fp8_linear / fp8_gate_up_silu on CUDA (marked cuda) in bf16 and fp16 at Llama-3-8B
shapes. Shapes: M = 1, 2, 3, 16, 17, 257; K not a multiple of 128; N odd; per-group (128) and
per-channel scales; bias; strided rows; the SiLU epilogue; a static input scale."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
import torch.nn.functional as F

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, TOL, on_cuda_skip  # first: it sets up the interpreter

from model_wrapper.kernels import KernelConfig  # noqa: E402
from model_wrapper.kernels import fp8  # noqa: E402
from model_wrapper.kernels.fp8_reference import fp8_linear_reference  # noqa: E402
from model_wrapper.layers.fp8_linear import Fp8Method  # noqa: E402
from conftest import rel_err  # noqa: E402

E4M3 = torch.float8_e4m3fn


def make_weight(N, K, group, g, device=DEVICE):
    """-> (e4m3 weight [N, K], float32 scales [N, ceil(K / group)]) with scales that differ per row
    and per group (a wrong group index changes the product)."""
    w = (torch.randn(N, K, generator=g) * 64).clamp(-448, 448).to(E4M3)
    s = torch.exp(torch.randn(N, -(-K // group), generator=g)) / (64 * K**0.5)
    return w.to(device), s.to(device)


def dequant(w, s, group):
    """W [N, K] float64: each K-column's scale is its group's."""
    K = w.shape[1]
    cols = torch.arange(K, device=w.device) // group
    return w.double() * s.double()[:, cols]


def ieee_div(a, b):
    """a / b in float32, correctly rounded wherever it runs: the quotient in float64, rounded once
    to float32 (53 >= 2 * 24 + 2 bits: the double rounding is exact). torch's CUDA division by a
    scalar multiplies by its reciprocal instead (an ulp off at times)."""
    return (a.double() / b.double()).float()


def quantize_oracle(x, group, input_scale=None):
    """x [M, K] -> (x rounded through e4m3, as float64 [M, K]): per group of columns, scale =
    max(amax, 1e-10) / 448, or the static input_scale; IEEE divisions, the e4m3 rounding by
    torch on the CPU (round to nearest even)."""
    out = torch.empty(x.shape, dtype=torch.float64, device=x.device)
    for c in range(0, x.shape[1], group):
        blk = x[:, c:c + group].float()
        if input_scale is None:
            scale = ieee_div(blk.abs().amax(dim=1, keepdim=True).clamp_min(1e-10), torch.tensor(448.0))
        else:
            scale = input_scale.float().cpu()
        q = ieee_div(blk, scale.to(blk.device)).clamp(-448, 448).cpu().to(E4M3).to(x.device)
        out[:, c:c + group] = q.double() * scale.double().to(x.device)
    return out


def kernel_quantized(x, group, input_scale=None):
    """x rounded through e4m3 by the kernels' own quantization (fp8.quantize_fp8_per_token_group /
    quantize_fp8_static), as float64 [M, K]: the operand the prefill paths multiply. The tests
    above and test_quantize_on_cuda_is_the_oracle hold that function to quantize_oracle, which
    stands for it off CUDA (where fp8_linear runs the torch reference)."""
    if not x.is_cuda:
        return quantize_oracle(x, group, input_scale)
    if input_scale is not None:
        return fp8.quantize_fp8_static(x, input_scale).double() * input_scale.double()
    q, qs = fp8.quantize_fp8_per_token_group(x, group)
    return dequant(q, qs, group)


def product(x, w, s, group, bias=None, quantized=False, input_scale=None):
    """The float64 product of x with W (+ bias); quantized: x through e4m3 first, by the kernels'
    own quantization (the same operands: what remains is the GEMM's error, the dtype's rounding)."""
    xd = kernel_quantized(x, group, input_scale) if quantized else x.double()
    y = xd @ dequant(w, s, group).t()
    return y if bias is None else y + bias.double()


def silu_product(x, w, s, group, bias=None, quantized=False, input_scale=None):
    """silu(gate) * up of the product, each half rounded to x's dtype first (the unfused pair's)."""
    gate, up = product(x, w, s, group, bias, quantized, input_scale).to(x.dtype).chunk(2, dim=-1)
    return F.silu(gate.double()) * up.double()


def rows(M, K, dtype, g, device=DEVICE, strided=False):
    """x [M, K]; strided: a view of every other row of a wider buffer (row stride != K)."""
    if strided:
        return torch.randn(2 * M, K + 8, generator=g).to(device, dtype)[::2, 3:K + 3]
    return torch.randn(M, K, generator=g).to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_quantize_per_token_group_is_amax_over_448_rounded_to_e4m3(dtype):
    """quantize_fp8_per_token_group and quantize_fp8_static against the loop over groups, bit for
    bit: group 128 with K not a multiple of it, one group a row (K = 1000), a group narrower than
    a tile (64), strided rows, an all-zero row (zeros, not NaN) and a value past 448 (clamped)."""
    g = torch.Generator().manual_seed(0)
    for M, K, group, strided in ((3, 300, 128, False), (2, 1000, 1000, True), (5, 256, 64, False)):
        x = rows(M, K, dtype, g, strided=strided)
        x[0] = 0
        q, s = fp8.quantize_fp8_per_token_group(x, group)
        assert q.dtype == E4M3 and q.shape == (M, K) and s.dtype == torch.float32 and s.shape == (M, -(-K // group))
        cols = torch.arange(K, device=x.device) // group
        assert torch.equal(q.double() * s.double()[:, cols], quantize_oracle(x, group)), (M, K, group)
        assert not q.float().isnan().any() and (q[0].float() == 0).all()
        want_s = torch.stack([ieee_div(x[:, c:c + group].float().abs().amax(1).clamp_min(1e-10), torch.tensor(448.0))
                              for c in range(0, K, group)], dim=1)
        assert torch.equal(s, want_s)
    x = rows(4, 200, dtype, g)
    x[1, 7] = 1000.0
    scale = torch.tensor(0.01, device=x.device)
    q = fp8.quantize_fp8_static(x, scale)
    assert torch.equal(q.double() * scale.double(), quantize_oracle(x, 200, scale))
    assert q[1, 7].float() == 448


def test_quantize_pads_rows_and_lays_scales_out_for_cublas():
    """The block-scaled cuBLASLt path's quantization: rows padded with zero rows (q 0, the scale of
    an all-zero group) and the scales [rows, KG] as a view of a [KG, rows] buffer (stride(0) == 1),
    the first M rows equal to quantize_fp8_per_token_group's."""
    g = torch.Generator().manual_seed(7)
    x = rows(5, 384, torch.float16, g, strided=True)
    q, s = fp8._quantize(x, 128, None, rows=16, outer=True)
    want_q, want_s = fp8.quantize_fp8_per_token_group(x, 128)
    assert q.shape == (16, 384) and s.shape == (16, 3) and s.stride(0) == 1
    assert torch.equal(q[:5].float(), want_q.float()) and torch.equal(s[:5], want_s)
    assert (q[5:].float() == 0).all() and torch.equal(s[5:], torch.full((11, 3), 1e-10 / 448, device=DEVICE))


GEMV_CONFIGS = {"default": KernelConfig(),
                "chunk8-small-tile": KernelConfig(fp8_gemv_chunk=8, fp8_gemv_tile=1024, fp8_gemv_warps=2),
                "chunk32": KernelConfig(fp8_gemv_chunk=32, fp8_gemv_tile=65536, fp8_gemv_warps=8),
                # (x once a round: fp8_gemv_x_once off, so that the per-round loads keep their 1-token cases)
                "rounds": KernelConfig(fp8_gemv_rounds=3, fp8_gemv_tile=3072, gemv_rounds_max_tokens=4,
                                       fp8_gemv_x_once=False),
                "x-rows": KernelConfig(fp8_gemv_x_rows_max=4, fp8_gemv_tile=8192),
                "x-rows-rounds": KernelConfig(fp8_gemv_x_rows_max=2, fp8_gemv_rounds=2, fp8_gemv_tile=4096,
                                              gemv_rounds_max_tokens=4, fp8_gemv_x_once=False),
                "x-once-rounds": KernelConfig(fp8_gemv_x_once=True, fp8_gemv_rounds=2, fp8_gemv_tile=4096)}


@pytest.mark.parametrize("cfg", GEMV_CONFIGS.values(), ids=GEMV_CONFIGS.keys())
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_fp8_gemv_is_the_weight_only_product(dtype, cfg):
    """The "gemv" path (one to four tokens): x unquantized, W dequantized per row and group; groups
    of 128 with K not a multiple of 128 (nor of 16), one group a row, groups of 32 and 48 (chunks
    of 16 in each), N odd (a part-filled last program), bias, strided rows, and the SiLU epilogue
    over [gate | up] rows and scales; under several chunks and tiles of the kernel, and programs of
    three row blocks taken in turn (fp8_gemv_rounds; rows of up to 8192, at 1-4 tokens here), and the
    x loaded a copy a row (fp8_gemv_x_rows_max) or once for a program's rounds (fp8_gemv_x_once)."""
    g = torch.Generator().manual_seed(1)
    for M, N, K, group, bias, strided in ((1, 33, 300, 128, True, False), (2, 17, 1000, 1000, False, True),
                                          (2, 9, 4200, 128, True, True), (1, 40, 96, 32, False, False),
                                          (4, 5, 392, 392, True, False), (3, 24, 480, 48, False, True),
                                          (1, 7, 2048, 128, True, True)):
        w, s = make_weight(N, K, group, g)
        b = torch.randn(N, generator=g).to(DEVICE, dtype) if bias else None
        x = rows(M, K, dtype, g, strided=strided)
        got = fp8.fp8_gemv(x, w, s, group, b, cfg=cfg)
        assert got.dtype == dtype and got.shape == (M, N)
        assert rel_err(got, product(x, w, s, group, b)) < TOL[dtype], (M, N, K, group)
        w2, s2 = make_weight(2 * N, K, group, g)
        b2 = torch.randn(2 * N, generator=g).to(DEVICE, dtype) if bias else None
        got = fp8.fp8_gemv(x, w2, s2, group, b2, silu=True, cfg=cfg)
        assert got.shape == (M, N)
        assert rel_err(got, silu_product(x, w2, s2, group, b2)) < TOL[dtype], (M, N, K, group)


SKINNY_CONFIGS = {"default": KernelConfig(),
                  "direct-upcast": KernelConfig(fp8_skinny_f32_upcast=False),
                  "k64-wide-programs": KernelConfig(fp8_skinny_block_k=64, fp8_skinny_wide_block_k=64,
                                                    fp8_skinny_min_programs=1, fp8_skinny_wide_min_programs=1),
                  "k256-exact": KernelConfig(fp8_skinny_block_k=256, fp8_skinny_wide_block_k=256,
                                             fp8_skinny_dequant=False, fp8_skinny_wide_dequant=False),
                  "k512-dequant": KernelConfig(fp8_skinny_block_k=512, fp8_skinny_wide_block_k=512,
                                               fp8_skinny_dequant=True, fp8_skinny_wide_dequant=True,
                                               fp8_skinny_block_n=32),
                  "k128-dequant": KernelConfig(fp8_skinny_block_k=128, fp8_skinny_dequant=True)}


@pytest.mark.parametrize("cfg", SKINNY_CONFIGS.values(), ids=SKINNY_CONFIGS.keys())
def test_fp8_skinny_is_the_weight_only_product(cfg):
    """The "skinny" path (tensor-core products of upcast e4m3 tiles): token counts 1 / 3 / 16 / 17 /
    40 / 100, groups of 128 (one or several scales per K step) and 64, one group a row with K not a
    multiple of the K step, N odd, bias, strided rows, the SiLU epilogue; other K steps, rows per
    program, and the tile scaled in registers before one product a K step (cfg). fp16 here (the
    interpreter's bf16 dot is wrong); bf16 on CUDA."""
    g = torch.Generator().manual_seed(2)
    dtype = torch.float16
    for M, N, K, group, bias, strided in ((1, 33, 300, 128, True, False), (3, 70, 520, 128, False, True),
                                          (16, 33, 1000, 1000, True, False), (17, 50, 256, 64, True, True),
                                          (40, 21, 300, 300, False, False), (100, 24, 640, 128, True, False)):
        w, s = make_weight(N, K, group, g)
        b = torch.randn(N, generator=g).to(DEVICE, dtype) if bias else None
        x = rows(M, K, dtype, g, strided=strided)
        got = fp8.fp8_skinny(x, w, s, group, b, cfg=cfg)
        assert got.dtype == dtype and got.shape == (M, N)
        assert rel_err(got, product(x, w, s, group, b)) < TOL[dtype], (M, N, K, group)
        w2, s2 = make_weight(2 * N, K, group, g)
        b2 = torch.randn(2 * N, generator=g).to(DEVICE, dtype) if bias else None
        got = fp8.fp8_skinny(x, w2, s2, group, b2, silu=True, cfg=cfg)
        assert rel_err(got, silu_product(x, w2, s2, group, b2)) < TOL[dtype], (M, N, K, group)


@pytest.mark.parametrize("cfg", [KernelConfig(), KernelConfig(fp8_skinny_mma_block_n=32, fp8_skinny_mma_row_block_k=128),
                                 KernelConfig(fp8_skinny_mma_block_k=512, fp8_skinny_mma_row_block_k=256),
                                 KernelConfig(fp8_skinny_mma_min_programs=1),  # the default's 128 rows a program
                                 KernelConfig(fp8_skinny_mma_scales_ahead=False),  # block scales loaded in their step
                                 KernelConfig(fp8_skinny_mma_block_k=256, fp8_skinny_mma_scales_ahead=False),
                                 KernelConfig(fp8_skinny_mma_narrow_warps=2),  # 32-row tiles at 2 warps, 1 warp
                                 KernelConfig(fp8_skinny_mma_narrow_warps=1, fp8_skinny_mma_block_n=32),
                                 # K split into up to 64 parts of one K step (and of two: uneven parts)
                                 KernelConfig(fp8_skinny_mma_split_programs=64, fp8_skinny_mma_row_split_programs=64,
                                              fp8_skinny_mma_split_min_steps=1),
                                 KernelConfig(fp8_skinny_mma_split_programs=3, fp8_skinny_mma_row_split_programs=3,
                                              fp8_skinny_mma_block_n=32, fp8_skinny_mma_block_k=256)],
                         ids=["default", "n32-k128", "k512-256", "n128", "scales-in-step", "scales-in-step-k256",
                              "narrow-w2", "narrow-w1", "split", "split-n32-k256"])
def test_fp8_skinny_mma_is_the_product_of_x_quantized_per_128_columns(cfg):
    """The "skinny_mma" path (kernels/fp8_skinny_mma.py, W8A8 at 1-64 tokens): x quantized per token and 128
    columns for block weights, per token for a scale a row (the prefill paths' rounding: quantize_oracle), e4m3
    products: weight groups of 128 and 256 (several products a group), one group a row with K not a multiple of
    the K step (a part-filled last step), N odd, bias, strided rows, the SiLU epilogue; K steps of 128 to 512; block
    scales loaded a K step ahead (default: several groups a step with K steps of 512) or in their step."""
    _check_skinny_mma(cfg)


@pytest.mark.parametrize("cfg, took", [
    (KernelConfig(), [256, 384, 512]),
    (KernelConfig(fp8_skinny_mma_row_tma=True), [256, 384, 512, 640]),
    (KernelConfig(fp8_skinny_mma_row_tma=True, fp8_skinny_mma_split_programs=64, fp8_skinny_mma_row_split_programs=64,
                  fp8_skinny_mma_split_min_steps=1), [256, 384, 512, 640])], ids=["default", "tma", "tma-split"])
def test_fp8_skinny_mma_with_tma_weight_tiles(cfg, took, monkeypatch):
    """The same cases with the weight tiles through tensor descriptors (KernelConfig.fp8_skinny_mma_tma, on by
    default: block weights; fp8_skinny_mma_row_tma, off: a scale a row; Hopper only, so the device check is
    patched): row tiles past N (N odd; gate_up's tiles reach into up's rows) and K steps past K come back as rows
    never stored and zeros. Weights of 300 and 1000 e4m3 bytes a row do not fit a descriptor and keep the pointer
    loads; the others took descriptors where their format's switch is on (logged: block weights of 256-512
    columns, a scale a row of 640)."""
    from model_wrapper.kernels import fp8_skinny_mma

    made = []
    real = fp8_skinny_mma.weight_descriptor
    monkeypatch.setattr(fp8_skinny_mma, "sm90", lambda device: True)
    monkeypatch.setattr(fp8_skinny_mma, "weight_descriptor", lambda w, *a: made.append(w.shape[1]) or real(w, *a))
    # (and a scale a row over 640 columns: K steps of 256, the last past K)
    _check_skinny_mma(cfg, extra=((5, 40, 640, 640, False, False),))
    assert sorted(set(made)) == took


def _check_skinny_mma(cfg, extra=()):
    from model_wrapper.kernels.fp8_skinny_mma import fp8_skinny_mma

    g = torch.Generator().manual_seed(12)
    dtype = torch.float16
    for M, N, K, group, bias, strided in ((1, 40, 300, 128, True, False), (3, 70, 512, 256, False, True),
                                          (16, 33, 1000, 1000, True, False), (9, 64, 384, 128, True, True),
                                          (17, 40, 384, 128, False, False), (32, 33, 1000, 1000, True, True),
                                          (50, 64, 256, 128, True, False)) + tuple(extra):  # token tiles of 16-64
        w, s = make_weight(N, K, group, g)
        b = torch.randn(N, generator=g).to(DEVICE, dtype) if bias else None
        x = rows(M, K, dtype, g, strided=strided)
        xq = quantize_oracle(x, 128 if group < K else K)  # block weights: per 128 columns; else per token
        got = fp8_skinny_mma(x, w, s, group, b, cfg=cfg)
        want = xq @ dequant(w, s, group).t() + (0 if b is None else b.double())
        assert got.dtype == dtype and got.shape == (M, N)
        assert rel_err(got, want) < TOL[dtype], (M, N, K, group)
        w2, s2 = make_weight(2 * N, K, group, g)
        b2 = torch.randn(2 * N, generator=g).to(DEVICE, dtype) if bias else None
        got = fp8_skinny_mma(x, w2, s2, group, b2, silu=True, cfg=cfg)
        gate, up = (xq @ dequant(w2, s2, group).t() + (0 if b2 is None else b2.double())).to(dtype).chunk(2, -1)
        assert rel_err(got, F.silu(gate.double()) * up.double()) < TOL[dtype], (M, N, K, group)
    with pytest.raises(ValueError, match="at most 64 tokens, got 65"):  # (its widest token tile)
        fp8_skinny_mma(rows(65, 256, dtype, g), *make_weight(32, 256, 128, g), 128, cfg=cfg)
    from model_wrapper.kernels import common
    counts = [c for (owner, _), c in common._COUNTERS.items() if owner == "fp8_skinny_mma"]
    assert not any(c.any() for c in counts)  # split launches: every tile's counter reset


def test_fp8_skinny_mma_split_k_parts():
    """split_k: parts that bring the programs to fp8_skinny_mma_split_programs, each of whole K steps (at least
    fp8_skinny_mma_split_min_steps), none empty; no split where that is one part or the option is off."""
    from model_wrapper.kernels.fp8_skinny_mma import split_k

    on = KernelConfig(fp8_skinny_mma_split_programs=256, fp8_skinny_mma_split_min_steps=2)
    assert split_k(64, 14336, 128, on) == (4, 3584)  # 64 tiles x 4 parts of 28 steps
    assert split_k(64, 4096, 128, on) == (4, 1024)
    assert split_k(48, 4096, 128, on) == (6, 768)  # 32 steps in 6 parts: 6 x 6 steps (the last 2)
    assert split_k(300, 4096, 128, on) == (1, 4096)  # enough tiles
    assert split_k(8, 512, 128, on) == (2, 256)  # 4 steps: parts of at least 2
    assert split_k(8, 256, 128, on) == (1, 256)
    assert split_k(7, 1000, 256, dataclasses.replace(on, fp8_skinny_mma_split_min_steps=1)) == (4, 256)
    assert split_k(7, 4096, 256, dataclasses.replace(on, fp8_skinny_mma_split_programs=0)) == (1, 4096)
    assert split_k(64, 4096, 128, on, per_group=False) == (1, 4096)  # a scale a row: its own bound (0: off)
    assert split_k(64, 4096, 128, dataclasses.replace(on, fp8_skinny_mma_row_split_programs=128), False) == (2, 2048)
    for tiles, K, bk in ((64, 14336, 128), (48, 4096, 128), (8, 1000, 256), (3, 4096, 512)):
        parts, cols = split_k(tiles, K, bk, on)
        assert cols % bk == 0 and (parts - 1) * cols < K <= parts * cols  # whole steps, the last part not empty


def test_fp8_gemm_is_the_product_of_quantized_activations():
    """The "gemm" path (prefill): x quantized per token and group (or with a static scale), FP8
    tensor-core products scaled per K step: groups of 128 with K not a multiple of 128, per-channel
    scales (one group a row), a group of 64 (a K step of 64), N odd, bias, strided rows, 17 and
    257 tokens (a part-filled row block), small tiles (several row bands)."""
    g = torch.Generator().manual_seed(3)
    dtype = torch.float16
    small = KernelConfig(fp8_gemm_block_m=32, fp8_gemm_block_n=32, fp8_gemm_group_m=2)
    for M, N, K, group, bias, strided, static in ((17, 33, 300, 128, True, False, False),
                                                  (257, 50, 200, 200, False, True, False),
                                                  (40, 31, 256, 64, True, False, False),
                                                  (70, 45, 130, 130, True, True, True)):
        w, s = make_weight(N, K, group, g)
        b = torch.randn(N, generator=g).to(DEVICE, dtype) if bias else None
        x = rows(M, K, dtype, g, strided=strided)
        in_scale = torch.tensor(0.02, device=DEVICE) if static else None
        for cfg in (KernelConfig(), small):
            got = fp8.fp8_gemm(x, w, s, group, b, in_scale, cfg)
            assert got.dtype == dtype and got.shape == (M, N)
            assert rel_err(got, product(x, w, s, group, b, True, in_scale)) < TOL[dtype], (M, N, K, group)


def test_fp8_path_follows_the_token_count_and_the_kernel_config():
    """fp8_path: 1-2 tokens the GEMV, up to fp8_skinny_max_tokens the skinny GEMM (W8A8 "skinny_mma" up to
    fp8_skinny_mma_max_tokens, 32, where it fits, else weight-only; a scale a row up to
    fp8_skinny_mma_row_max_tokens, 32; skinny_mma also past fp8_skinny_max_tokens
    where its bound is moved there, up to its 64-token tile), beyond the
    quantized GEMM (off CUDA never cuBLASLt's, block scales or not); KernelConfig moves each bound;
    a group no K step divides, fp32 x and rows wider than the GEMV holds go elsewhere. Off CUDA
    fp8_linear and fp8_gate_up_silu are the reference: weight-only up to fp8_skinny_max_tokens,
    quantized beyond."""
    g = torch.Generator().manual_seed(4)
    w, s = make_weight(24, 256, 128, g, "cpu")
    big = KernelConfig().fp8_skinny_max_tokens

    def path(M, cfg=KernelConfig(), group=128, dtype=torch.float16):
        return fp8.fp8_path(torch.zeros(M, 256, dtype=dtype), w, s, group, cfg, block_scale=s[::128].t())

    assert big == 16
    assert [path(M) for M in (1, 2, 3, 16, 17, 32, 33, 4096)] == ["gemv", "gemv", "skinny_mma", "skinny_mma",
                                                                   "skinny_mma", "skinny_mma", "gemm", "gemm"]
    # 2 tokens: weights of more than fp8_gemv_multi_token_max_weights values to skinny_mma (where it runs)
    two = KernelConfig(fp8_gemv_multi_token_max_weights=24 * 256 - 1)
    assert [path(M, two) for M in (1, 2, 3)] == ["gemv", "skinny_mma", "skinny_mma"]
    assert path(2, KernelConfig(fp8_gemv_multi_token_max_weights=24 * 256)) == "gemv"
    assert path(2, dataclasses.replace(two, fp8_skinny_mma=False)) == "gemv"  # (the weight-only skinny: no)
    moved = KernelConfig(fp8_gemv_max_tokens=4, fp8_skinny_max_tokens=32, fp8_skinny_mma_max_tokens=16)
    assert [path(M, moved) for M in (4, 5, 16, 17, 32, 33)] == ["gemv", "skinny_mma", "skinny_mma", "skinny", "skinny",
                                                                "gemm"]  # skinny_mma up to 16 tokens
    wide = KernelConfig(fp8_skinny_mma_max_tokens=64)  # skinny_mma past fp8_skinny_max_tokens, in the GEMM's place
    assert [path(M, wide) for M in (3, 17, 64, 65)] == ["skinny_mma", "skinny_mma", "skinny_mma", "gemm"]
    assert path(100, KernelConfig(fp8_skinny_mma_max_tokens=128)) == "gemm"  # (its token tile: at most 64)
    assert fp8.fp8_path(torch.zeros(3, 256, dtype=torch.float16), w, s[:, :1], 256) == "skinny"  # a scale a row:
    assert fp8.fp8_path(torch.zeros(3, 256, dtype=torch.bfloat16), w, s[:, :1], 256) == "skinny_mma"  # bf16 only

    def row(M, cfg=KernelConfig()):  # a scale a row: skinny_mma up to fp8_skinny_mma_row_max_tokens, 32
        return fp8.fp8_path(torch.zeros(M, 256, dtype=torch.bfloat16), w, s[:, :1], 256, cfg)

    assert [row(M) for M in (3, 17, 32, 33)] == ["skinny_mma", "skinny_mma", "skinny_mma", "gemm"]
    assert [row(M, KernelConfig(fp8_skinny_mma_row_max_tokens=16)) for M in (16, 17)] == ["skinny_mma", "gemm"]
    weight_only = KernelConfig(fp8_skinny_mma=False)
    assert [path(M, weight_only) for M in (3, big)] == ["skinny", "skinny"]
    w264, s264 = make_weight(24, 264, 128, g, "cpu")
    assert fp8.fp8_path(torch.zeros(3, 264, dtype=torch.float16), w264, s264, 128) == "skinny"  # skinny_mma: K % 16
    assert path(3, group=48) == "reference" and path(1, group=48) == "gemv"  # 48: no power-of-2 K step >= 32
    assert path(3, group=64) == "skinny"  # skinny_mma: groups of a multiple of 128 columns
    assert path(1, dtype=torch.float32) == "reference"
    assert path(1, KernelConfig(fp8_gemv_max_k=128)) == "skinny_mma"
    for M in (2, big + 1):
        x = torch.randn(M, 256, generator=g).to(torch.bfloat16)
        assert rel_err(fp8.fp8_linear(x, w, s, 128), product(x, w, s, 128, quantized=M > big)) < TOL[torch.bfloat16]
        ref = fp8_linear_reference(x, w, s, 128, quantize_input=M > big)
        assert torch.equal(fp8.fp8_linear(x, w, s, 128), ref)
        got = fp8.fp8_gate_up_silu(x, w, s, 128)
        assert rel_err(got, silu_product(x, w, s, 128, quantized=M > big)) < TOL[torch.bfloat16]


def block_scale_of(w, s, group):
    """Fp8Method's block scales of (w, s) as the model keeps them (None where s is not 128-row bands)."""
    lin = torch.nn.Module()
    lin.weight, lin.weight_scale = w, s
    return Fp8Method(group).block_scale(lin)


def test_block_scales_are_kept_only_for_128_row_bands():
    """Fp8Method.block_scale: a block checkpoint's scales (each 128-row band one row repeated) as
    [K / 128, N / 128] blocks with stride(0) == 1, made once; None for scales that differ within a
    band (a TP shard starting inside one), N or K not a multiple of 128, or per-channel scales."""
    g = torch.Generator().manual_seed(8)
    w, s = make_weight(256, 384, 128, g, "cpu")
    bands = s[::128].repeat_interleave(128, 0)
    got = block_scale_of(w, bands, 128)
    assert got.shape == (3, 2) and got.stride(0) == 1 and torch.equal(got, s[::128].t())
    assert block_scale_of(w, s, 128) is None
    assert block_scale_of(w[:200], bands[:200], 128) is None
    assert block_scale_of(w, bands[64:].repeat(2, 1)[:256], 128) is None  # bands shifted by 64 rows
    assert block_scale_of(w, s[:, :1].contiguous(), 384) is None


# -- CUDA: every path through the entry points, bf16 and fp16 -------------------------------------

LLAMA_SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


@pytest.mark.cuda
@on_cuda_skip
def test_quantize_on_cuda_is_the_oracle():
    """The Triton quantization on the GPU against quantize_oracle, bit for bit: Llama-3-8B widths,
    groups of 128 and a whole row, bf16 and fp16, and a static scale."""
    g = torch.Generator().manual_seed(9)
    for dtype in (torch.bfloat16, torch.float16):
        for K, group in ((4096, 128), (14336, 128), (4096, 4096)):
            x = torch.randn(257, K, generator=g).to("cuda", dtype)
            q, s = fp8.quantize_fp8_per_token_group(x, group)
            assert torch.equal(dequant(q, s, group), quantize_oracle(x, group)), (dtype, K, group)
        scale = torch.tensor(0.01, device="cuda")
        assert torch.equal(fp8.quantize_fp8_static(x, scale).double() * scale.double(), quantize_oracle(x, K, scale))


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("group", [128, None], ids=["block128", "per-channel"])
def test_fp8_linear_on_cuda_every_path(dtype, group):
    """fp8_linear and fp8_gate_up_silu on CUDA at 1, 2, 3, 16, 17, 64, 257 and 4096 tokens,
    Llama-3-8B's projection shapes and a ragged one (N odd, K not a multiple of 128, bias),
    block-wise (128 x 128 blocks, as the loader keeps them, with their compact block scales) and
    per-channel scales: against the float64 product of the same operands (beyond
    fp8_skinny_max_tokens x quantized by the kernels' own quantization, which
    test_quantize_on_cuda_is_the_oracle checks), within four roundings of the dtype; which path
    each takes (cuBLASLt's row-wise GEMM for per-channel bf16 prefill, its block-scaled one for
    block bf16 prefill where torch takes block scales); strided rows; a static input scale."""
    g = torch.Generator().manual_seed(5)
    seen = set()
    big = KernelConfig().fp8_skinny_max_tokens
    for N, K in LLAMA_SHAPES + ((1001, 520),):
        grp = group or K
        w, s = make_weight(N, K, grp, g, "cuda")
        if group:
            s = s[::128].repeat_interleave(128, 0)[:N].contiguous()  # a block checkpoint's scales
        block = block_scale_of(w, s, grp)
        assert (block is not None) == (group == 128 and N % 128 == 0 and K % 128 == 0)
        b = torch.randn(N, generator=g).to("cuda", dtype) if N == 1001 else None
        for M in (1, 2, 3, 16, 17, 64, 257, 4096):
            if M == 4096 and N == 28672:
                continue  # the same GEMM as 257 tokens, longer
            x = rows(M, K, dtype, g, "cuda", strided=M in (3, 257))
            path = fp8.fp8_path(x, w, s, grp, block_scale=block)
            seen.add(path)
            got = fp8.fp8_linear(x, w, s, grp, b, block_scale=block)
            assert got.dtype == dtype and got.shape == (M, N)
            if path == "skinny_mma":  # x quantized per token and 128 columns (block weights) or per token
                want = quantize_oracle(x, 128 if grp < K else K) @ dequant(w, s, grp).t()
                want = want + (0 if b is None else b.double())
            else:
                want = product(x, w, s, grp, b, quantized=M > big)
            err = rel_err(got, want)
            assert err < TOL[dtype], (M, N, K, path, err)
            if M in (1, 3, 257) and N % 2 == 0:
                got = fp8.fp8_gate_up_silu(x, w, s, grp, block_scale=block)
                if path == "skinny_mma":
                    xq = quantize_oracle(x, 128 if grp < K else K)
                    gate, up = (xq @ dequant(w, s, grp).t()).to(dtype).chunk(2, -1)
                    want = F.silu(gate.double()) * up.double()
                else:
                    want = silu_product(x, w, s, grp, quantized=M > big)
                assert rel_err(got, want) < TOL[dtype], (M, N, K, path)
        in_scale = torch.tensor(0.01, device="cuda")
        x = rows(300, K, dtype, g, "cuda")
        got = fp8.fp8_linear(x, w, s, grp, b, input_scale=in_scale, block_scale=block)
        assert rel_err(got, product(x, w, s, grp, b, True, in_scale)) < TOL[dtype], (N, K, "static")
    prefill = "gemm"
    if dtype == torch.bfloat16:
        prefill = "scaled_mm" if not group else "scaled_mm_block" if fp8._block_mm_works(
            torch.device("cuda", torch.cuda.current_device()), 4096, 4096) else "gemm"
    # skinny: the ragged K (520, not a multiple of 16), and fp16 with a scale a row; skinny_mma: the others
    want = {"gemv", "skinny", prefill} | ({"skinny_mma"} if group or dtype == torch.bfloat16 else set())
    assert want <= seen and ("skinny_mma" in seen) == ("skinny_mma" in want), seen


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("group", [128, None], ids=["block128", "per-channel"])
def test_fp8_skinny_mma_on_cuda(group):
    """KernelConfig.fp8_skinny_mma on CUDA: fp8_linear and fp8_gate_up_silu at 2 (every weight past
    fp8_gemv_multi_token_max_weights, here 0), 3, 8 and 16 tokens take the "skinny_mma" path, Llama-3-8B's shapes
    and a ragged one, block or per-channel scales, bf16: the float64 product of x quantized per token and 128
    columns, or per token (quantize_oracle, bit for bit the kernels' quantization) with W."""
    g = torch.Generator().manual_seed(13)
    cfg = KernelConfig(fp8_skinny_mma=True, fp8_gemv_multi_token_max_weights=0)
    for N, K in LLAMA_SHAPES + ((1001, 528),):  # (K a multiple of 16, not of 128: skinny_mma_fits)
        grp = group or K
        w, s = make_weight(N, K, grp, g, "cuda")
        b = torch.randn(N, generator=g).to("cuda", torch.bfloat16) if N == 1001 else None
        for M in (2, 3, 8, 16):
            x = rows(M, K, torch.bfloat16, g, "cuda", strided=M == 3)
            assert fp8.fp8_path(x, w, s, grp, cfg) == "skinny_mma"
            xq = quantize_oracle(x, 128 if grp < K else K)
            want = xq @ dequant(w, s, grp).t() + (0 if b is None else b.double())
            got = fp8.fp8_linear(x, w, s, grp, b, cfg=cfg)
            assert rel_err(got, want) < TOL[torch.bfloat16], (M, N, K)
            if N % 2 == 0:
                gate, up = (xq @ dequant(w, s, grp).t()).to(torch.bfloat16).chunk(2, -1)
                got = fp8.fp8_gate_up_silu(x, w, s, grp, cfg=cfg)
                assert rel_err(got, F.silu(gate.double()) * up.double()) < TOL[torch.bfloat16], (M, N, K)


@pytest.mark.cuda
@on_cuda_skip
def test_fp8_weight_only_paths_hold_to_bf16_gemv_error():
    """At one and eight tokens the weight-only paths' (the GEMV; the skinny kernel, fp8_skinny_mma off) error against the float64 product is at most
    twice that of F.linear on the dequantized bf16-exact weight (e4m3 * a power-of-2 scale is
    exact in bf16), plus a floor: the fp32 sums lose nothing to the bf16 path."""
    g = torch.Generator().manual_seed(6)
    for N, K in LLAMA_SHAPES:
        w = (torch.randn(N, K, generator=g) * 64).clamp(-448, 448).to(E4M3).cuda()
        s = torch.full((N, K // 128), 2.0**-12, device="cuda")
        wb = dequant(w, s, 128).to(torch.bfloat16)
        for M in (1, 8):
            x = torch.randn(M, K, generator=g).to("cuda", torch.bfloat16)
            want = product(x, w, s, 128)
            blas = F.linear(x, wb)
            got = fp8.fp8_linear(x, w, s, 128, cfg=KernelConfig(fp8_skinny_mma=False))
            assert (got.double() - want).abs().max() <= 2 * (blas.double() - want).abs().max() + 1e-3, (M, N, K)
