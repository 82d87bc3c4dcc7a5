"""The Triton GEMV (model_wrapper/kernels, steps of one or two tokens) against the float64 product:
under Triton's interpreter in fp32 / fp16 on the CPU, and in bf16 / fp16 / fp32 on CUDA (marked cuda)
with its error bounded by cuBLAS's on the same operands; and the KernelConfig bounds it reads."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, TOL, on_cuda_skip  # first: it sets up the interpreter

import model_wrapper.kernels.ops as tops  # noqa: E402
from model_wrapper.kernels import KernelConfig  # noqa: E402
from conftest import rel_err  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_gemv_is_the_product_with_bias_and_part_filled_programs(dtype):
    """kernels.gemv (the projections of one- and two-token steps on the CUDA path) against the
    float64 product: rows narrower than a tile and wider than one (not powers of two), a last
    program with rows past N, a bias. bf16 runs on CUDA (test_gemv_matches_the_product, below)."""
    g = torch.Generator().manual_seed(2)
    for T, N, K, bias in ((1, 70, 1000, True), (2, 5, 20000, False), (2, 33, 64, True)):
        w = (torch.randn(N, K, generator=g) / K**0.5).to(DEVICE, dtype)
        b = torch.randn(N, generator=g).to(DEVICE, dtype) if bias else None
        x = torch.randn(T, K, generator=g).to(DEVICE, dtype)
        assert tops.gemv_fits(x, w)
        got = tops.gemv(x, w, b)
        want = x.double() @ w.double().t() + (b.double() if bias else 0)
        assert got.dtype == dtype and got.shape == (T, N)
        assert rel_err(got.double(), want) < TOL[dtype], (N, K)


def test_a_kernel_config_moves_the_bounds_and_the_tiles():
    """KernelConfig, passed explicitly, is what the kernels read: the token bounds of gemv and
    add_rms_norm move with it, and gemv with another tile (more, smaller programs) and warp count
    is still the float64 product."""
    g = torch.Generator().manual_seed(12)
    w = (torch.randn(40, 96, generator=g) / 96**0.5).to(DEVICE, torch.float32)
    x = torch.randn(4, 96, generator=g).to(DEVICE, torch.float32)
    wide = KernelConfig(gemv_max_tokens=4, norm_max_tokens=3, gemv_tile=1024, gemv_warps=4)
    assert not tops.gemv_fits(x, w) and tops.gemv_fits(x, w, wide)
    assert tops.add_rms_norm_fits(x, x) and not tops.add_rms_norm_fits(x, x, wide)
    got = tops.gemv(x, w, cfg=wide)
    assert rel_err(got.double(), x.double() @ w.double().t()) < TOL[torch.float32]


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16, torch.float32])
def test_gemv_matches_the_product(dt):
    """triton_ops.gemv (steps of one or two tokens) against the float64 product: its error at most
    that of cuBLAS on the same operands (both round once) plus a floor. Shapes: a row wider than a
    tile and not a power of two, a weight count that leaves the last program part-empty, a bias;
    a strided x goes to cuBLAS."""
    from model_wrapper.kernels import ops as triton_ops

    torch.manual_seed(1)
    for T, (N, K), bias in ((1, (96, 1000), False), (2, (4100, 512), True), (1, (300, 14336), False),
                            (2, (7, 4096), True)):
        w = torch.randn(N, K, device="cuda", dtype=dt) / K**0.5
        b = torch.randn(N, device="cuda", dtype=dt) if bias else None
        x = torch.randn(T, K, device="cuda", dtype=dt)
        assert triton_ops.gemv_fits(x, w)
        assert not triton_ops.gemv_fits(torch.randn(T, 2 * K, device="cuda", dtype=dt)[:, ::2], w)
        want = x.double() @ w.double().t() + (b.double() if bias else 0)
        got = triton_ops.gemv(x, w, b)
        blas = torch.nn.functional.linear(x, w, b)
        assert got.dtype == dt and got.shape == (T, N)
        floor = 1e-6 if dt == torch.float32 else 1e-3
        assert (got.double() - want).abs().max() <= 2 * (blas.double() - want).abs().max() + floor, (T, N, K, dt)
    w = torch.randn(64, 64, device="cuda", dtype=dt)
    assert not triton_ops.gemv_fits(torch.randn(3, 64, device="cuda", dtype=dt), w)  # more tokens: cuBLAS
    other = torch.float16 if dt != torch.float16 else torch.bfloat16
    assert not triton_ops.gemv_fits(torch.randn(1, 64, device="cuda", dtype=other), w)


def test_programs_of_several_row_blocks():
    """gemv_rounds: a program takes its tile as several row blocks in turn (the next block's loads
    before the products of the one before), the last program's blocks partly or wholly past N; with
    a bias and the SiLU epilogue, one and two tokens: still the float64 product. The plan: rounds
    only within gemv_rounds_max_tokens / gemv_rounds_max_k and without the norm prologue, the tile
    split among them."""
    from model_wrapper.kernels.gemv import gemv_plan

    cfg = KernelConfig(gemv_rounds=3, gemv_tile=3072, gemv_warps=4, gemv_rounds_max_tokens=2)
    assert gemv_plan(1, 448, False, cfg=cfg) == dict(KP=512, ROUNDS=3, BLOCK_N=2)
    assert gemv_plan(1, 448, False, norm=True, cfg=cfg)["ROUNDS"] == 1
    assert gemv_plan(3, 448, False, cfg=cfg)["ROUNDS"] == 1  # past gemv_rounds_max_tokens
    assert gemv_plan(1, 16384, False, cfg=cfg)["ROUNDS"] == 1  # past gemv_rounds_max_k
    assert gemv_plan(1, 4096, False) == dict(KP=4096, ROUNDS=1, BLOCK_N=4)  # the default: one block
    g = torch.Generator().manual_seed(6)
    for T, N, K, bias, silu in ((1, 11, 448, True, False), (2, 7, 448, False, True), (2, 25, 300, True, True)):
        w = (torch.randn((2 if silu else 1) * N, K, generator=g) / K**0.5).to(DEVICE, torch.float32)
        b = torch.randn(w.shape[0], generator=g).to(DEVICE, torch.float32) if bias else None
        x = torch.randn(T, K, generator=g).to(DEVICE, torch.float32)
        want = x.double() @ w.double().t() + (b.double() if bias else 0)
        if silu:
            gate, up = want.chunk(2, dim=-1)
            want = torch.nn.functional.silu(gate) * up
        got = tops.gemv(x, w, b, silu=silu, cfg=cfg)
        assert got.shape == (T, N)
        assert rel_err(got.double(), want) < TOL[torch.float32], (T, N, K)
