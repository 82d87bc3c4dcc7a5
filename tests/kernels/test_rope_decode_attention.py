"""RoPE, the K/V store and the decode attention in one kernel (kernels/decode_attention.rope_decode_attention)
against a direct computation: q and k of the step's qkv rows RMS-normalised (Qwen3's q / k norms) and rotated in
float64, k and v placed by hand at each request's slot, then softmax(q k^T * scale) v over the request's keys
gathered page by page from the caches (float64). The cache rows at the step's slots hold NaN before the call, so an
attention that read them before the kernel wrote them would be NaN.

Without a GPU the kernel runs under Triton's interpreter in fp16 (tests/triton_interpret.py); on CUDA in bf16 with
pages of 16 and head_dim 128 (`pytest -m cuda`). The graphs that run it inside a model are checked against eager
steps and transformers in tests/model_wrapper/test_cuda_model.py.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import INTERPRET  # before the kernel: sets up the interpreter

from model_wrapper.kernels.decode_attention import paged_decode_attention, rope_decode_attention
from model_wrapper.kernels.kv_store import rope_store_kv
from test_decode_attention import D, DTYPE, PAGE, _direct  # noqa: F401 (the same pages, head size and softmax)

DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = [] if INTERPRET else [pytest.mark.cuda]
FP8 = torch.float8_e4m3fn
EPS = 1e-6


def _table(positions: int) -> torch.Tensor:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()


def _case(lens, heads, kv_heads, seed, cache_dtype):
    """Paged caches (pages scattered), their metadata, each request's slot of its last key (the step's own, NaN in
    a 16-bit cache before the call) and a step's qkv rows, positions and q / k norm weights."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // PAGE) for n in lens]
    blocks = sum(pages) + 5
    k = torch.randn(blocks, PAGE, kv_heads, D, generator=g)
    v = torch.randn(blocks, PAGE, kv_heads, D, generator=g)
    if cache_dtype == FP8:
        k, v = (k * 20).clamp(-448, 448).to(FP8), (v * 5).to(FP8)
    else:
        k, v = k.to(cache_dtype), v.to(cache_dtype)
    order = torch.randperm(blocks, generator=g)
    tables, at = [], 0
    for n in pages:
        tables.append(order[at:at + n])
        at += n
    slots = torch.tensor([int(t[(n - 1) // PAGE]) * PAGE + (n - 1) % PAGE for t, n in zip(tables, lens)])
    if cache_dtype != FP8:
        for c in (k, v):
            c.view(-1, kv_heads, D)[slots] = float("nan")
    meta = (torch.tensor([0] + pages).cumsum(0).to(torch.int32), torch.cat(tables).to(torch.int32),
            torch.tensor([n - (p - 1) * PAGE for n, p in zip(lens, pages)], dtype=torch.int32))
    qkv = (2 * torch.randn(len(lens), (heads + 2 * kv_heads) * D, generator=g)).to(DTYPE)
    positions = torch.tensor([n - 1 + 3 * i for i, n in enumerate(lens)])
    qw, kw = ((1 + 0.5 * torch.randn(D, generator=g)).to(DTYPE) for _ in range(2))
    return k, v, tables, slots, meta, qkv, positions, (qw, kw)


def _rotated(x, positions, table, weight, rounded=False):
    """x [B, H, D] float64: RMS-normalised times weight (None: as it is), then rotated (neox form). rounded: the norm
    rounded to the dtype where transformers' Qwen3RMSNorm rounds (x / rms, then times the weight)."""
    if weight is not None:
        x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        x = (x.to(DTYPE).double() * weight.double()).to(DTYPE).double() if rounded else x * weight.double()
    cos, sin = table.double()[positions].split(D // 2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1)[:, None], torch.cat((sin, sin), -1)[:, None]
    return x * cos + torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1) * sin


def _run(k, v, meta, slots, qkv, positions, table, heads, kv_heads, norms, splits, window, scales):
    on = [x.to(DEVICE) for x in (k, v, *meta)]
    qk_norm = None if norms is None else (norms[0].to(DEVICE), norms[1].to(DEVICE), EPS)
    sc = {} if scales is None else dict(k_scale=torch.tensor([scales[0]], device=DEVICE),
                                        v_scale=torch.tensor([scales[1]], device=DEVICE))
    qkv_d = qkv.to(DEVICE)
    out = rope_decode_attention(qkv_d, positions.to(DEVICE), table.to(DEVICE), slots.to(DEVICE), heads, kv_heads, *on,
                                1 / math.sqrt(D), qk_norm=qk_norm, window=window, splits=splits,
                                block_n=8 if INTERPRET else 64, **sc)
    assert torch.equal(qkv_d.cpu(), qkv)  # the projection's rows are left as they are
    return out, on[0].cpu(), on[1].cpu()


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("splits", [1, 3, 16])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("window", [None, 5])
def test_one_kernel_is_rope_the_store_and_the_direct_softmax(heads, kv_heads, splits, qk_norm, window):
    """Requests of 1 key (the step's own only), a page and one, and several pages (the last part-filled); more
    splits than some requests have keys (the step's key in a split of its own or in the only one); GQA groups of 4
    and 1."""
    lens = [1, PAGE + 1, 9 * PAGE + 3, 70 if INTERPRET else 300]
    k, v, tables, slots, meta, qkv, positions, norms = _case(lens, heads, kv_heads, heads + splits, DTYPE)
    table = _table(int(positions.max()) + 1)
    norms = norms if qk_norm else None
    got, kc, vc = _run(k, v, meta, slots, qkv, positions, table, heads, kv_heads, norms, splits, window, None)
    x = qkv.double().view(len(lens), heads + 2 * kv_heads, D)
    q = _rotated(x[:, :heads], positions, table, None if norms is None else norms[0])
    k_new = _rotated(x[:, heads:heads + kv_heads], positions, table, None if norms is None else norms[1])
    tol = 2e-3 if DTYPE == torch.float16 else 1.6e-2  # the kernel rounds q, k, p and its output to the dtype
    torch.testing.assert_close(kc.view(-1, kv_heads, D)[slots].double(), k_new, atol=4 * tol, rtol=tol)
    assert torch.equal(vc.view(-1, kv_heads, D)[slots], qkv.view(len(lens), -1, D)[:, heads + kv_heads:])
    rest = torch.ones(kc.view(-1, kv_heads, D).shape[0], dtype=torch.bool)
    rest[slots] = False
    assert torch.equal(kc.view(-1, kv_heads, D)[rest], k.view(-1, kv_heads, D)[rest])  # nothing else written
    assert torch.equal(vc.view(-1, kv_heads, D)[rest], v.view(-1, kv_heads, D)[rest])
    want = _direct(q, kc, vc, tables, lens, 1 / math.sqrt(D), window)  # over the caches it wrote: k as the kernel rounded it
    torch.testing.assert_close(got.double().cpu(), want, atol=4 * tol, rtol=0)
    k_hand = k.clone()
    k_hand.view(-1, kv_heads, D)[slots] = k_new.to(DTYPE)
    want_hand = _direct(q, k_hand, vc, tables, lens, 1 / math.sqrt(D), window)  # k rotated here, in float64
    torch.testing.assert_close(got.double().cpu(), want_hand, atol=4 * tol, rtol=0)


@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_e4m3_cache_stores_the_rotated_k_and_v_over_their_scales(splits, qk_norm):
    """An e4m3 cache with K scale 0.05 and V scale 0.2: the step's slots hold e4m3(k_rot / 0.05) and e4m3(v / 0.2)
    (k_rot as the kernel rounds it to the dtype: within one e4m3 step of float64's), and the output is the direct
    softmax over K = e4m3 * 0.05, V = e4m3 * 0.2 of the caches it wrote."""
    lens = [1, PAGE + 1, 9 * PAGE + 3]
    heads, kv_heads = 8, 2
    k, v, tables, slots, meta, qkv, positions, norms = _case(lens, heads, kv_heads, 7 + splits, FP8)
    table = _table(int(positions.max()) + 1)
    norms = norms if qk_norm else None
    got, kc, vc = _run(k, v, meta, slots, qkv, positions, table, heads, kv_heads, norms, splits, None, (0.05, 0.2))
    x = qkv.double().view(len(lens), heads + 2 * kv_heads, D)
    q = _rotated(x[:, :heads], positions, table, None if norms is None else norms[0])
    # e4m3 of k / 0.05 with k as the kernel rounds it (the norm at transformers' points, the rotation once): one e4m3
    # step apart at most, where the float64 rotation and the kernel's fp32 one round to neighbouring dtype values
    k_new = _rotated(x[:, heads:heads + kv_heads], positions, table, None if norms is None else norms[1], rounded=True)
    stored_k = kc.view(-1, kv_heads, D)[slots].double() * 0.05
    torch.testing.assert_close(stored_k, (k_new.to(DTYPE).float() / 0.05).clamp(-448, 448).to(FP8).double() * 0.05,
                               atol=0.05 * 2**-9, rtol=2**-3)
    want_v = (qkv.view(len(lens), -1, D)[:, heads + kv_heads:].float() / 0.2).clamp(-448, 448).to(FP8)
    assert torch.equal(vc.view(-1, kv_heads, D)[slots].view(torch.uint8), want_v.view(torch.uint8))
    want = _direct(q, kc.double() * 0.05, vc.double() * 0.2, tables, lens, 1 / math.sqrt(D), None)
    tol = 2e-3 if DTYPE == torch.float16 else 1.6e-2
    torch.testing.assert_close(got.double().cpu(), want, atol=4 * tol, rtol=0)


@pytest.mark.parametrize("cache", ["16-bit", "e4m3"])
def test_the_cache_is_the_two_kernel_path_s(cache):
    """Without q / k norms the one kernel writes the caches kv_store.rope_store_kv writes, bit for bit (the same
    rotation per value), and attends as paged_decode_attention over them does."""
    lens = [2, 2 * PAGE + 1, 5 * PAGE]
    heads, kv_heads = 8, 2
    dt = FP8 if cache == "e4m3" else DTYPE
    k, v, tables, slots, meta, qkv, positions, _ = _case(lens, heads, kv_heads, 21, dt)
    table = _table(int(positions.max()) + 1)
    scales = (0.05, 0.2) if dt == FP8 else None
    got, kc, vc = _run(k, v, meta, slots, qkv, positions, table, heads, kv_heads, None, 4, None, scales)
    sc = {} if scales is None else dict(k_scale=torch.tensor([0.05], device=DEVICE),
                                        v_scale=torch.tensor([0.2], device=DEVICE))
    k2, v2, qkv2 = k.to(DEVICE), v.to(DEVICE), qkv.to(DEVICE)
    rope_store_kv(qkv2, positions.to(DEVICE), table.to(DEVICE), heads, kv_heads, D, k2, v2, slots.to(DEVICE), **sc)
    assert torch.equal(kc.view(torch.uint8) if dt == FP8 else kc, k2.cpu().view(torch.uint8) if dt == FP8 else k2.cpu())
    assert torch.equal(vc.view(torch.uint8) if dt == FP8 else vc, v2.cpu().view(torch.uint8) if dt == FP8 else v2.cpu())
    q2 = qkv2[:, : heads * D].view(len(lens), heads, D)
    two = paged_decode_attention(q2, k2, v2, *[m.to(DEVICE) for m in meta], 1 / math.sqrt(D), splits=4,
                                 block_n=8 if INTERPRET else 64, **sc)
    assert torch.equal(got, two)


def test_bad_qkv_is_refused():
    lens = [3]
    k, v, _, slots, meta, qkv, positions, _ = _case(lens, 8, 2, 1, DTYPE)
    with pytest.raises(ValueError, match=r"rope_decode_attention: qkv must be \[B, .*got"):
        rope_decode_attention(qkv[:, :-D], positions, _table(8), slots, 8, 2, k, v, *meta, 0.1)


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch: sm90+ GPUs")
@pytest.mark.parametrize("cache", ["16-bit", "e4m3"])
@pytest.mark.parametrize("splits", [1, 16])
def test_pdl_prefetch_launch_is_the_plain_launch(cache, splits):
    """The graphs' launch at batch 1-2 (PDL, the metadata read and the first K / V tile prefetched into L2 before
    the wait): the same output and caches as the launch without PDL, bit for bit, after a kernel that wrote qkv."""
    lens = [300, 9 * PAGE + 3]
    heads, kv_heads = 32, 8
    dt = FP8 if cache == "e4m3" else DTYPE
    k, v, _, slots, meta, qkv, positions, norms = _case(lens, heads, kv_heads, 31, dt)
    table = _table(int(positions.max()) + 1).to(DEVICE)
    sc = {} if dt != FP8 else dict(k_scale=torch.tensor([0.05], device=DEVICE), v_scale=torch.tensor([0.2], device=DEVICE))
    outs = []
    for pdl in (False, True):
        kc, vc = k.to(DEVICE), v.to(DEVICE)
        qkv_d = qkv.to(DEVICE) * 1  # written just before the launch
        o = rope_decode_attention(qkv_d, positions.to(DEVICE), table, slots.to(DEVICE), heads, kv_heads, kc, vc,
                                  *[m.to(DEVICE) for m in meta], 1 / math.sqrt(D),
                                  qk_norm=(norms[0].to(DEVICE), norms[1].to(DEVICE), EPS), splits=splits, pdl=pdl,
                                  prefetch=pdl, **sc)
        outs.append((o, kc.view(torch.uint8) if dt == FP8 else kc, vc.view(torch.uint8) if dt == FP8 else vc))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
