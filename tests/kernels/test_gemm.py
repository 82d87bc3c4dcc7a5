"""The Triton skinny GEMM (model_wrapper/kernels/gemm.py, steps of 3-64 tokens on Hopper) against the
float64 product: under Triton's interpreter in fp32 / fp16 for every config class, and in bf16 / fp16
on CUDA (marked cuda) with its error bounded by cuBLAS's on the same operands, and its fits rules."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, TOL, on_cuda_skip  # first: it sets up the interpreter

import model_wrapper.kernels.ops as tops  # noqa: E402
from model_wrapper.kernels.gemm import _skinny_config  # noqa: E402
from conftest import rel_err  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_skinny_gemm_is_the_product_for_every_token_count_and_config(dtype):
    """kernels.skinny_gemm (the projections of 3-64-token steps on Hopper) against the float64
    product: token counts that pad to each of 16 / 32 / 64, a K that is not a multiple of the K
    step, a last program with rows past N, a bias, and each config class of _skinny_config (its
    rows per program and K steps). bf16 runs on CUDA (test_skinny_gemm_matches_the_product, below)."""
    g = torch.Generator().manual_seed(4)
    cases = ((3, 70, 300, True), (17, 6150, 64, False), (64, 100, 520, True), (33, 12300, 32, True),
             (9, 33, 1000, False), (20, 50, 1100, True), (4, 40, 8300, True), (5, 40, 4100, False),
             (6, 2100, 4100, True), (20, 50, 4100, False), (20, 2100, 2200, True), (40, 2100, 2200, False))
    used = {_skinny_config(max(16, 1 << (M - 1).bit_length()), N, K) for M, N, K, _ in cases}
    assert used == {(64, 256, 3, 4), (16, 256, 6, 2), (32, 512, 3, 4), (32, 256, 4, 4), (128, 128, 3, 8),
                    (16, 512, 3, 4), (32, 512, 4, 4), (64, 256, 4, 4), (16, 512, 4, 4)}
    for M, N, K, bias in cases:
        w = (torch.randn(N, K, generator=g) / K**0.5).to(DEVICE, dtype)
        b = torch.randn(N, generator=g).to(DEVICE, dtype) if bias else None
        x = torch.randn(M, K, generator=g).to(DEVICE, dtype)
        got = tops.skinny_gemm(x, w, b)
        want = x.double() @ w.double().t() + (b.double() if bias else 0)
        assert got.dtype == dtype and got.shape == (M, N)
        assert rel_err(got.double(), want) < TOL[dtype], (M, N, K)


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_skinny_gemm_matches_the_product(dt):
    """triton_ops.skinny_gemm (steps of 3-64 tokens on Hopper) against the float64 product: its
    error at most that of cuBLAS on the same operands plus a floor, at token counts padding to
    16 / 32 / 64 and on shapes of each config class (Llama-3-8B's qkv, o, gate_up, down, a ragged N
    with a bias, Qwen3-30B-A3B's qkv, o and router); its fits rules."""
    from model_wrapper.kernels import ops as triton_ops

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the skinny GEMM runs on sm90 only")
    torch.manual_seed(2)
    for M in (3, 16, 31, 64):
        for (N, K), bias in (((6144, 4096), False), ((4096, 4096), False), ((28672, 4096), False),
                             ((4096, 14336), False), ((1000, 520), True),  # and Qwen3-30B-A3B's qkv, o, router
                             ((5120, 2048), False), ((2048, 4096), False), ((128, 2048), False)):
            w = torch.randn(N, K, device="cuda", dtype=dt) / K**0.5
            b = torch.randn(N, device="cuda", dtype=dt) if bias else None
            x = torch.randn(M, K, device="cuda", dtype=dt)
            assert triton_ops.skinny_fits(x, w)
            want = x.double() @ w.double().t() + (b.double() if bias else 0)
            got = triton_ops.skinny_gemm(x, w, b)
            blas = torch.nn.functional.linear(x, w, b)
            assert got.dtype == dt and got.shape == (M, N)
            assert (got.double() - want).abs().max() <= 2 * (blas.double() - want).abs().max() + 1e-3, (M, N, K)
    w = torch.randn(64, 64, device="cuda", dtype=dt)
    assert not triton_ops.skinny_fits(torch.randn(2, 64, device="cuda", dtype=dt), w)  # the GEMV's
    assert not triton_ops.skinny_fits(torch.randn(65, 64, device="cuda", dtype=dt), w)  # cuBLAS's
    assert not triton_ops.skinny_fits(torch.randn(8, 128, device="cuda", dtype=dt)[:, ::2], w)
    assert not triton_ops.skinny_fits(torch.randn(8, 64, device="cuda"), w.float())  # fp32: cuBLAS
