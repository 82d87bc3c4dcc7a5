"""The residual add + RMSNorm fused into the prologue of the GEMVs that consume the normalized rows
(KernelConfig.gemv_add_norm): kernels/gemv.py, kernels/fp8_gemv.py and the MoE router
(kernels/moe_route.py) with add_norm against the unfused pair, kernels/norm.add_rms_norm then the
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

from triton_interpret import DEVICE, INTERPRET, on_cuda_skip  # first: it sets up the interpreter

import model_wrapper.kernels.ops as tops  # noqa: E402
from model_wrapper.kernels import KernelConfig  # noqa: E402
from model_wrapper.kernels.norm import add_rms_norm  # noqa: E402

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
