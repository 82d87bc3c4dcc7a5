"""GPU tests (`pytest -m cuda`) of the e4m3 decode attention in CUDA (kernels/e4m3_decode_cuda.py).

Oracle: float64 attention over the dequantized e4m3 K / V (e4m3 value * scale), per request and head, from
the same pages. The kernel rounds q (as fp16(q * 2^-8)) and p to fp16 and its output to q's dtype, so its
distance from the oracle is bounded by a few units of the output dtype's rounding at the output's scale.
The rows past each request's last key hold e4m3 NaN bytes, which must not reach any output.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):  # pragma: no cover - CPU machines
    pytest.skip("needs an sm89+ GPU", allow_module_level=True)

from model_wrapper.kernels.decode_attention import paged_decode_attention  # noqa: E402
from model_wrapper.kernels.e4m3_decode_cuda import fits, launch_warps, paged_decode_attention_e4m3  # noqa: E402

FP8 = torch.float8_e4m3fn
D = 128


def make(lens, kvh, page, dtype, heads=32, head_dim=D, seed=0):
    """Caches with pages shuffled and NaN rows past each request's end, q, page metadata (device)."""
    g = torch.Generator().manual_seed(seed)
    per = [-(-L // page) for L in lens]
    nb = sum(per) + 3
    k = (torch.randn(nb, page, kvh, head_dim, generator=g) * 8).to(FP8)
    v = (torch.randn(nb, page, kvh, head_dim, generator=g) * 8).to(FP8)
    indptr = torch.tensor([0] + torch.tensor(per).cumsum(0).tolist(), dtype=torch.int32)
    indices = torch.randperm(nb, generator=g)[:sum(per)].int()
    last = torch.tensor([L - (p - 1) * page for L, p in zip(lens, per)], dtype=torch.int32)
    for r, L in enumerate(lens):
        tail = int(indices[indptr[r + 1] - 1])
        k.view(torch.uint8)[tail, L - (per[r] - 1) * page:] = 0x7F
        v.view(torch.uint8)[tail, L - (per[r] - 1) * page:] = 0x7F
    q = torch.randn(len(lens), heads, head_dim, generator=g).to(dtype)
    return q.cuda(), k.cuda(), v.cuda(), [x.cuda() for x in (indptr, indices, last)]


def reference(q, k, v, meta, scale, ks, vs, window=None) -> torch.Tensor:
    """float64 attention over the dequantized caches -> [B, H, D]."""
    indptr, indices, last = (x.cpu() for x in meta)
    B, H, Dh = q.shape
    page, kvh = k.shape[1], k.shape[2]
    kf, vf = k.cpu().double() * ks, v.cpu().double() * vs
    out = torch.empty(B, H, Dh, dtype=torch.float64)
    for r in range(B):
        pages = indices[indptr[r]:indptr[r + 1]].long()
        L = (len(pages) - 1) * page + int(last[r])
        lo = max(0, L - window) if window else 0
        kr, vr = kf[pages].reshape(-1, kvh, Dh)[lo:L], vf[pages].reshape(-1, kvh, Dh)[lo:L]
        qr = q[r].cpu().double().view(kvh, H // kvh, Dh)
        s = torch.einsum("hgd,lhd->hgl", qr, kr) * scale
        out[r] = torch.einsum("hgl,lhd->hgd", s.softmax(-1), vr).reshape(H, Dh)
    return out


def bound(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """A few units of the output dtype's rounding at the output's largest entry (fp16 q and p add less)."""
    return float(ref.abs().max()) * (2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -9) + 1e-4


@pytest.mark.parametrize("kvh,page,dtype,lens,splits", [
    (8, 16, torch.bfloat16, [1, 15, 17, 100, 333, 64], 1),
    (8, 16, torch.bfloat16, [1, 15, 17, 100, 333, 64], 4),  # empty splits (1 key over 4)
    (4, 16, torch.bfloat16, [5, 250, 1000], 2),  # GQA group 8
    (8, 32, torch.float16, [31, 32, 33, 700], 1),
    (4, 32, torch.float16, [2, 129, 2049], 8),
    (32, 16, torch.bfloat16, [40, 7], 16),  # group 1
])
@pytest.mark.parametrize("variant", [{}, {"vbits": True}, {"prefetch": True, "minb": 3}, {"num_warps": 8},
                                     {"pdl": True}])
def test_matches_float64_attention_over_the_dequantized_cache(kvh, page, dtype, lens, splits, variant):
    q, k, v, meta = make(lens, kvh, page, dtype)
    ks, vs = 0.05, 0.02
    scale = D ** -0.5
    assert fits(q, k, None)
    out = paged_decode_attention_e4m3(q, k, v, *meta, scale, torch.tensor([ks], device="cuda"),
                                      torch.tensor([vs], device="cuda"), splits=splits, **variant)
    ref = reference(q, k, v, meta, scale, ks, vs)
    assert out.dtype == dtype and torch.isfinite(out).all()
    err = (out.double().cpu() - ref).abs().max().item()
    assert err <= bound(ref, dtype), (err, bound(ref, dtype))


def test_paged_decode_attention_routes_what_fits_to_cuda_and_the_rest_to_triton():
    """cuda=True: the CUDA kernel's output where it fits; a window, head_dim 64 or a GQA group of 16 stay on
    the Triton kernel (its cuda=False output), each within the oracle's bound; with pdl the same CUDA output."""
    ks, vs = torch.tensor([0.05], device="cuda"), torch.tensor([0.02], device="cuda")
    for kw, window in (({}, None), ({}, 50), ({"head_dim": 64}, None), ({"heads": 64, "kvh": 4}, None)):
        kvh = kw.pop("kvh", 8)
        q, k, v, meta = make([3, 90, 300], kvh, 16, torch.bfloat16, **kw)
        scale = q.shape[-1] ** -0.5
        tri = paged_decode_attention(q, k, v, *meta, scale, window=window, splits=2, k_scale=ks, v_scale=vs)
        got = paged_decode_attention(q, k, v, *meta, scale, window=window, splits=2, k_scale=ks, v_scale=vs, cuda=True)
        ref = reference(q, k, v, meta, scale, 0.05, 0.02, window)
        assert (got.double().cpu() - ref).abs().max().item() <= bound(ref, torch.bfloat16)
        if fits(q, k, window):
            cu = paged_decode_attention_e4m3(q, k, v, *meta, scale, ks, vs, splits=2,
                                             num_warps=launch_warps(q.shape[0] * k.shape[2], q.device))
            assert torch.equal(got, cu)
        else:
            assert (kw or window) and torch.equal(got, tri)
    q, k, v, meta = make([3, 90], 8, 16, torch.bfloat16)
    a = paged_decode_attention_e4m3(q, k, v, *meta, D ** -0.5, ks, vs, splits=2, num_warps=launch_warps(16, q.device))
    b = paged_decode_attention(q, k, v, *meta, D ** -0.5, splits=2, k_scale=ks, v_scale=vs, pdl=True, cuda=True)
    assert torch.equal(a, b)


@pytest.mark.parametrize("pdl", [False, True])
def test_graph_replay_equals_eager_and_follows_the_scales_and_lengths(pdl):
    """Captured in a CUDA graph (pdl: as programmatic dependents, the merge too): the replay equals an eager
    call; new K / V scales (written in place) and new page metadata (copied into the captured buffers) reach
    the replay."""
    q, k, v, meta = make([17, 300, 64, 1000], 8, 16, torch.bfloat16)
    ks, vs = torch.tensor([0.05], device="cuda"), torch.tensor([0.02], device="cuda")
    run = lambda: paged_decode_attention_e4m3(q, k, v, *meta, D ** -0.5, ks, vs, splits=4, pdl=pdl)  # noqa: E731
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    graph.replay()
    assert torch.equal(out, run())
    ks.fill_(0.08)
    vs.fill_(0.03)
    meta[2][1] = 7  # request 1 now ends 7 keys into its last page
    graph.replay()
    ref = reference(q, k, v, meta, D ** -0.5, 0.08, 0.03)
    assert torch.equal(out, run())
    assert (out.double().cpu() - ref).abs().max().item() <= bound(ref, torch.bfloat16)
