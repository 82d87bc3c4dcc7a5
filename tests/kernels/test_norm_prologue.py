"""The residual add + RMSNorm fused into the prologue of the GEMVs that consume the normalized rows
(KernelConfig.gemv_add_norm): kernels/gemv.py and kernels/fp8_gemv.py with add_norm against the unfused pair, kernels/norm.add_rms_norm then the
same GEMV. Under Triton's interpreter (fp32 / fp16: its bf16 conversions are not the GPU's) the
two run the same operations in the same order, so the outputs and the new residual are bit-equal;
on CUDA (marked cuda) the residual is bit-equal and the product within one rounding of the
output dtype (the sum of squares may be reduced in another order in the GEMV's register layout,
moving the normalized rows by at most an ulp of the dtype)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, INTERPRET, TOL, on_cuda_skip  # first: it sets up the interpreter

import model_wrapper.kernels.ops as tops  # noqa: E402
from model_wrapper.kernels import KernelConfig  # noqa: E402
from model_wrapper.kernels.norm import add_rms_norm  # noqa: E402
from conftest import rel_err  # noqa: E402

DTYPES = [torch.float32, torch.float16] if INTERPRET else [torch.bfloat16, torch.float16]


def _rows(g, T, K, dtype):
    """h, residual [T, K] and a norm weight [K] (around 1, as trained norms are)."""
    h, r = (torch.randn(T, K, generator=g).to(DEVICE, dtype) for _ in range(2))
    nw = (1 + 0.1 * torch.randn(K, generator=g)).to(DEVICE, dtype)
    return h, r, nw


def _unfused(h, r, nw, eps):
    """-> (the normalized rows, the new residual) by the standalone kernel (in place on copies)."""
    x, res = h.clone(), r.clone()
    add_rms_norm(x, res, nw, eps)
    return x, res


def _check(got, want, dtype):
    if INTERPRET:
        assert torch.equal(got, want)
    else:  # one rounding of the output dtype (module docstring)
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7 if dtype == torch.bfloat16 else 2 ** -10,
                                   atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("silu", [False, True], ids=["plain", "silu"])
def test_gemv_with_add_norm_is_the_norm_then_the_gemv(dtype, silu):
    """kernels.gemv(add_norm=...) = add_rms_norm, then gemv: the product, residual_out = h + residual,
    and h, residual unchanged; rows not a power of two, several programs (program 0 alone writes the
    residual), a bias, one and two tokens."""
    g = torch.Generator().manual_seed(5)
    for T, N, K, bias in ((1, 70, 1000, True), (2, 40, 512, False), (2, 9, 96, True)):
        h, r, nw = _rows(g, T, K, dtype)
        rows = 2 * N if silu else N
        w = (torch.randn(rows, K, generator=g) / K**0.5).to(DEVICE, dtype)
        b = torch.randn(rows, generator=g).to(DEVICE, dtype) if bias else None
        h0, r0 = h.clone(), r.clone()
        r_out = torch.empty_like(r)
        cfg = KernelConfig(gemv_tile=4 * triton_pow2(K))  # 4 rows a program: several programs
        got = tops.gemv(h, w, b, silu=silu, cfg=cfg, add_norm=(r, nw, 1e-5, r_out))
        x, want_r = _unfused(h, r, nw, 1e-5)
        want = tops.gemv(x, w, b, silu=silu, cfg=cfg)
        assert torch.equal(r_out, want_r) and torch.equal(h, h0) and torch.equal(r, r0)
        _check(got, want, dtype)


def triton_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("silu", [False, True], ids=["plain", "silu"])
def test_fp8_gemv_with_add_norm_is_the_norm_then_the_gemv(dtype, silu):
    """kernels/fp8_gemv.fp8_gemv(add_norm=...) = add_rms_norm, then fp8_gemv: block groups (K a
    multiple of 128 and not), one scale a row, a bias, several programs. Its sum of squares runs over
    [chunks, 16] (another order than the standalone kernel's, even under the interpreter): the
    normalized rows may differ by an ulp of the dtype, the product within the GEMV's tolerance."""
    from model_wrapper.kernels.fp8_gemv import fp8_gemv

    g = torch.Generator().manual_seed(6)
    for T, N, K, group, bias in ((1, 33, 1024, 128, True), (2, 17, 1000, 1000, False), (2, 12, 400, 128, True)):
        h, r, nw = _rows(g, T, K, dtype)
        rows = 2 * N if silu else N
        w = (torch.randn(rows, K, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn).to(DEVICE)
        s = (torch.exp(torch.randn(rows, -(-K // group), generator=g)) / (64 * K**0.5)).to(DEVICE)
        b = torch.randn(rows, generator=g).to(DEVICE, dtype) if bias else None
        h0, r0 = h.clone(), r.clone()
        r_out = torch.empty_like(r)
        cfg = KernelConfig(fp8_gemv_tile=4 * 1024 * T * (2 if silu else 1))  # a few rows a program
        got = fp8_gemv(h, w, s, group, b, silu=silu, cfg=cfg, add_norm=(r, nw, 1e-5, r_out))
        x, want_r = _unfused(h, r, nw, 1e-5)
        want = fp8_gemv(x, w, s, group, b, silu=silu, cfg=cfg)
        assert torch.equal(r_out, want_r) and torch.equal(h, h0) and torch.equal(r, r0)
        assert rel_err(got.double(), want.double()) < TOL[dtype], (T, N, K, group)
