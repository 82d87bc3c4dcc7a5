"""RoPE (+ Qwen3's q / k norms) + the K/V store folded into the decode attention kernel
(kernels/decode_attention.rope_paged_decode_attention) against the two launches it replaces:
kernels/kv_store.rope_store_kv on a copy of qkv and the caches, then paged_decode_attention over
the rotated q. The same arithmetic on the same values: the caches bit-equal, the outputs bit-equal
under Triton's interpreter (on CUDA within a rounding: the q norm's sums may be ordered apart), and
both against a direct float64 softmax over the rotated keys (an oracle of neither kernel). The new key's
row is taken from registers in the fused launch: a stale row in the cache must not show (padding rows,
slot -1, read the cache's row, as the unfused launches do).

Without a GPU under Triton's interpreter in fp16 (tests/triton_interpret.py); on CUDA in bf16 with
pages of 16 and head_dim 128 (`pytest -m cuda`), Llama (GQA 4) and Qwen3 (q / k norms, GQA 8) shapes.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import INTERPRET  # before the kernels: sets up the interpreter

from model_wrapper.kernels.decode_attention import paged_decode_attention, rope_paged_decode_attention
from model_wrapper.kernels.kv_store import rope_store_kv

DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = [] if INTERPRET else [pytest.mark.cuda]
DTYPE = torch.float16 if INTERPRET else torch.bfloat16
PAGE, D = (4, 32) if INTERPRET else (16, 128)
FP8 = torch.float8_e4m3fn


def rope_table(P: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    f = torch.arange(P, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat((f.cos(), f.sin()), dim=-1)


def setup(lens, heads, kv_heads, seed, kv_dtype, pad_last=False):
    """Caches with each request's pages scattered, page metadata, the new token's slot (the last key of
    each request; -1 for the last request where pad_last: a graph's padding row), a random qkv."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // PAGE) for n in lens]
    blocks = sum(pages) + 5
    k = torch.randn(blocks, PAGE, kv_heads, D, generator=g)
    v = torch.randn(blocks, PAGE, kv_heads, D, generator=g)
    k, v = (k.to(FP8), v.to(FP8)) if kv_dtype == FP8 else (k.to(DTYPE), v.to(DTYPE))
    order = torch.randperm(blocks, generator=g)
    tables, at = [], 0
    for n in pages:
        tables.append(order[at:at + n])
        at += n
    indptr = torch.tensor([0] + pages).cumsum(0).to(torch.int32)
    indices = torch.cat(tables).to(torch.int32)
    last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(lens, pages)], dtype=torch.int32)
    slots = torch.tensor([int(tables[r][(n - 1) // PAGE]) * PAGE + (n - 1) % PAGE for r, n in enumerate(lens)])
    if pad_last:
        slots[-1] = -1
    qkv = (2 * torch.randn(len(lens), (heads + 2 * kv_heads) * D, generator=g)).to(DTYPE)
    return k, v, tables, indptr, indices, last, slots, qkv


def run_both(lens, heads, kv_heads, seed, kv_dtype=None, qk_norm=False, pad_last=False, **kw):
    """-> (fused out, fused caches, unfused out, unfused caches, qkv after the fused call, qkv before, inputs)."""
    kv_dtype = kv_dtype or DTYPE
    k, v, tables, indptr, indices, last, slots, qkv = setup(lens, heads, kv_heads, seed, kv_dtype, pad_last)
    g = torch.Generator().manual_seed(seed + 100)
    table = rope_table(max(lens) + 8)
    pos = torch.tensor([n - 1 for n in lens])
    norm = None
    if qk_norm:
        norm = ((1 + 0.5 * torch.randn(D, generator=g)).to(DEVICE, DTYPE),
                (1 + 0.5 * torch.randn(D, generator=g)).to(DEVICE, DTYPE), 1e-6)
    scales = {}
    if kv_dtype == FP8:
        scales = dict(k_scale=torch.tensor([0.02], device=DEVICE), v_scale=torch.tensor([0.05], device=DEVICE))
    dev = lambda *xs: [x.to(DEVICE) for x in xs]  # noqa: E731
    meta = dev(indptr, indices, last)
    scale = 1 / math.sqrt(D)
    kf, vf, qkv_f = dev(k.clone(), v.clone(), qkv.clone())
    got = rope_paged_decode_attention(qkv_f, pos.to(DEVICE), table.to(DEVICE), slots.to(DEVICE), heads, kv_heads,
                                      kf, vf, *meta, scale, qk_norm=norm, **scales, **kw)
    ku, vu, qkv_u = dev(k.clone(), v.clone(), qkv.clone())
    rope_store_kv(qkv_u, pos.to(DEVICE), table.to(DEVICE), heads, kv_heads, D, ku, vu, slots.to(DEVICE),
                  k_scale=scales.get("k_scale"), v_scale=scales.get("v_scale"), qk_norm=norm)
    want = paged_decode_attention(qkv_u[:, : heads * D].view(len(lens), heads, D), ku, vu, *meta, scale, **scales,
                                  **{x: kw[x] for x in kw if x != "early_tile"})
    return got, (kf, vf), want, (ku, vu), qkv_f, qkv, (tables, qkv_u, scales)


def direct(q, k, v, tables, lens, heads, kv_heads, scales, window=None):
    """softmax(q k^T / sqrt(D)) v in float64 over each request's (dequantized) keys gathered from the caches."""
    out = []
    ks, vs = (float(scales["k_scale"]), float(scales["v_scale"])) if scales else (1.0, 1.0)
    for r, n in enumerate(lens):
        t = torch.arange(n)
        rows = tables[r][t // PAGE] * PAGE + t % PAGE
        kr = (k.reshape(-1, kv_heads, D)[rows].double() * ks).repeat_interleave(heads // kv_heads, 1)
        vr = (v.reshape(-1, kv_heads, D)[rows].double() * vs).repeat_interleave(heads // kv_heads, 1)
        s = torch.einsum("hd,thd->ht", q[r].double(), kr) / math.sqrt(D)
        if window is not None:
            s[:, t < n - window] = float("-inf")
        out.append(torch.einsum("ht,thd->hd", s.softmax(-1), vr))
    return torch.stack(out)


def bits(x):
    return x.view(torch.uint8) if x.dtype == FP8 else x


LENS = [1, PAGE, PAGE + 1, 9 * PAGE + 3, 70 if INTERPRET else 600]


@pytest.mark.parametrize("kv", ["16-bit", "e4m3"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
@pytest.mark.parametrize("splits", [1, 3, 16])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("early_tile", [False, True], ids=["", "early-tile"])
def test_fused_equals_rope_store_then_attention(kv, qk_norm, splits, window, early_tile):
    """Lengths of 1 key (the new one alone), a page, a page and one, several pages, with empty splits; GQA 4;
    the last request a padding row (slot -1: nothing stored, its stale key read as the unfused path reads it);
    early_tile: the first tile loaded before q is made (its softmax step out of the loop)."""
    heads, kv_heads = 8, 2
    got, caches, want, ref_caches, qkv_after, qkv_before, (tables, qkv_u, scales) = run_both(
        LENS, heads, kv_heads, seed=splits + 7 * qk_norm, kv_dtype=FP8 if kv == "e4m3" else None, qk_norm=qk_norm,
        pad_last=True, window=window, splits=splits, block_n=8 if INTERPRET else None,
        **({"early_tile": True} if early_tile else {}))
    for c, rc in zip(caches, ref_caches):
        assert torch.equal(bits(c), bits(rc))  # the same K/V stored at the same slots, nothing else touched
    assert torch.equal(qkv_after.cpu(), qkv_before)  # the fused kernel leaves qkv as it was
    assert got.shape == (len(LENS), heads, D) and got.dtype == DTYPE
    if INTERPRET:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=0)
    q = qkv_u[:, : heads * D].view(len(LENS), heads, D).cpu()  # the rotated q (checked by the store's own tests)
    ref = direct(q, caches[0].cpu(), caches[1].cpu(), tables, LENS, heads, kv_heads, scales, window)
    tol = (4e-3 if DTYPE == torch.float16 else 3e-2) * (2 if kv == "e4m3" else 1)
    torch.testing.assert_close(got.double().cpu(), ref, atol=tol, rtol=0)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (32, 4)])
def test_fused_groups_and_min_split_keys(heads, kv_heads):
    """GQA groups of 1, 3 (padded to the MMA's rows) and 8 (Qwen3-30B-A3B's), with min_split_keys putting a short
    context on fewer splits: still the unfused result."""
    lens = [2, 5 * PAGE + 1, 40]
    got, caches, want, ref_caches, *_ = run_both(lens, heads, kv_heads, seed=heads, qk_norm=heads == 32, splits=8,
                                                 min_split_keys=16, block_n=8 if INTERPRET else None)
    for c, rc in zip(caches, ref_caches):
        assert torch.equal(c, rc)
    if INTERPRET:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=0)


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch: sm90+ GPUs")
@pytest.mark.parametrize("kv", ["16-bit", "e4m3"])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("early", ["wait first", "early", "early+prefetch", "early tile"])
def test_fused_under_pdl_equals_the_unfused_launches(kv, batch, early):
    """Launched as a programmatic dependent (the graphs' launch at batch 1-2), the split merge too; early: the
    metadata (and the RoPE inputs) read before the wait, in both launches (+ the first K / V tile prefetched)."""
    got, caches, want, ref_caches, *_ = run_both(LENS[-batch:], 32, 4, seed=batch, kv_dtype=FP8 if kv == "e4m3" else None,
                                                 qk_norm=True, splits=16, pdl=True, early_meta=early != "wait first",
                                                 prefetch=early == "early+prefetch", early_tile=early == "early tile")
    for c, rc in zip(caches, ref_caches):
        assert torch.equal(bits(c), bits(rc))
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=0)


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch: sm90+ GPUs")
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
def test_fused_repeated_under_pdl_is_deterministic(qk_norm):
    """Qwen3-30B-A3B's heads at batch 1, 512 keys, the other keys zero (as a fresh cache) and the new key's row
    holding another token's K / V before every call (a stale row): 200 calls under PDL, each the first's output
    bit for bit, and the unfused launches' within a rounding (bit-equal without q / k norms)."""
    heads, kv_heads, n = 32, 4, 512
    k, v, tables, indptr, indices, last, slots, qkv = setup([n], heads, kv_heads, 3, DTYPE)
    k.zero_()
    v.zero_()
    stale = torch.randn(kv_heads, D, generator=torch.Generator().manual_seed(9)).to(DTYPE)
    s0 = int(slots[0])
    k.view(-1, kv_heads, D)[s0] = stale
    v.view(-1, kv_heads, D)[s0] = -stale
    table = rope_table(n + 8).to(DEVICE)
    g = torch.Generator().manual_seed(10)
    norm = ((1 + 0.5 * torch.randn(D, generator=g)).to(DEVICE, DTYPE), (1 + 0.5 * torch.randn(D, generator=g)).to(
        DEVICE, DTYPE), 1e-6) if qk_norm else None
    meta = [x.to(DEVICE) for x in (indptr, indices, last)]
    pos, sl, x = torch.tensor([n - 1], device=DEVICE), slots.to(DEVICE), qkv.to(DEVICE)
    kd, vd = k.to(DEVICE), v.to(DEVICE)
    outs = []
    for i in range(200):
        kd.view(-1, kv_heads, D)[s0] = stale.to(DEVICE)
        vd.view(-1, kv_heads, D)[s0] = -stale.to(DEVICE)
        xi = x * 1  # written by a kernel just before the launch, as qkv's GEMV
        outs.append(rope_paged_decode_attention(xi, pos, table, sl, heads, kv_heads, kd, vd, *meta, 1 / math.sqrt(D),
                                                qk_norm=norm, splits=16, pdl=True, early_meta=i % 2 == 1))
    ku, vu, xu = k.to(DEVICE), v.to(DEVICE), x.clone()
    rope_store_kv(xu, pos, table, heads, kv_heads, D, ku, vu, sl, qk_norm=norm)
    want = paged_decode_attention(xu[:, : heads * D].view(1, heads, D), ku, vu, *meta, 1 / math.sqrt(D), splits=16)
    bad = [i for i, o in enumerate(outs) if not torch.equal(o, outs[0])]
    assert not bad, f"{len(bad)} of 200 calls differ from the first"
    assert torch.equal(kd, ku) and torch.equal(vd, vu)
    if qk_norm:
        torch.testing.assert_close(outs[0].float(), want.float(), atol=2e-2, rtol=0)
    else:
        assert torch.equal(outs[0], want)


def test_min_split_keys_is_the_same_attention():
    """paged_decode_attention with min_split_keys (fewer, longer splits at short contexts) against the direct softmax
    and its even split."""
    k, v, tables, indptr, indices, last, _, qkv = setup(LENS, 8, 2, seed=5, kv_dtype=DTYPE)
    q = qkv[:, : 8 * D].view(len(LENS), 8, D)
    on = [x.to(DEVICE) for x in (q, k, v, indptr, indices, last)]
    bn, tol = (8, 2e-3) if INTERPRET else (64, 1.6e-2)
    even = paged_decode_attention(*on, 1 / math.sqrt(D), splits=16, block_n=bn)
    ref = direct(q, k, v, tables, LENS, 8, 2, {})
    for m in (1, 16, 1000):
        fewer = paged_decode_attention(*on, 1 / math.sqrt(D), splits=16, block_n=bn, min_split_keys=m)
        torch.testing.assert_close(fewer.double().cpu(), ref, atol=tol, rtol=0)
        torch.testing.assert_close(fewer.float(), even.float(), atol=tol, rtol=0)


def test_bad_qkv_is_refused():
    k = torch.zeros(2, PAGE, 2, D, dtype=DTYPE, device=DEVICE)
    z = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="qkv must be"):
        rope_paged_decode_attention(torch.zeros(1, 7 * D, dtype=DTYPE, device=DEVICE), z, rope_table(4).to(DEVICE), z,
                                    4, 2, k, k, z, z, z, 0.1)
