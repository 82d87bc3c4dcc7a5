"""The Triton paged decode attention (model_wrapper/kernels/decode_attention.py) against a direct
computation: softmax(q k^T * scale) v over each request's keys, gathered page by page from the
caches in float64, with the window applied as a mask.

Without a GPU the kernel runs under Triton's interpreter in fp16 (tests/triton_interpret.py); on
CUDA in bf16 with pages of 16 and head_dim 128 (`pytest -m cuda` there). The module is skipped where triton is not
installed (CI installs only `.[test]`). The graphs that run the kernel are checked against eager
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

from model_wrapper.kernels.decode_attention import paged_decode_attention

DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = [] if INTERPRET else [pytest.mark.cuda]  # on a GPU machine: with the other `-m cuda` tests
DTYPE = torch.float16 if INTERPRET else torch.bfloat16
PAGE, D = (4, 32) if INTERPRET else (16, 128)


def _paged(lens, kv_heads, seed):
    """Caches with every request's pages scattered among unused ones, and the page metadata."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // PAGE) for n in lens]
    blocks = sum(pages) + 7
    k = torch.randn(blocks, PAGE, kv_heads, D, generator=g).to(DTYPE)
    v = torch.randn(blocks, PAGE, kv_heads, D, generator=g).to(DTYPE)
    order = torch.randperm(blocks, generator=g)
    tables, at = [], 0
    for n in pages:
        tables.append(order[at:at + n])
        at += n
    indptr = torch.tensor([0] + pages).cumsum(0).to(torch.int32)
    indices = torch.cat(tables).to(torch.int32)
    last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(lens, pages)], dtype=torch.int32)
    return k, v, tables, indptr, indices, last


def _direct(q, k, v, tables, lens, scale, window):
    out = []
    heads, kv_heads = q.shape[1], k.shape[2]
    for r, n in enumerate(lens):
        t = torch.arange(n)
        rows = tables[r][t // PAGE] * PAGE + t % PAGE
        kr = k.reshape(-1, kv_heads, D)[rows].double().repeat_interleave(heads // kv_heads, 1)
        vr = v.reshape(-1, kv_heads, D)[rows].double().repeat_interleave(heads // kv_heads, 1)
        s = torch.einsum("hd,thd->ht", q[r].double(), kr) * scale
        if window is not None:
            s[:, t < n - window] = float("-inf")
        out.append(torch.einsum("ht,thd->hd", s.softmax(-1), vr))
    return torch.stack(out)


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 2)])
@pytest.mark.parametrize("splits", [1, 2, 16])
@pytest.mark.parametrize("window", [None, 5])
def test_decode_attention_is_the_direct_softmax(heads, kv_heads, splits, window):
    """Lengths of 1 key, a page, a page and one, and several pages (the last part-filled), with
    more splits than some requests have blocks of keys (empty splits), GQA groups of 4, 1 and 3
    (padded to the MMA's 16 rows)."""
    lens = [1, PAGE, PAGE + 1, 9 * PAGE + 3, 70 if INTERPRET else 300]
    k, v, tables, indptr, indices, last = _paged(lens, kv_heads, seed=heads + splits)
    q = torch.randn(len(lens), heads, D, generator=torch.Generator().manual_seed(1)).to(DTYPE)
    scale = 1 / math.sqrt(D)
    on = [x.to(DEVICE) for x in (q, k, v, indptr, indices, last)]
    got = paged_decode_attention(*on[:3], *on[3:], scale, window=window, splits=splits,
                                 block_n=8 if INTERPRET else 64)
    want = _direct(q, k, v, tables, lens, scale, window)
    assert got.shape == q.shape and got.dtype == DTYPE
    # inputs exact in both; the kernel rounds p to the dtype for the PV product and its output once
    tol = 2e-3 if DTYPE == torch.float16 else 1.6e-2
    torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=0)


def test_decode_plan_takes_a_program_a_sm_where_the_pairs_nearly_fill_the_sms():
    """KernelConfig.decode_attention_fat's rule (16-bit caches): sms // pairs splits and FAT's launch where that is at
    most FAT_MAX_SPLITS (2) and the pairs at most the SMs; decode_splits' and the default launch elsewhere, for e4m3
    caches and with the switch off."""
    from model_wrapper.kernels.decode_attention import FAT, decode_plan, decode_splits

    bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
    assert decode_plan(32, 4, 132, bf16, fat=True) == (1, FAT)  # Qwen3-30B-A3B batch 32: 128 pairs
    assert decode_plan(16, 4, 132, bf16, fat=True) == (2, FAT)  # 64 pairs: 128 programs
    assert decode_plan(16, 8, 132, None, fat=True) == (1, FAT)  # Llama-3-8B batch 16 (the model's dtype)
    assert decode_plan(24, 4, 132, bf16, fat=True) == (1, FAT)
    for batch, kvh, dtype, fat in ((34, 4, bf16, True), (16, 4, bf16, False), (1, 8, bf16, True), (8, 4, bf16, True),
                                   (32, 4, e4m3, True)):
        assert decode_plan(batch, kvh, 132, dtype, fat=fat) == (decode_splits(batch, kvh, 132, dtype), {})


@pytest.mark.parametrize("batch", [3, 4, 8])
def test_fat_launch_at_its_planned_splits_is_the_direct_softmax(batch):
    """The launch decode_plan gives (FAT: 128 keys a step) at the splits it plans for 2 KV heads and 16 SMs (3 / 4 / 8
    requests: 2 / 2 / 1 splits), uneven lengths."""
    from model_wrapper.kernels.decode_attention import decode_plan

    lens = ([1, PAGE + 1, 9 * PAGE + 3, 70 if INTERPRET else 300] * 2)[:batch]
    k, v, tables, indptr, indices, last = _paged(lens, 2, seed=batch)
    splits, launch = decode_plan(batch, 2, 16, DTYPE, fat=True)
    assert launch and splits == 16 // (2 * batch)
    q = torch.randn(batch, 8, D, generator=torch.Generator().manual_seed(2)).to(DTYPE)
    on = [x.to(DEVICE) for x in (q, k, v, indptr, indices, last)]
    got = paged_decode_attention(*on[:3], *on[3:], D**-0.5, splits=splits, **launch)
    tol = 2e-3 if DTYPE == torch.float16 else 1.6e-2
    torch.testing.assert_close(got.double().cpu(), _direct(q, k, v, tables, lens, D**-0.5, None), atol=tol, rtol=0)


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch: sm90+ GPUs")
@pytest.mark.parametrize("splits", [1, 4, 16])
@pytest.mark.parametrize("prefetch", [False, True])
def test_pdl_launch_is_the_direct_softmax(splits, prefetch):
    """Launched with PDL (the graphs', KernelConfig.decode_attention_pdl_max_batch) after a kernel that writes q: the
    direct softmax of the q it wrote, as without PDL, bit for bit; prefetch (KernelConfig.decode_attention_prefetch):
    the metadata read and the first K / V tile prefetched into L2 before the wait, the same output."""
    lens = [1, PAGE + 1, 9 * PAGE + 3, 300]
    k, v, tables, indptr, indices, last = _paged(lens, 2, seed=11)
    q = torch.randn(len(lens), 8, D, generator=torch.Generator().manual_seed(4)).to(DTYPE)
    on = [x.to(DEVICE) for x in (k, v, indptr, indices, last)]
    qd = torch.zeros_like(q, device=DEVICE)
    qd.copy_(q.to(DEVICE))  # written just before the launch
    got = paged_decode_attention(qd, *on, 1 / math.sqrt(D), splits=splits, pdl=True, prefetch=prefetch)
    want = _direct(q, k, v, tables, lens, 1 / math.sqrt(D), None)
    torch.testing.assert_close(got.double().cpu(), want, atol=1.6e-2, rtol=0)
    assert torch.equal(got, paged_decode_attention(qd, *on, 1 / math.sqrt(D), splits=splits))


@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch: sm90+ GPUs")
@pytest.mark.parametrize("batch", [1, 2])
def test_pdl_prefetch_over_an_e4m3_cache_is_the_launch_without_it(batch):
    """The graphs' e4m3 launch at batch 1-2 (16 splits, its default fp8_math) under PDL with the metadata read and the
    first K / V tile prefetched before the wait: bit for bit the launch without PDL."""
    lens = [300, 9 * PAGE + 3][:batch]
    k, v, _, indptr, indices, last = _paged(lens, 4, seed=13)
    k8, v8 = (x.float().to(torch.float8_e4m3fn).to(DEVICE) for x in (k, v))
    q = torch.randn(batch, 32, D, generator=torch.Generator().manual_seed(6)).to(DTYPE).to(DEVICE)
    sc = dict(k_scale=torch.tensor([0.05], device=DEVICE), v_scale=torch.tensor([0.2], device=DEVICE))
    meta = [x.to(DEVICE) for x in (indptr, indices, last)]
    qd = q * 1  # written just before the launch
    got = paged_decode_attention(qd, k8, v8, *meta, 1 / math.sqrt(D), splits=16, pdl=True, prefetch=True, **sc)
    assert torch.equal(got, paged_decode_attention(q, k8, v8, *meta, 1 / math.sqrt(D), splits=16, **sc))


def test_strided_q_rows():
    """q as the model hands it over: a view of the fused qkv rows (row stride > heads * D)."""
    lens = [5, 2 * PAGE]
    k, v, tables, indptr, indices, last = _paged(lens, 2, seed=3)
    qkv = torch.randn(len(lens), (8 + 4) * D, generator=torch.Generator().manual_seed(2)).to(DTYPE)
    q = qkv.to(DEVICE)[:, : 8 * D].view(len(lens), 8, D)
    assert q.stride(0) == 12 * D
    on = [x.to(DEVICE) for x in (k, v, indptr, indices, last)]
    got = paged_decode_attention(q, *on, 1 / math.sqrt(D), splits=2, block_n=8 if INTERPRET else 64)
    want = _direct(q.cpu(), k, v, tables, lens, 1 / math.sqrt(D), None)
    torch.testing.assert_close(got.double().cpu(), want, atol=2e-3 if INTERPRET else 1.6e-2, rtol=0)


@pytest.mark.parametrize("fp8_math", ["q_dtype", "fp16", "fp16_vreg", "bits_vreg"])
@pytest.mark.parametrize("splits,block_n", [(1, None), (4, None), (1, 2)])
@pytest.mark.parametrize("window", [None, 5])
def test_fp8_cache_is_the_direct_softmax_over_dequantized_kv(fp8_math, splits, block_n, window):
    """e4m3 caches with K scale 0.05 and V scale 0.2: the kernel equals the direct softmax over
    K = e4m3 * 0.05, V = e4m3 * 0.2 (float64), as closely as over a 16-bit cache, whichever way it
    turns e4m3 into tensor-core operands (the "_vreg" ones' PTX on CUDA; under the interpreter their
    Triton stand-ins); twice the default keys a step (16; 128 on the GPU) as well. The
    caches hold every e4m3 magnitude class: normals, subnormals (below 2^-6), zeros of both signs
    and the largest finite value (in K)."""
    lens = [1, PAGE + 1, 9 * PAGE + 3, 70 if INTERPRET else 300]
    k, v, tables, indptr, indices, last = _paged(lens, 2, seed=11 + splits)
    k8, v8 = (k.float() * 20).clamp(-448, 448).to(torch.float8_e4m3fn), (v.float() * 5).to(torch.float8_e4m3fn)
    special = torch.tensor([448.0, -448.0, 2.0**-9, -(2.0**-9), 3 * 2.0**-9, 7 * 2.0**-9, 0.0, -0.0])
    k8.view(-1)[:: 7][: special.numel()] = special.to(torch.float8_e4m3fn)  # (first page of the cache)
    v8.view(-1)[3 :: 5][2: special.numel()] = special[2:].to(torch.float8_e4m3fn)  # (V = 89.6 would set the tolerance)
    k8.view(-1)[1::11] = (k.view(-1)[1::11].float() * 2.0**-7).to(torch.float8_e4m3fn)  # subnormals spread over all pages
    v8.view(-1)[2::13] = (v.view(-1)[2::13].float() * 2.0**-7).to(torch.float8_e4m3fn)
    ks, vs = torch.tensor([0.05]), torch.tensor([0.2])
    q = torch.randn(len(lens), 8, D, generator=torch.Generator().manual_seed(4)).to(DTYPE)
    scale = 1 / math.sqrt(D)
    on = [x.to(DEVICE) for x in (q, k8, v8, indptr, indices, last)]
    block_n = (8 if INTERPRET else 64) * (block_n or 1)
    got = paged_decode_attention(*on[:3], *on[3:], scale, window=window, splits=splits, block_n=block_n,
                                 k_scale=ks.to(DEVICE), v_scale=vs.to(DEVICE), fp8_math=fp8_math)
    want = _direct(q, k8.double() * 0.05, v8.double() * 0.2, tables, lens, scale, window)
    assert got.dtype == DTYPE
    tol = 2e-3 if DTYPE == torch.float16 else 1.6e-2
    torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=0)


def test_fp8_bad_arguments_are_refused():
    lens = [3]
    k, v, tables, indptr, indices, last = _paged(lens, 2, seed=5)
    k8, v8 = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    q = torch.randn(1, 8, D).to(DTYPE)
    on = [x.to(DEVICE) for x in (q, k8, v8, indptr, indices, last)]
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        paged_decode_attention(*on[:3], *on[3:], 0.1)
    one = torch.ones(1, device=DEVICE)
    with pytest.raises(ValueError, match="fp8_math must be one of .* got 'e5m2'"):
        paged_decode_attention(*on[:3], *on[3:], 0.1, k_scale=one, v_scale=one, fp8_math="e5m2")


def test_fp8_default_launch_by_batch_is_the_direct_softmax():
    """With no launch arguments an e4m3 cache takes E4M3_BY_BATCH's row for the step's batch (its
    split_factor through decode_splits with the cache dtype; a 16-bit cache and batches past the
    last row keep the plain rule): at the largest batch of each row and one past the last, the
    output is the direct softmax over the dequantized K / V."""
    from model_wrapper.kernels import decode_attention as da

    e4m3 = torch.float8_e4m3fn
    sms = 8  # a small GPU: the rows' batches give both split and unsplit steps
    batches = [most for most, _ in da.E4M3_BY_BATCH] + [da.E4M3_BY_BATCH[-1][0] + 1]
    for B in batches:
        over = next((o for most, o in da.E4M3_BY_BATCH if B <= most), {})
        base = da.decode_splits(B, 2, sms)
        splits = da.decode_splits(B, 2, sms, e4m3)
        assert splits == min(da.MAX_SPLITS, base * over.get("split_factor", 1))
        assert da.decode_splits(B, 2, sms, torch.bfloat16) == base
        lens = [1 + (7 * i) % (3 * PAGE) for i in range(B)]
        k, v, tables, indptr, indices, last = _paged(lens, 2, seed=B)
        k8, v8 = (k.float() * 20).clamp(-448, 448).to(e4m3), (v.float() * 5).to(e4m3)
        q = torch.randn(B, 4, D, generator=torch.Generator().manual_seed(B)).to(DTYPE)
        on = [x.to(DEVICE) for x in (q, k8, v8, indptr, indices, last)]
        scale = 1 / math.sqrt(D)
        ks, vs = torch.tensor([0.05], device=DEVICE), torch.tensor([0.2], device=DEVICE)
        got = paged_decode_attention(*on[:3], *on[3:], scale, splits=splits, k_scale=ks, v_scale=vs)
        want = _direct(q, k8.double() * 0.05, v8.double() * 0.2, tables, lens, scale, None)
        tol = 2e-3 if DTYPE == torch.float16 else 1.6e-2
        torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=0)


@pytest.mark.parametrize("splits", [2, 16])
@pytest.mark.parametrize("cache", ["16-bit", "e4m3"])
def test_merge_quantizes_o_input_as_the_reference_quantizes_the_merged_rows(splits, cache):
    """quant_group = head_dim (o's e4m3 GEMM on block weights, Linear.attention_input_quant): the split merge hands
    out e4m3 rows and a scale per token and head, bit for bit quantize_fp8_reference of the rows the plain merge
    writes (in the output dtype), and no rows past the step's; with one split (no merge) the plain output."""
    from model_wrapper.kernels.fp8_reference import QuantizedActivation, quantize_fp8_reference

    lens = [1, PAGE + 1, 9 * PAGE + 3, 70 if INTERPRET else 300]
    k, v, tables, indptr, indices, last = _paged(lens, 2, seed=20 + splits)
    sc = {}
    if cache == "e4m3":
        k, v = (k.float() * 20).clamp(-448, 448).to(torch.float8_e4m3fn), (v.float() * 5).to(torch.float8_e4m3fn)
        sc = dict(k_scale=torch.tensor([0.05], device=DEVICE), v_scale=torch.tensor([0.2], device=DEVICE))
    q = (3 * torch.randn(len(lens), 8, D, generator=torch.Generator().manual_seed(9))).to(DTYPE)
    on = [x.to(DEVICE) for x in (q, k, v, indptr, indices, last)]
    kw = dict(splits=splits, block_n=8 if INTERPRET else 64, **sc)
    plain = paged_decode_attention(*on[:3], *on[3:], 1 / math.sqrt(D), **kw)
    got = paged_decode_attention(*on[:3], *on[3:], 1 / math.sqrt(D), quant_group=D, **kw)
    assert isinstance(got, QuantizedActivation) and (got.rows, got.group, got.dtype) == (len(lens), D, DTYPE)
    want_q, want_s = quantize_fp8_reference(plain.reshape(len(lens), 8 * D).cpu(), D)
    assert got.q.shape == want_q.shape and got.scale.shape == want_s.shape
    assert torch.equal(got.q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(got.scale.cpu(), want_s)
    one = paged_decode_attention(*on[:3], *on[3:], 1 / math.sqrt(D), quant_group=D, **dict(kw, splits=1))
    assert torch.is_tensor(one) and one.shape == q.shape
