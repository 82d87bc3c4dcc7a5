"""CPU tests of attention/fa3_fp8.py's host helpers and KernelConfig.fp8_kv_prefill (the kernel itself:
test_fa3_fp8_prefill_cuda.py, `pytest -m cuda` on sm90)."""

from __future__ import annotations

import pytest
import torch
from triton_interpret import INTERPRET  # first: it sets up Triton's interpreter for the one-pass kernel

from model_wrapper.attention.fa3_fp8 import E4M3, head_scales, prebuilt, quantize_q, supported
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.kernels import KernelConfig


def _e4m3_grid() -> torch.Tensor:
    """Every finite float8_e4m3fn value, ascending, in float64 (decoded from the bit pattern by hand:
    sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 subnormal; 0x7F / 0xFF are NaN)."""
    vals = set()
    for b in range(256):
        if b & 0x7F == 0x7F:
            continue
        s, e, m = -1.0 if b >> 7 else 1.0, (b >> 3) & 0xF, b & 0x7
        vals.add(s * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)))
    return torch.tensor(sorted(vals), dtype=torch.float64)


def _nearest(x: torch.Tensor) -> torch.Tensor:
    """Round float64 values to the nearest e4m3 value, ties to the even mantissa, saturating at +-448."""
    grid = _e4m3_grid()
    x = x.clamp(-448, 448)
    i = torch.searchsorted(grid, x).clamp(1, grid.numel() - 1)
    lo, hi = grid[i - 1], grid[i]
    pick_hi = (hi - x) < (x - lo)
    tie = (hi - x) == (x - lo)
    hi_even = (hi.to(torch.float32).to(E4M3).view(torch.uint8) & 1) == 0
    return torch.where(pick_hi | (tie & hi_even), hi, lo)


@pytest.mark.parametrize("one_pass", [False, True], ids=["torch", "one-pass-kernel"])
@pytest.mark.parametrize("heads", [slice(None, None, 2), slice(0, 3)], ids=["strided-heads", "strided-rows"])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_quantize_q_rounds_to_the_nearest_e4m3(scale, heads, one_pass):
    """Both paths (torch's clamp + cast; the one-pass Triton kernel, under the interpreter on the CPU) give the
    nearest e4m3, ties to even, saturating, for q views with strided rows (as qkv's q is) or strided heads."""
    dev = "cuda" if not INTERPRET else "cpu"
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(7, 4, 16, generator=g) * torch.logspace(-4, 3, 16)).to(torch.bfloat16)
    q[0, 0, :4] = torch.tensor([500.0, -1000.0, 448.0, 0.0])
    q[1, 0, :4] = torch.tensor([15.0, 17.0, -0.0068359375, 0.0029296875])  # 15 exact; ties: 16 | 18, subnormals
    q8 = quantize_q(q.to(dev)[:, heads], scale, one_pass=one_pass).cpu()
    assert q8.dtype == E4M3 and q8.shape == q[:, heads].shape and q8.is_contiguous()
    want = _nearest(q[:, heads].double() / scale)
    assert torch.equal(q8.double(), want)


def test_head_scales_repeat_each_layer_scale_per_kv_head():
    scales = torch.tensor([[0.5, 2.0, 3.0], [0.25, 4.0, 8.0]])
    hs = head_scales(scales, 4)
    assert hs.shape == (2, 3, 4) and hs.is_contiguous()
    for kv in range(2):
        for layer in range(3):
            assert torch.equal(hs[kv, layer], torch.full((4,), float(scales[kv, layer])))


def test_fa3_fp8_needs_an_sm90_gpu_and_its_head_dims():
    assert not supported(128, torch.device("cpu"))
    assert not supported(96, torch.device("cpu"))
    try:
        import flashinfer  # noqa: F401
    except ImportError:  # no FlashInfer: nothing is known to be built ("auto" stays on fa2)
        assert not prebuilt(128, torch.bfloat16)


def test_fp8_kv_prefill_refuses_unknown_kernels():
    assert KernelConfig().fp8_kv_prefill == "auto"
    assert KernelConfig(fp8_kv_prefill="fa2").fp8_kv_prefill == "fa2"
    with pytest.raises(ModelLoadError, match="fp8_kv_prefill: expected one of .*'fa2'.*got 'fa4'") as e:
        KernelConfig(fp8_kv_prefill="fa4")
    assert e.value.code == ModelErrorCode.BAD_CONFIG
