"""KVStore (model_wrapper/attention/kv_store.py), the one K/V writer, against a direct computation:
each token's K/V row placed by hand at cache[slot // block_size, slot % block_size], nothing at
slot -1, every other cache row untouched. The torch reference on the CPU; where Triton is
installed, the Triton store kernel and the fused RoPE + store under Triton's interpreter (on the
CPU) or on CUDA, against the same placement (and RoPE written out in float64)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from model_wrapper.attention.kv_store import KVStore
from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.kernels import KernelConfig

HAS_TRITON = importlib.util.find_spec("triton") is not None
if HAS_TRITON:
    from triton_interpret import INTERPRET  # before the kernels: sets up the interpreter

    DEVICE = "cpu" if INTERPRET else "cuda"
else:
    DEVICE = "cpu"

BLOCKS, BLOCK_SIZE, HK, D = 6, 4, 2, 16


def make_batch(slots: list[int], device=DEVICE) -> ForwardBatch:
    """A one-request prefill step of len(slots) tokens writing at `slots` (-1: not written)."""
    T = len(slots)
    return ForwardBatch.build(
        input_ids=torch.zeros(T, dtype=torch.int64), input_ids_cpu=torch.zeros(T, dtype=torch.int64),
        positions=torch.arange(T), slots=torch.tensor(slots), is_prefill=True, block_size=BLOCK_SIZE,
        q_lens_cpu=torch.tensor([T], dtype=torch.int32), seq_lens_cpu=torch.tensor([T], dtype=torch.int32),
        block_tables_cpu=torch.arange(BLOCKS, dtype=torch.int32)[None], lm_head_indices=None, spec_mask=None,
        atten_mask=None, device=torch.device(device))


def placed(cache: torch.Tensor, rows: torch.Tensor, slots: list[int]) -> torch.Tensor:
    """cache with row t of rows [T, HK, D] at slot slots[t] (skipped where -1), written by hand."""
    want = cache.clone()
    for t, s in enumerate(slots):
        if s >= 0:
            want[s // BLOCK_SIZE, s % BLOCK_SIZE] = rows[t].to(cache.dtype)
    return want


def caches(dtype, device=DEVICE):
    g = torch.Generator().manual_seed(3)
    return tuple(torch.randn(BLOCKS, BLOCK_SIZE, HK, D, generator=g).to(device, dtype) for _ in range(2))


@pytest.mark.parametrize("slots", [[5, 0, 22, 13, 7], [3, -1, 9, -1, 20]], ids=["all", "some -1"])
def test_torch_write_places_each_row_at_its_slot_and_nothing_else(slots):
    g = torch.Generator().manual_seed(1)
    T = len(slots)
    qkv = torch.randn(T, (4 + 2 * HK) * D, generator=g)  # k and v as strided views of a fused row
    k = qkv[:, 4 * D:(4 + HK) * D].view(T, HK, D)
    v = qkv[:, (4 + HK) * D:].view(T, HK, D)
    kc, vc = caches(torch.float32, "cpu")
    want_k, want_v = placed(kc, k, slots), placed(vc, v, slots)
    store = KVStore()
    assert store.name == "torch" and not store.graph_safe
    assert not store.fuses_rope(T, torch.float32, torch.float32)  # no fused path without Triton's table
    store.write((kc, vc), k, v, make_batch(slots, "cpu"))
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("slots", [[5, 0, 22, 13, 7], [3, -1, 9, -1, 20]], ids=["all", "some -1"])
def test_triton_write_equals_the_placement(slots):
    g = torch.Generator().manual_seed(2)
    dt = torch.float16
    k, v = (torch.randn(len(slots), HK, D, generator=g).to(DEVICE, dt) for _ in range(2))
    kc, vc = caches(dt)
    want_k, want_v = placed(kc, k, slots), placed(vc, v, slots)
    store = KVStore(triton=True)
    assert store.name == "triton" and store.graph_safe
    store.write((kc, vc), k, v, make_batch(slots))
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def rope_table(positions: int) -> torch.Tensor:
    """The [positions, D] cos | sin table (neox form, base 10000) the fused RoPE store reads, on DEVICE."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    freqs = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float().to(DEVICE)


@pytest.mark.parametrize("bad", [0, 12, -16])
def test_a_token_tile_that_is_not_a_power_of_two_is_refused(bad):
    from model_wrapper.errors import ModelErrorCode, ModelLoadError

    with pytest.raises(ModelLoadError) as e:
        KernelConfig(rope_store_block_t=bad)
    assert e.value.code == ModelErrorCode.BAD_CONFIG and "rope_store_block_t" in str(e.value) and str(bad) in str(e.value)


# programs of one token (decode) and tiles of two tokens (a prefill's launch; 5 tokens: the last tile has one)
BLOCK_T = {"t1": KernelConfig(), "t2": KernelConfig(rope_store_block_t=2, rope_store_block_t_min_tokens=1)}


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("cfg", BLOCK_T.values(), ids=BLOCK_T.keys())
def test_rope_write_rotates_q_and_k_in_place_and_stores_k_and_v(cfg):
    """fp32 under the interpreter: q, k rotated (neox form) within fp32 rounding of the float64
    rotation; the cache rows equal the rotated k and the v of qkv, bit for bit."""
    g = torch.Generator().manual_seed(4)
    HQ, T, P = 4, 5, 32
    slots = [9, -1, 2, 17, 6]
    dt = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    table = rope_table(P)
    pos = torch.tensor([3, 0, 31, 7, 12])
    qkv = torch.randn(T, (HQ + 2 * HK) * D, generator=g).to(DEVICE, dt)
    x = qkv.double().cpu().view(T, HQ + 2 * HK, D)
    cos, sin = table.double().cpu()[pos].split(D // 2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1)[:, None], torch.cat((sin, sin), -1)[:, None]
    rot = torch.cat((-x[..., D // 2:], x[..., : D // 2]), dim=-1)
    want = torch.cat(((x * cos + rot * sin)[:, : HQ + HK], x[:, HQ + HK:]), dim=1)  # q, k rotated; v as is
    kc, vc = caches(dt)
    store = KVStore(triton=True, rope_table=table, config=cfg)
    assert store.fuses_rope(T, dt, dt)
    assert not KVStore(triton=True, rope_table=torch.zeros(P, 24)).fuses_rope(T, dt, dt)  # head_dim not a power of 2
    assert not store.fuses_rope(KernelConfig().rope_store_max_tokens + 1, dt, dt)
    long = KernelConfig().rope_store_lora_max_tokens + 1  # a prompt past the LoRA bound: fused without adapters only
    assert store.fuses_rope(long, dt, dt) and not store.fuses_rope(long, dt, dt, lora=True)
    assert not store.fuses_rope(T, torch.float16 if dt != torch.float16 else torch.float32, dt)
    v_in = qkv.view(T, HQ + 2 * HK, D)[:, HQ + HK:].clone()
    store.rope_write((kc, vc), qkv, pos.to(DEVICE), HQ, HK, D, torch.tensor(slots, device=DEVICE))
    got = qkv.view(T, HQ + 2 * HK, D)
    tol = 1e-5 if dt == torch.float32 else 2e-2
    torch.testing.assert_close(got.double().cpu(), want, rtol=tol, atol=tol)
    assert torch.equal(got[:, HQ + HK:], v_in)  # v is not rotated
    ref_k, ref_v = caches(dt)  # the caches before the write
    assert torch.equal(kc, placed(ref_k, got[:, HQ:HQ + HK], slots))  # the rotated k, at the slots only
    assert torch.equal(vc, placed(ref_v, v_in, slots))


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("cfg", BLOCK_T.values(), ids=BLOCK_T.keys())
def test_rope_write_with_qk_norm_normalises_q_and_k_heads_before_rope(cfg):
    """Qwen3's q / k norms in the fused kernel: each q head and k head divided by its RMS and times its
    norm weight (float64 here), then rotated; v untouched; the cache holds the normalised, rotated k.
    With KernelConfig(rope_store_qk_norm=False) the fused path is not offered to a layer with q / k norms."""
    g = torch.Generator().manual_seed(5)
    HQ, T, P, eps = 4, 5, 32, 1e-6
    slots = [9, -1, 2, 17, 6]
    dt = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    table = rope_table(P)
    pos = torch.tensor([3, 0, 31, 7, 12])
    qkv = (3 * torch.randn(T, (HQ + 2 * HK) * D, generator=g)).to(DEVICE, dt)  # rms far from 1
    qw, kw = (1 + 0.5 * torch.randn(D, generator=g)).to(DEVICE, dt), (1 + 0.5 * torch.randn(D, generator=g)).to(DEVICE, dt)
    x = qkv.double().cpu().view(T, HQ + 2 * HK, D)
    w = torch.cat((qw.double().cpu().expand(HQ, D), kw.double().cpu().expand(HK, D)))  # [HQ + HK, D]
    qk = x[:, : HQ + HK]
    qk = qk / torch.sqrt(qk.pow(2).mean(-1, keepdim=True) + eps) * w
    cos, sin = table.double().cpu()[pos].split(D // 2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1)[:, None], torch.cat((sin, sin), -1)[:, None]
    rot = torch.cat((-qk[..., D // 2:], qk[..., : D // 2]), dim=-1)
    want = torch.cat((qk * cos + rot * sin, x[:, HQ + HK:]), dim=1)
    kc, vc = caches(dt)
    store = KVStore(triton=True, rope_table=table, config=cfg)
    assert store.fuses_rope(T, dt, dt, qk_norm=True)
    off = KVStore(triton=True, rope_table=table, config=KernelConfig(rope_store_qk_norm=False))
    assert off.fuses_rope(T, dt, dt) and not off.fuses_rope(T, dt, dt, qk_norm=True)
    v_in = qkv.view(T, HQ + 2 * HK, D)[:, HQ + HK:].clone()
    store.rope_write((kc, vc), qkv, pos.to(DEVICE), HQ, HK, D, torch.tensor(slots, device=DEVICE), qk_norm=(qw, kw, eps))
    got = qkv.view(T, HQ + 2 * HK, D)
    tol = 1e-5 if dt == torch.float32 else 3e-2
    torch.testing.assert_close(got.double().cpu(), want, rtol=tol, atol=tol)
    assert torch.equal(got[:, HQ + HK:], v_in)
    ref_k, ref_v = caches(dt)
    assert torch.equal(kc, placed(ref_k, got[:, HQ:HQ + HK], slots))
    assert torch.equal(vc, placed(ref_v, v_in, slots))


# -- FP8 (e4m3) caches: round(x / scale) clamped to +-448, the layer's scales read from the device ---------
FP8 = torch.float8_e4m3fn


def e4m3(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The oracle's own rounding: x / scale in float32, clamped, to e4m3 (torch's round to nearest even)."""
    return (x.float().cpu() / scale).clamp(-448.0, 448.0).to(FP8)


def fp8_caches(device=DEVICE):
    return tuple(torch.zeros(BLOCKS, BLOCK_SIZE, HK, D, device=device).to(FP8) for _ in range(2))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


def placed_fp8(rows: torch.Tensor, scale: float, slots: list[int]) -> torch.Tensor:
    want = torch.zeros(BLOCKS, BLOCK_SIZE, HK, D).to(FP8)
    for t, s in enumerate(slots):
        if s >= 0:
            want[s // BLOCK_SIZE, s % BLOCK_SIZE] = e4m3(rows[t], scale)
    return want


def scaled_store(device, triton: bool, rope_table=None, layer_scales=((1.0, 0.02), (1.0, 0.05))):
    """A two-layer store whose layer 1 has K scale 0.02 and V scale 0.05 (small: many values saturate)."""
    store = KVStore(triton=triton, rope_table=rope_table, num_layers=2, device=device)
    store.set_scales(*layer_scales)
    return store


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_fp8_write_stores_e4m3_of_x_over_the_layers_scale(impl):
    if impl == "triton" and not HAS_TRITON:
        pytest.skip("triton is not installed")
    device = "cpu" if impl == "torch" else DEVICE
    slots = [3, -1, 9, 22, 20]
    g = torch.Generator().manual_seed(6)
    dt = torch.float32 if impl == "torch" else torch.float16
    k, v = (torch.randn(len(slots), HK, D, generator=g).mul(12).to(device, dt) for _ in range(2))
    kc, vc = fp8_caches(device)
    store = scaled_store(device, impl == "triton")
    store.write((kc, vc), k, v, make_batch(slots, device), layer=1)
    assert kc.dtype == FP8 and (bits(kc) == bits(placed_fp8(k, 0.02, slots))).all()
    assert (bits(vc) == bits(placed_fp8(v, 0.05, slots))).all()
    assert bits(kc).ne(0).any() and (kc.float().abs() == 448).any()  # written, and some saturated


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_fp8_store_kernel_sees_a_later_change_of_scale_in_place():
    """The kernel reads the scale through its pointer: set_scales in place changes what it writes."""
    slots = [0, 5]
    k = torch.full((2, HK, D), 1.5, device=DEVICE, dtype=torch.float16)
    kc, vc = fp8_caches()
    store = scaled_store(DEVICE, True)
    ptr = store.scales.data_ptr()
    store.set_scales([1.0, 0.5], [1.0, 1.0])
    assert store.scales.data_ptr() == ptr
    store.write((kc, vc), k, k, make_batch(slots), layer=1)
    assert torch.equal(kc.float()[0, 0].cpu(), torch.full((HK, D), 3.0))
    assert torch.equal(vc.float()[0, 0].cpu(), k[0].float().cpu())


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("cfg", BLOCK_T.values(), ids=BLOCK_T.keys())
def test_fp8_rope_write_stores_e4m3_of_the_rotated_k_and_of_v(cfg):
    """The fused RoPE + store into an e4m3 cache: the cache holds e4m3(k_rot / k_scale) and
    e4m3(v / v_scale) of the rows the kernel leaves in qkv (the rotated k, rounded to qkv's dtype)."""
    g = torch.Generator().manual_seed(8)
    HQ, T, P = 4, 5, 32
    slots = [9, -1, 2, 17, 6]
    dt = torch.float32 if DEVICE == "cpu" else torch.bfloat16
    table = rope_table(P)
    pos = torch.tensor([3, 0, 31, 7, 12], device=DEVICE)
    qkv = (torch.randn(T, (HQ + 2 * HK) * D, generator=g) * 12).to(DEVICE, dt)
    kc, vc = fp8_caches()
    store = scaled_store(DEVICE, True, rope_table=table)
    store.config = cfg
    assert store.fuses_rope(T, FP8, dt)
    store.rope_write((kc, vc), qkv, pos, HQ, HK, D, torch.tensor(slots, device=DEVICE), layer=1)
    got = qkv.view(T, HQ + 2 * HK, D)
    assert (bits(kc) == bits(placed_fp8(got[:, HQ:HQ + HK], 0.02, slots))).all()
    assert (bits(vc) == bits(placed_fp8(got[:, HQ + HK:], 0.05, slots))).all()


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_fp8_store_rounds_ties_and_near_ties_as_torch():
    """e4m3 rounding at its hardest points: every midpoint between neighbouring e4m3 values (ties go
    to even), the float32 values just below and above each, subnormals and +-448, stored by the Triton
    kernel at scale 1 (layer 0), bit for bit as torch's float32 -> float8_e4m3fn (round to nearest even).
    On sm90 the hardware conversion alone rounds some of these the other way (it goes through fp16)."""
    grid = torch.arange(0, 127, dtype=torch.uint8).view(FP8).float()  # the non-negative finite e4m3 values
    mid = (grid[:-1] + grid[1:]) / 2
    near = torch.cat([mid, torch.nextafter(mid, torch.tensor(0.0)), torch.nextafter(mid, torch.tensor(1e9)), grid])
    for x in (near, -near):  # (one sign per write: the cache holds 24 rows of HK x D values)
        rows = -(-x.numel() // (HK * D))
        vals = torch.zeros(rows * HK * D)
        vals[: x.numel()] = x
        k = vals.view(rows, HK, D).to(DEVICE)
        slots = list(range(rows))
        kc, vc = fp8_caches(DEVICE)
        scaled_store(DEVICE, True).write((kc, vc), k, k.clone(), make_batch(slots, DEVICE), layer=0)
        want = placed_fp8(k.cpu(), 1.0, slots)
        assert (bits(kc) == bits(want)).all() and (bits(vc) == bits(want)).all()
