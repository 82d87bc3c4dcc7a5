"""SiLU-and-mul in the epilogue of the GEMV, the skinny GEMM and the wide gate_up GEMM against
silu(gate) * up of the product: under Triton's interpreter (fp32 / fp16), and in bf16 on CUDA
through FlashInferKernels.gate_up_silu (marked cuda) with its error bounded by cuBLAS +
silu_and_mul on the same operands."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import (  # first: it sets up the interpreter
    DEVICE, INTERPRET, TOL, needs_flashinfer, on_cuda_skip)

import model_wrapper.kernels.ops as tops  # noqa: E402
from model_wrapper.kernels import gemm  # noqa: E402
from model_wrapper.config import RopeConfig  # noqa: E402
from model_wrapper.kernels import KernelConfig  # noqa: E402
from model_wrapper.layers.kernels import FlashInferKernels  # noqa: E402
from model_wrapper.layers.rotary import inv_frequencies  # noqa: E402
from conftest import rel_err  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_gemv_and_skinny_gemm_with_silu_are_silu_and_mul_of_the_product(dtype):
    """silu=True (kernels.gate_up_silu: the MLP's gate_up projection with SiLU-and-mul in its
    epilogue) of kernels.gemv (1-2 tokens) and skinny_gemm (3-64): against silu(gate) * up of
    the float64 product rounded to the dtype (as the unfused GEMM's output), gate rows first;
    output widths that leave the last program part-filled, with and without a bias."""
    g = torch.Generator().manual_seed(6)
    for M, n, K, bias in ((1, 37, 300, True), (2, 5, 1000, False), (5, 40, 520, True), (33, 70, 256, False),
                          (64, 17, 64, True), (4, 20, 8300, True)):
        w = (torch.randn(2 * n, K, generator=g) / K**0.5).to(DEVICE, dtype)
        b = torch.randn(2 * n, generator=g).to(DEVICE, dtype) if bias else None
        x = torch.randn(M, K, generator=g).to(DEVICE, dtype)
        y = (x.double() @ w.double().t() + (b.double() if bias else 0)).to(dtype).double()
        want = torch.nn.functional.silu(y[:, :n]) * y[:, n:]
        got = (tops.gemv if M <= KernelConfig().gemv_max_tokens else tops.skinny_gemm)(x, w, b, silu=True)
        assert got.dtype == dtype and got.shape == (M, n)
        assert rel_err(got.double(), want) < TOL[dtype], (M, n, K)


def test_wide_gate_up_silu_is_silu_and_mul_of_the_product(monkeypatch):
    """kernels.wide_gate_up_silu (the gate_up projection of prefills of KernelConfig.wide_min_tokens or more
    on Hopper) in fp16 against silu(gate) * up of the float64 product rounded to fp16, gate rows
    first, with and without a bias; with small tiles, so that rows and columns both span several
    tiles, the last ones part-filled, and K is not a multiple of its step. bf16 runs on CUDA
    (test_wide_gate_up_silu_matches_the_unfused_pair, below)."""
    if not INTERPRET and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wide GEMM (TMA) runs on sm90 only")
    monkeypatch.setattr(gemm, "_wide_config", lambda M: (32, 32, 32, 2, 4, 2))
    g = torch.Generator().manual_seed(8)
    dt = torch.float16
    for M, n, K, bias in ((70, 48, 80, False), (33, 80, 200, True)):
        w = (torch.randn(2 * n, K, generator=g) / K**0.5).to(DEVICE, dt)
        b = torch.randn(2 * n, generator=g).to(DEVICE, dt) if bias else None
        x = torch.randn(M, K, generator=g).to(DEVICE, dt)
        y = (x.double() @ w.double().t() + (b.double() if bias else 0)).to(dt).double()
        want = torch.nn.functional.silu(y[:, :n]) * y[:, n:]
        got = tops.wide_gate_up_silu(x, w, b)
        assert got.dtype == dt and got.shape == (M, n)
        assert rel_err(got.double(), want) < TOL[dt], (M, n, K)


@pytest.mark.cuda
@on_cuda_skip
@needs_flashinfer
def test_gate_up_silu_matches_the_unfused_pair():
    """kernels.gate_up_silu (SiLU-and-mul in the GEMV's / skinny GEMM's epilogue) on Llama-3-8B's
    gate_up shape in bf16, 1-64 tokens: against silu(gate) * up of the float64 product rounded to
    bf16, its error at most that of cuBLAS + silu_and_mul on the same operands plus a floor."""
    from model_wrapper.kernels import ops as triton_ops

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the skinny GEMM runs on sm90 only")
    torch.manual_seed(3)
    inv = inv_frequencies(RopeConfig(theta=5e5), 128).to("cuda")
    fused = FlashInferKernels(inv, torch.bfloat16, 64)
    n, K = 14336, 4096
    w = torch.randn(2 * n, K, device="cuda", dtype=torch.bfloat16) / K**0.5
    for M in (1, 2, 3, 16, 64):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        y = (x.double() @ w.double().t()).to(torch.bfloat16).double()
        want = torch.nn.functional.silu(y[:, :n]) * y[:, n:]
        pair = triton_ops.silu_and_mul(torch.nn.functional.linear(x, w))
        got = fused.gate_up_silu(x, w)
        assert got.shape == (M, n)
        assert (got.double() - want).abs().max() <= 2 * (pair.double() - want).abs().max() + 1e-3, M


@pytest.mark.cuda
@on_cuda_skip
@needs_flashinfer
def test_wide_gate_up_silu_matches_the_unfused_pair():
    """triton_ops.wide_gate_up_silu (prefills of WIDE_MIN_TOKENS or more on Hopper) in bf16 on
    Llama-3-8B's gate_up shape and on a small one with a bias, at token counts that fill tiles and
    that do not, through kernels.gate_up_silu: against silu(gate) * up of the float64 product
    rounded to bf16, its error at most that of cuBLAS + silu_and_mul on the same operands plus a
    floor. And its fits rules."""
    from model_wrapper.kernels import ops as triton_ops

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wide GEMM runs on sm90 only")
    torch.manual_seed(4)
    bf = torch.bfloat16
    fused = FlashInferKernels(inv_frequencies(RopeConfig(theta=5e5), 128).to("cuda"), bf, 64)
    for M in (1024, 1100, 4096):
        for (n, K), bias in (((14336, 4096), False), ((520, 1032), True)):
            w = torch.randn(2 * n, K, device="cuda", dtype=bf) / K**0.5
            b = torch.randn(2 * n, device="cuda", dtype=bf) if bias else None
            x = torch.randn(M, K, device="cuda", dtype=bf)
            assert triton_ops.wide_silu_fits(x, w)
            y = (x.double() @ w.double().t() + (b.double() if bias else 0)).to(bf).double()
            want = torch.nn.functional.silu(y[:, :n]) * y[:, n:]
            pair = triton_ops.silu_and_mul(torch.nn.functional.linear(x, w, b))
            got = fused.gate_up_silu(x, w, b)
            assert got.shape == (M, n) and got.dtype == bf
            assert (got.double() - want).abs().max() <= 2 * (pair.double() - want).abs().max() + 1e-3, (M, n)
    w = torch.randn(128, 64, device="cuda", dtype=bf)
    assert not triton_ops.wide_silu_fits(torch.randn(KernelConfig().wide_min_tokens - 1, 64, device="cuda", dtype=bf), w)
    assert not triton_ops.wide_silu_fits(torch.randn(2048, 128, device="cuda", dtype=bf)[:, ::2], w)  # column stride 2
    assert not triton_ops.wide_silu_fits(torch.randn(2048, 64, device="cuda"), w.float())  # fp32: cuBLAS
    assert not triton_ops.wide_silu_fits(torch.randn(2048, 60, device="cuda", dtype=bf), w[:, :60].contiguous())
