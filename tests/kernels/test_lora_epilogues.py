"""The Triton LoRA kernels (adapters.triton_kernels, model_wrapper.kernels.ops): the shrink and the
expand, and the expand fused into the kernels that read y (silu_and_mul_lora, add_lora_rms_norm,
rope_store_kv), against exact references.

Without a GPU the kernels run under Triton's interpreter (tests/triton_interpret.py, CPU
tensors; tl.dot of bf16 is wrong there, so fp32 / fp16 there and bf16 only on CUDA); the module is
skipped where triton is not installed (CI installs only `.[test]`). Oracles: the per-token product written
out with einsum over gathered slot weights. The LoraBatch that drives them: tests/adapters/test_lora_triton.py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import INTERPRET, DEVICE, TOL  # first: it sets up the interpreter

import math  # noqa: E402

import adapters.triton_kernels as tk  # noqa: E402
import model_wrapper.kernels.ops as tops  # noqa: E402
from adapters.lora_batch import LoraDelta, lora_groups  # noqa: E402
from conftest import rel_err  # noqa: E402


def reference(x, a, bs, token_slot, ranks, R, offsets, y):
    """y + the LoRA delta of every token, in float64 (float32 on CUDA), one token at a time in effect."""
    f = torch.float64 if x.device.type == "cpu" else torch.float32
    out = y.to(f).clone()
    use = token_slot >= 0
    s = token_slot.clamp_min(0).long()
    h = torch.einsum("tk,trk->tr", x.to(f), a[s].to(f))
    r = torch.arange(R, device=x.device)
    for i, b in enumerate(bs):
        keep = (r[None, :] < ranks[s, i][:, None]).to(f)
        delta = torch.einsum("tr,tnr->tn", h[:, i * R:(i + 1) * R] * keep, b[s].to(f))
        out[:, offsets[i]:offsets[i + 1]] += delta * use[:, None]
    return out


def random_case(T, K, outs, R, num_slots, dtype, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K, generator=g).to(device, dtype)
    a = (torch.randn(num_slots, len(outs) * R, K, generator=g) / math.sqrt(K)).to(device, dtype)
    bs = tuple(torch.randn(num_slots, n, R, generator=g).to(device, dtype) for n in outs)
    ranks = torch.randint(0, R + 1, (num_slots, len(outs)), generator=g, dtype=torch.int32)
    ranks[0] = R  # slot 0 at full rank, the others padded (rank 0 = a sub-module not adapted)
    token_slot = torch.randint(-1, num_slots, (T,), generator=g, dtype=torch.int32)
    token_slot[:2] = torch.tensor([0, -1])[:T]
    y = torch.randn(T, sum(outs), generator=g).to(device, dtype)
    offsets = [0]
    for n in outs:
        offsets.append(offsets[-1] + n)
    return x, a, bs, ranks.to(device), token_slot.to(device), y, tuple(offsets)


def run_kernels(x, a, bs, ranks, token_slot, y, offsets, R, segments=None):
    s = tk.lora_shrink(x, a, token_slot, ranks, R, segments)
    assert s.dtype == torch.float32 and s.shape[1:] == (x.shape[0], a.shape[1])
    return tk.lora_expand_add(s, bs, token_slot, ranks, R, y, offsets, segments)


def grouped(token_slot, num_slots):
    """The host's grouping of the tokens by slot, as LoraManager.make_batch builds it."""
    slots = token_slot.cpu().long()
    perm = torch.argsort(slots, stable=True)[int((slots < 0).sum()):]
    counts = torch.bincount(slots[slots >= 0], minlength=num_slots)
    indptr = torch.zeros(num_slots + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(counts, 0)
    return tk.LoraSegments(perm.to(token_slot.device), indptr.to(token_slot.device), int(counts.max()))


def check_case(dtype, outs, segmented, T=37, K=80, R=8, num_slots=5, tol=None, seed=0):
    x, a, bs, ranks, token_slot, y, offsets = random_case(T, K, outs, R, num_slots, dtype, seed=seed)
    segments = grouped(token_slot, num_slots) if segmented else None
    y0 = y.clone()
    got = run_kernels(x, a, bs, ranks, token_slot, y, offsets, R, segments)
    assert got.data_ptr() == y.data_ptr()  # in place
    want = reference(x, a, bs, token_slot, ranks, R, offsets, y0)
    base = token_slot < 0
    assert torch.equal(got[base], y0[base]), "rows without an adapter must stay bit for bit"
    tol = tol or {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}[dtype]
    err = rel_err(got.to(want.dtype) - y0.to(want.dtype), want - y0.to(want.dtype))
    assert err < tol, f"rel err of the delta {err:.2e}"


@pytest.mark.parametrize("outs", [(48,), (40, 24), (64, 16, 16)], ids=["one", "gate_up", "qkv"])
@pytest.mark.parametrize("segmented", [False, True], ids=["scan", "segmented"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_shrink_expand_match_per_token_reference(dtype, outs, segmented):
    if INTERPRET and dtype == torch.bfloat16:
        pytest.skip("the interpreter's tl.dot is wrong for bf16 (checked on CUDA)")
    check_case(dtype, outs, segmented)


@pytest.mark.parametrize("segmented", [False, True], ids=["scan", "segmented"])
def test_many_tokens_take_several_chunks_per_slot(segmented):
    check_case(torch.float32, (24, 8, 8), segmented, T=150, K=40, R=4, num_slots=2)


def test_split_k_partials_add_up_and_ranks_mask_the_padding(monkeypatch):
    monkeypatch.setattr(tk, "PROGRAMS_PER_SM", 64)
    R = 8
    x, a, bs, ranks, token_slot, y, offsets = random_case(9, 300, (24, 8, 8), R, 3, torch.float32)
    s = tk.lora_shrink(x, a, token_slot, ranks, R)
    assert s.shape[0] > 1  # K = 300 in several splits
    slot = token_slot.clamp_min(0).long()
    h = torch.einsum("tk,trk->tr", x.double(), a[slot].double())
    keep = torch.arange(3 * R, device=x.device) % R < ranks[slot].repeat_interleave(R, 1)
    used = token_slot >= 0
    assert torch.allclose(s.sum(0)[used].double(), (h * keep)[used], atol=1e-4)
    want = reference(x, a, bs, token_slot, ranks, R, offsets, y)
    for sl in range(3):  # A beyond each true rank is never read; B there holds the manager's zeros (its
        for i, b in enumerate(bs):  # tiles are read whole: test_a_reused_slot_is_zero_past_the_new_ranks)
            a[sl, i * R + int(ranks[sl, i]):(i + 1) * R] = float("nan")
            b[sl, :, int(ranks[sl, i]):] = 0.0
    got = run_kernels(x, a, bs, ranks, token_slot, y.clone(), offsets, R)
    assert torch.allclose(got.to(want.dtype), want, atol=1e-4)


def test_a_fused_module_is_one_shrink_and_one_expand_launch(monkeypatch):
    launches = []

    class Count:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            launches.append((self.name, grid))
            return self.kernel[grid]

    for name in ("_shrink", "_expand"):
        monkeypatch.setattr(tk, name, Count(name, getattr(tk, name)))
    x, a, bs, ranks, token_slot, y, offsets = random_case(5, 32, (256, 128, 128), 4, 2, torch.float32)
    run_kernels(x, a, bs, ranks, token_slot, y, offsets, 4)
    assert [n for n, _ in launches] == ["_shrink", "_expand"]
    # expand grid: (slot, chunk of its tokens, output column block of q, k and v together)
    assert launches[1][1] == (2, 1, 2 + 1 + 1)


@pytest.mark.cuda
@pytest.mark.parametrize("segmented", [False, True], ids=["scan", "segmented"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_kernels_on_cuda_at_larger_shapes(dtype, segmented):
    for seed, (T, K, outs, R, num_slots) in enumerate([(300, 512, (512, 128, 128), 16, 5), (33, 1000, (700,), 64, 3),
                                                       (100, 256, (384, 384), 8, 16), (1, 4096, (4096,), 16, 16)]):
        check_case(dtype, outs, segmented, T=T, K=K, R=R, num_slots=num_slots, seed=seed)


def test_lora_groups_lists_each_slots_tokens_in_order_and_the_rest_last():
    slots = torch.tensor([2, -1, 0, 2, -1, 2, 1, -1, 0])
    out = torch.full((5, 12), -7, dtype=torch.int32)  # a runner's buffer, wider than T + 1
    assert lora_groups(slots, 4, out) is out
    want = {0: [2, 8], 1: [6], 2: [0, 3, 5], 3: [], 4: [1, 4, 7]}  # row 4: no adapter
    for g, rows in want.items():
        assert out[g, 0] == len(rows) and out[g, 1:1 + len(rows)].tolist() == rows, g
    assert lora_groups(torch.zeros(0, dtype=torch.int32), 2)[:, 0].tolist() == [0, 0, 0]


def random_delta(T, outs, R, num_slots, dtype, device=DEVICE, splits=3, seed=0):
    """A LoraDelta with random partial sums, stacks and ranks (slot 0 at full rank, some -1 tokens)."""
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(splits, T, len(outs) * R, generator=g).to(device)
    bs = tuple((torch.randn(num_slots, n, R, generator=g) * 0.3).to(device, dtype) for n in outs)
    ranks = torch.randint(0, R + 1, (num_slots, len(outs)), generator=g, dtype=torch.int32)
    ranks[0] = R
    token_slot = torch.randint(-1, num_slots, (T,), generator=g, dtype=torch.int32)
    token_slot[:2] = torch.tensor([0, -1])[:T]
    offsets = [0]
    for n in outs:
        offsets.append(offsets[-1] + n)
    return LoraDelta(s, bs, token_slot.to(device), ranks.to(device), R, tuple(offsets),
                     groups=lora_groups(token_slot, num_slots).to(device))


def delta_reference(d: LoraDelta, dtype) -> torch.Tensor:
    """[T, sum(outs)] float32: what the expand kernel adds (s summed, rounded to dtype, rank-masked)."""
    sv = d.s.sum(0).to(dtype).float()
    slot = d.token_slot.long().clamp_min(0)
    r = torch.arange(d.rank, device=sv.device)
    out = []
    for i, b in enumerate(d.b):
        keep = (r[None, :] < d.ranks[slot, i].long()[:, None]).float()
        out.append(torch.einsum("tr,tnr->tn", sv[:, i * d.rank:(i + 1) * d.rank] * keep, b[slot].float()))
    return torch.cat(out, 1) * (d.token_slot >= 0)[:, None].float()


@pytest.mark.parametrize("T,N", [(11, 96), (150, 300)], ids=["one-block", "chunks-and-column-blocks"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_silu_and_mul_lora_adds_the_gate_up_delta_first(dtype, T, N):
    if INTERPRET and dtype == torch.bfloat16:
        pytest.skip("the interpreter computes bf16 like fp32: covered on CUDA")
    R = 8
    d = random_delta(T, (N, N), R, 4, dtype)
    x = torch.randn(T, 2 * N, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    got = tops.silu_and_mul_lora(x, d)
    y = (x.float() + delta_reference(d, dtype)).to(dtype).float()
    want = torch.nn.functional.silu(y[:, :N]) * y[:, N:]
    assert rel_err(got.float(), want) < TOL[dtype]
    base = d.token_slot < 0
    plain = torch.nn.functional.silu(x[:, :N].float()) * x[:, N:].float()
    assert torch.allclose(got[base].float(), plain[base], rtol=TOL[dtype], atol=TOL[dtype])


def rope_reference(x, pos, table):
    """neox RoPE of x [T, H, D] with a float32 [P, D] (cos | sin) table, in float32."""
    D = x.shape[-1]
    cos, sin = table[pos, None, : D // 2], table[pos, None, D // 2:]
    a, b = x[..., : D // 2].float(), x[..., D // 2:].float()
    return torch.cat((a * cos - b * sin, b * cos + a * sin), -1)


@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rope_store_kv_rotates_in_place_and_writes_the_cache(dtype, lora):
    if INTERPRET and dtype == torch.bfloat16:
        pytest.skip("the interpreter computes bf16 like fp32: covered on CUDA")
    T, HQ, HK, D, R, bs = 7, 4, 2, 32, 8, 4
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(T, (HQ + 2 * HK) * D, generator=g).to(DEVICE, dtype)
    pos = torch.randint(0, 50, (T,), generator=g).to(DEVICE)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    freqs = torch.arange(64).float()[:, None] * inv[None, :]
    table = torch.cat((freqs.cos(), freqs.sin()), -1).to(DEVICE)
    kc = torch.zeros(6, bs, HK, D, dtype=dtype, device=DEVICE)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([5, -1, 0, 13, 22, 7, 9], device=DEVICE)
    d = random_delta(T, (HQ * D, HK * D, HK * D), R, 3, dtype) if lora else None
    x = qkv.float() + (delta_reference(d, dtype) if lora else 0)
    x = x.to(dtype)
    q, k, v = x.split([HQ * D, HK * D, HK * D], 1)
    want_q = rope_reference(q.view(T, HQ, D), pos, table)
    want_k = rope_reference(k.view(T, HK, D), pos, table)
    tops.rope_store_kv(qkv, pos, table, HQ, HK, D, kc, vc, slots, d)
    got_q, got_k, got_v = qkv.split([HQ * D, HK * D, HK * D], 1)
    tol = TOL[dtype]
    assert rel_err(got_q.float().view(T, HQ, D), want_q) < tol
    assert rel_err(got_k.float().view(T, HK, D), want_k) < tol
    assert rel_err(got_v.float(), v.float()) < tol and (lora or torch.equal(got_v, v))  # delta only, no rotation
    flat_k, flat_v = kc.view(-1, HK, D), vc.view(-1, HK, D)
    keep = slots >= 0
    assert torch.equal(flat_k[slots[keep]], got_k.view(T, HK, D)[keep])
    assert torch.equal(flat_v[slots[keep]], got_v.view(T, HK, D)[keep])
    written = torch.zeros(flat_k.shape[0], dtype=torch.bool, device=DEVICE)
    written[slots[keep]] = True
    assert not flat_k[~written].any() and not flat_v[~written].any()  # nothing else written (slot -1 skipped)


def silu_mul_reference(y):
    half = y.shape[1] // 2
    return torch.nn.functional.silu(y[:, :half]) * y[:, half:]


def test_the_norms_division_left_to_the_kernels_after_the_gemm_gives_the_normalised_projections():
    """add_lora_rms_norm (o's delta, residual add, weight * rows, sums of squares), a projection of
    its undivided rows, then silu_and_mul_lora / rope_store_kv with the RowScale (and the next
    delta from the undivided rows' shrink) == the same chain through a plain RMSNorm (float64)."""
    g = torch.Generator().manual_seed(11)
    T, n, N, R, S, eps = 21, 80, 48, 4, 3, 1e-5
    HQ, HK, D = 2, 1, 16
    slots = torch.tensor([0, -1, 2, 2, 1, 0, -1, 2] + [1] * 13, dtype=torch.int32)  # slot 1: > 16 tokens
    groups = lora_groups(slots, S).to(DEVICE)
    dev_slots = slots.to(DEVICE)
    ranks = torch.tensor([[R, R, R], [2, R, 3], [R, 0, R]], dtype=torch.int32, device=DEVICE)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE)

    def delta(s, bs):  # the reference delta of s [T, n_sub * R] (fp64), per token's slot and rank
        sl = slots.long().clamp_min(0).to(DEVICE)
        r = torch.arange(R, device=DEVICE)
        out = []
        for i, b in enumerate(bs):
            keep = (r[None, :] < ranks[sl, i][:, None]).double()
            out.append(torch.einsum("tr,tnr->tn", s[:, i * R:(i + 1) * R] * keep, b[sl].double()))
        return torch.cat(out, 1) * (slots >= 0).to(DEVICE)[:, None].double()

    h, residual, weight = rnd(T, n), rnd(T, n, scale=3.0), rnd(n).abs() + 0.5
    s_o, b_o = rnd(T, R), (rnd(S, n, R, scale=0.3),)
    d_o = LoraDelta(s_o[None], b_o, dev_slots, ranks[:, :1].contiguous(), R, (0, n), groups=groups)
    res_true = residual.double() + h.double() + delta(s_o.double(), b_o)
    x_true = res_true * torch.rsqrt(res_true.square().mean(1, keepdim=True) + eps) * weight.double()
    scale = tops.add_lora_rms_norm(h, residual, weight, eps, d_o)
    assert rel_err(residual.double(), res_true) < 1e-6
    x_undivided = h  # in place
    for outs, consumer in (((N, N), "silu"), ((HQ * D, HK * D, HK * D), "rope")):
        W, A = rnd(sum(outs), n, scale=0.2), rnd(S, len(outs) * R, n, scale=0.2)
        bs = tuple(rnd(S, o, R, scale=0.3) for o in outs)
        sl = slots.long().clamp_min(0).to(DEVICE)
        want = x_true @ W.double().T + delta(torch.einsum("tk,trk->tr", x_true, A[sl].double()), bs)
        y = x_undivided @ W.T
        s = torch.einsum("tk,trk->tr", x_undivided, A[sl])[None]
        offsets = (0, outs[0], outs[0] + outs[1]) if len(outs) == 2 else (0, outs[0], outs[0] + outs[1], sum(outs))
        d = LoraDelta(s, bs, dev_slots, ranks[:, :len(outs)].contiguous(), R, offsets, groups=groups)
        if consumer == "silu":
            got = tops.silu_and_mul_lora(y, d, scale)
            assert rel_err(got.double(), silu_mul_reference(want)) < 1e-5
        else:
            pos = torch.arange(T, device=DEVICE) * 2
            freqs = torch.arange(64).float()[:, None] * (1.0 / (10000 ** (torch.arange(0, D, 2).float() / D)))[None, :]
            table = torch.cat((freqs.cos(), freqs.sin()), -1).to(DEVICE)
            kc, vc = torch.zeros(4, 8, HK, D, device=DEVICE), torch.zeros(4, 8, HK, D, device=DEVICE)
            tops.rope_store_kv(y, pos, table, HQ, HK, D, kc, vc, torch.arange(T, device=DEVICE), d, scale)
            q, k, v = want.float().split([HQ * D, HK * D, HK * D], 1)
            assert rel_err(y[:, :HQ * D].view(T, HQ, D), rope_reference(q.view(T, HQ, D), pos, table)) < 1e-5
            assert rel_err(kc.view(-1, HK, D)[:T], rope_reference(k.view(T, HK, D), pos, table)) < 1e-5
            assert rel_err(vc.view(-1, HK, D)[:T], v.view(T, HK, D)) < 1e-5
            assert rel_err(y[:, (HQ + HK) * D:], v) < 1e-5
