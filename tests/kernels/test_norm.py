"""The norm kernels: Triton's add + RMSNorm against the reference arithmetic under the interpreter,
and on CUDA (marked cuda) FlashInferKernels' rms_norm, add_rms_norm and RoPE against TorchKernels."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, TOL, needs_flashinfer, on_cuda_skip  # first: it sets up the interpreter

import model_wrapper.kernels.ops as tops  # noqa: E402
from model_wrapper.config import RopeConfig  # noqa: E402
from model_wrapper.layers.kernels import FlashInferKernels, TorchKernels  # noqa: E402
from model_wrapper.layers.rotary import inv_frequencies  # noqa: E402
from conftest import rel_err  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_add_rms_norm_is_the_reference_residual_add_and_norm(dtype):
    """kernels.add_rms_norm (before the GEMV of one- and two-token steps), in place, against the
    reference arithmetic (norm.rms_norm: transformers' LlamaRMSNorm) on rows that are not a power of two."""
    from model_wrapper.layers.norm import rms_norm

    g = torch.Generator().manual_seed(3)
    x, r = (torch.randn(2, 1000, generator=g).to(DEVICE, dtype) for _ in range(2))
    w = torch.rand(1000, generator=g).to(DEVICE, dtype)
    want_r = r + x
    want = rms_norm(want_r, w, 1e-5)
    assert tops.add_rms_norm_fits(x, r)
    tops.add_rms_norm(x, r, w, 1e-5)
    assert torch.equal(r, want_r)
    assert rel_err(x.double(), want.double()) < TOL[dtype]


@pytest.mark.cuda
@on_cuda_skip
@needs_flashinfer
def test_fused_kernels_match_torch():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    inv = inv_frequencies(RopeConfig(theta=5e5, rope_type="llama3", factor=8.0, original_max_position_embeddings=64), 128).to(dev)
    ref, fused = TorchKernels(inv, dt), FlashInferKernels(inv, dt, 4096)
    x = torch.randn(37, 512, device=dev, dtype=dt)
    r = torch.randn(37, 512, device=dev, dtype=dt)
    w = torch.randn(512, device=dev, dtype=dt)
    torch.testing.assert_close(fused.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), rtol=2e-2, atol=2e-2)
    a, ra = ref.add_rms_norm(x.clone(), r.clone(), w, 1e-5)
    # up to NORM_MAX_TOKENS rows (37 here, and a two-token step) Triton's add + RMSNorm, beyond
    # them FlashInfer's: both against the reference
    assert fused._triton.add_rms_norm_fits(x, r) and fused._triton.add_rms_norm_fits(x[:2], r[:2])
    for n in (2, 37):
        b2, rb2 = fused.add_rms_norm(x[:n].clone(), r[:n].clone(), w, 1e-5)
        torch.testing.assert_close(rb2, ra[:n], rtol=0, atol=0)
        torch.testing.assert_close(b2, a[:n], rtol=2e-2, atol=2e-2)
    big_x, big_r = torch.randn(2, 70, 512, device=dev, dtype=dt)
    assert not fused._triton.add_rms_norm_fits(big_x, big_r)
    a3, ra3 = ref.add_rms_norm(big_x.clone(), big_r.clone(), w, 1e-5)
    b3, rb3 = fused.add_rms_norm(big_x.clone(), big_r.clone(), w, 1e-5)
    torch.testing.assert_close(rb3, ra3, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(b3, a3, rtol=2e-2, atol=2e-2)
    pos = torch.randint(0, 4000, (37,), device=dev)
    qkv = torch.randn(37, (8 + 2 * 2) * 128, device=dev, dtype=dt)  # rotate views of a fused qkv
    q = qkv[:, : 8 * 128].view(37, 8, 128)
    k = qkv[:, 8 * 128 : 10 * 128].view(37, 2, 128)
    qr, kr = ref.rope(q.clone(), k.clone(), ref.rope_tables(pos))
    qf, kf = fused.rope(q, k, fused.rope_tables(pos))
    torch.testing.assert_close(qf.float(), qr.float(), rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(kf.float(), kr.float(), rtol=3e-2, atol=3e-2)
