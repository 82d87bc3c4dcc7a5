"""The activation quantization fused into its producers (model_wrapper/kernels/fp8_act.py): the
e4m3 values and scales must be, bit for bit, the reference quantizer (kernels/fp8_reference.py
quantize_fp8_reference) applied to what the unfused producer writes. Under Triton's interpreter
on the CPU and on CUDA (every test here runs on both): the residual add + RMSNorm (its normed
output against the reference norm to rounding, its residual exact) and SiLU-and-mul (against the
project's silu_and_mul kernel, the unfused producer). On CUDA also (marked cuda): the FP8 linear
fed the fused activation equals the one fed the unfused, and a tiny FP8 model's prefill takes the
fused kernels and stays within the FP8 bounds of transformers on the dequantized weights."""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from triton_interpret import DEVICE, INTERPRET, TOL, on_cuda_skip  # first: it sets up the interpreter

from model_wrapper.kernels import fp8_act  # noqa: E402
from model_wrapper.kernels.activation import silu_and_mul  # noqa: E402
from model_wrapper.kernels.fp8_reference import FP8_MAX, MIN_AMAX, quantize_fp8_reference  # noqa: E402
from model_wrapper.layers.norm import rms_norm  # noqa: E402
from conftest import rel_err  # noqa: E402

E4M3 = torch.float8_e4m3fn
pytestmark = [] if INTERPRET else [pytest.mark.cuda]  # on a GPU machine: with the other `-m cuda` tests


def check_layout(act, M, n, group):
    """Mp rows (M padded to 16), scales [Mp, KG] with stride(0) == 1; padding rows q = 0 with the
    all-zero group's scale."""
    mp, kg = -(-M // 16) * 16, -(-n // group)
    assert act.q.dtype == E4M3 and act.q.shape == (mp, n) and act.rows == M and act.shape == (M, n)
    assert act.scale.dtype == torch.float32 and act.scale.shape == (mp, kg) and act.scale.stride(0) == 1
    assert (act.q[M:].float() == 0).all()
    assert torch.equal(act.scale[M:], torch.full((mp - M, kg), MIN_AMAX / FP8_MAX, device=act.q.device))


def assert_is_reference_quantization(act, x, group):
    """act's first rows are quantize_fp8_reference(x), bit for bit (e4m3 bit patterns and scales).
    The reference runs on the CPU: IEEE divisions there (torch's CUDA division by a scalar
    multiplies by the reciprocal: an ulp off at times)."""
    want_q, want_s = quantize_fp8_reference(x.cpu(), group)
    M = x.shape[0]
    assert torch.equal(act.q[:M].cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(act.scale[:M].cpu(), want_s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("residual", [True, False], ids=["add", "first-layer"])
def test_norm_quantization_is_the_reference_quantizer_of_the_normed_rows(dtype, residual):
    """add_rms_norm_fp8: residual <- residual + x exactly (the reference's bf16 add); the normed
    rows (write_x) are weight * RMSNorm(residual) to rounding; q / scales are
    quantize_fp8_reference of exactly those rows. Rows: 1, 5 and 17 (padding to 16 / 32), widths
    a multiple of 128 and not (the last group partial), an all-zero row, a row with one outlier
    (its group's scale from that value), and without write_x the same q / scales."""
    g = torch.Generator().manual_seed(11)
    for M, n in ((1, 256), (5, 300), (17, 640)):
        x = torch.randn(M, n, generator=g).to(DEVICE, dtype)
        r = torch.randn(M, n, generator=g).to(DEVICE, dtype)
        w = (torch.rand(n, generator=g) + 0.5).to(DEVICE, dtype)
        if M > 1:
            x[1], r[1] = 0, 0
            x[0, 3] = 60.0
        r0 = r.clone()
        act = fp8_act.add_rms_norm_fp8(x, r if residual else None, w, 1e-5, 128, write_x=True)
        check_layout(act, M, n, 128)
        base = (r0.float() + x.float()).to(dtype) if residual else x
        if residual:
            assert torch.equal(r, base)
        assert act.x.dtype == dtype and act.x.shape == (M, n)
        assert rel_err(act.x.double(), rms_norm(base, w, 1e-5).double()) < TOL[dtype]
        assert_is_reference_quantization(act, act.x, 128)
        if M > 1:
            assert (act.q[1].float() == 0).all()
        again = fp8_act.add_rms_norm_fp8(x, r0.clone() if residual else None, w, 1e-5, 128)
        assert again.x is None
        assert torch.equal(again.q.view(torch.uint8), act.q.view(torch.uint8)) and torch.equal(again.scale, act.scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_silu_quantization_is_the_reference_quantizer_of_silu_and_mul(dtype):
    """silu_and_mul_fp8: its unquantized rows (write_x) are the silu_and_mul kernel's output bit
    for bit, and q / scales are quantize_fp8_reference of them; the group split over several
    programs (n = 5000: 40 groups), a partial last group, strided rows, an all-zero row."""
    g = torch.Generator().manual_seed(12)
    for M, n, strided in ((3, 300, False), (18, 5000, True), (1, 128, False)):
        gu = torch.randn(M, 2 * n + (8 if strided else 0), generator=g).to(DEVICE, dtype)
        gu = gu[:, :2 * n] if strided else gu
        if M > 2:
            gu[2] = 0
        act = fp8_act.silu_and_mul_fp8(gu, 128, write_x=True)
        check_layout(act, M, n, 128)
        want = silu_and_mul(gu.contiguous())
        assert torch.equal(act.x, want)
        assert_is_reference_quantization(act, want, 128)
        plain = fp8_act.silu_and_mul_fp8(gu, 128)
        assert torch.equal(plain.q.view(torch.uint8), act.q.view(torch.uint8)) and torch.equal(plain.scale, act.scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_per_token_quantization_in_the_producers_is_the_standalone_quantizer(dtype):
    """One group a row (group = the width: the row-wise "scaled_mm" path's per-token activations,
    KernelConfig.fp8_fused_act_quant_per_token): the norm's (widths a power of 2) and SiLU-and-mul's
    (widths 448 = 14336 / 32 and 300, padded to one tile) q and scales [Mp, 1] equal the standalone
    per-token quantize kernel's (_quantize(x, K): what fp8_scaled_mm runs on the unfused rows) and
    quantize_fp8_reference's, bit for bit."""
    g = torch.Generator().manual_seed(13)
    for M, n in ((1, 256), (17, 512)):
        x = torch.randn(M, n, generator=g).to(DEVICE, dtype)
        r = torch.randn(M, n, generator=g).to(DEVICE, dtype)
        w = (torch.rand(n, generator=g) + 0.5).to(DEVICE, dtype)
        assert fp8_act.norm_fp8_fits(x, n)
        act = fp8_act.add_rms_norm_fp8(x, r, w, 1e-5, n, write_x=True)
        check_layout(act, M, n, n)
        q, s = fp8_act._quantize(act.x, n, None)
        assert torch.equal(act.q[:M].view(torch.uint8), q.view(torch.uint8)) and torch.equal(act.scale[:M], s)
        assert_is_reference_quantization(act, act.x, n)
    for M, n in ((3, 448), (18, 300)):
        gu = torch.randn(M, 2 * n, generator=g).to(DEVICE, dtype)
        act = fp8_act.silu_and_mul_fp8(gu, n, write_x=True)
        check_layout(act, M, n, n)
        q, s = fp8_act._quantize(act.x, n, None)
        assert torch.equal(act.q[:M].view(torch.uint8), q.view(torch.uint8)) and torch.equal(act.scale[:M], s)
        assert_is_reference_quantization(act, act.x, n)


def test_norm_fits_whole_rows_of_power_of_two_groups():
    x = torch.zeros(2, 4096, dtype=torch.bfloat16)
    assert fp8_act.norm_fp8_fits(x, 128)
    assert not fp8_act.norm_fp8_fits(x, 96)  # not a power of 2
    assert not fp8_act.norm_fp8_fits(torch.zeros(2, 16385, dtype=torch.bfloat16), 128)  # past MAX_NORM_COLS
    assert not fp8_act.norm_fp8_fits(x.float(), 128)
    assert not fp8_act.norm_fp8_fits(x.t(), 128)


@pytest.mark.parametrize("M", [3, 16])
def test_skinny_mma_takes_the_norms_quantized_activation_as_its_own(M):
    """3-16 tokens ("skinny_mma" with KernelConfig.fp8_skinny_mma_fused_quant, off by default): the norm's QuantizedActivation of
    act_group(K, group) columns a scale (128 for block weights, K for a scale a row), in the norm's layout
    (scales with stride(0) == 1, rows padded to 16), gives fp8_skinny_mma, fp8_linear and fp8_gate_up_silu
    the bytes they give on the normed rows the norm wrote (which they quantize themselves): the same
    operands, bit for bit. An activation of another grouping is refused."""
    from model_wrapper.kernels import KernelConfig, fp8
    from model_wrapper.kernels.fp8_skinny_mma import act_group, fp8_skinny_mma

    g = torch.Generator().manual_seed(M)
    cfg, K, dtype = KernelConfig(), 256, torch.bfloat16
    x = torch.randn(M, K, generator=g).to(DEVICE, dtype)
    r = torch.randn(M, K, generator=g).to(DEVICE, dtype)
    nw = (torch.rand(K, generator=g) + 0.5).to(DEVICE, dtype)
    for group in (128, K):  # block weights; a scale a row
        w = (torch.randn(96, K, generator=g) * 64).clamp(-448, 448).to(DEVICE).to(E4M3)
        s = (torch.rand(96, -(-K // group), generator=g) * 1e-2 + 1e-3).to(DEVICE)
        act = fp8_act.add_rms_norm_fp8(x, r.clone(), nw, 1e-5, act_group(K, group), write_x=True)
        assert act.group == (128 if group < K else K)
        assert_is_reference_quantization(act, act.x, act.group)
        assert torch.equal(fp8_skinny_mma(act, w, s, group, cfg=cfg), fp8_skinny_mma(act.x, w, s, group, cfg=cfg))
        assert torch.equal(fp8.fp8_linear(act, w, s, group, cfg=cfg),
                           fp8_skinny_mma(act.x, w, s, group, cfg=cfg))
        assert torch.equal(fp8.fp8_gate_up_silu(act, w, s, group, cfg=cfg),
                           fp8_skinny_mma(act.x, w, s, group, silu=True, cfg=cfg))
        other = fp8_act.add_rms_norm_fp8(x, r.clone(), nw, 1e-5, 64)
        with pytest.raises(ValueError, match="quantized by"):
            fp8_skinny_mma(other, w, s, group, cfg=cfg)


# -- CUDA: the FP8 linears fed the fused activations ---------------------------------------------------

@pytest.mark.cuda
@on_cuda_skip
def test_fp8_linears_take_the_fused_activation_as_the_unfused_one():
    """On the "scaled_mm_block" path (cuBLASLt's block-scaled GEMM, 17+ tokens): fp8_linear of the
    norm's QuantizedActivation equals fp8_linear of the normed rows it wrote (the same quantized
    operand: bit for bit), and gate_up with quant_group (SiLU-and-mul + down's quantization in one
    kernel) then down equals gate_up, silu_and_mul, down. Llama-3-8B's layer widths, 40 tokens."""
    from model_wrapper.kernels import KernelConfig, fp8

    dev, cfg = "cuda", KernelConfig()
    g = torch.Generator(device=dev).manual_seed(1)
    H, inter, M = 4096, 14336, 40

    def weight(N, K):
        w = (torch.randn(N, K, device=dev, generator=g) * 64).clamp(-448, 448).to(E4M3)
        blocks = torch.rand(N // 128, K // 128, device=dev, generator=g) * 1e-3 + 1e-4
        return w, blocks.repeat_interleave(128, 0).contiguous(), blocks.contiguous().t()

    gate_up, down = weight(2 * inter, H), weight(H, inter)
    if not fp8.takes_quantized_input(M, torch.bfloat16, torch.device(dev), *down, cfg):
        pytest.skip("this GPU's torch._scaled_mm takes no 128 x 128 block scales")
    x = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    r = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    nw = torch.rand(H, device=dev, dtype=torch.bfloat16) + 0.5
    act = fp8_act.add_rms_norm_fp8(x, r, nw, 1e-5, 128, write_x=True)
    assert_is_reference_quantization(act, act.x, 128)
    w, s, b = gate_up
    fused = fp8.fp8_gate_up_silu(act, w, s, 128, cfg=cfg, block_scale=b, quant_group=128)
    plain = fp8.fp8_gate_up_silu(act.x, w, s, 128, cfg=cfg, block_scale=b)
    assert isinstance(fused, type(act)) and fused.rows == M
    assert_is_reference_quantization(fused, plain, 128)
    y_fused = fp8.fp8_linear(fused, down[0], down[1], 128, cfg=cfg, block_scale=down[2])
    y_plain = fp8.fp8_linear(plain, down[0], down[1], 128, cfg=cfg, block_scale=down[2])
    assert y_fused.shape == (M, H) and torch.equal(y_fused, y_plain)


@pytest.mark.cuda
@on_cuda_skip
def test_fp8_model_prefill_hands_exact_fused_activations_to_its_linears(checkpoint_dir, tmp_path, monkeypatch):
    """A tiny block-FP8 Llama on CUDA, eager, wide enough for cuBLASLt's block-scaled GEMM (hidden
    512, intermediate 1024: K a multiple of 4 x 128; at hidden 256 the H100 run took no projection
    down that path, so this test skipped): the scenario's prefill steps (24 and 18 tokens) run the
    fused norm and SiLU kernels (every layer's two norms and its SiLU-and-mul, counted), each call inside the model
    observed (the real kernel, asked for its unquantized rows too): the residual stream it updated
    normed by the reference RMSNorm is its rows to bf16 rounding, silu(gate) * up of its input
    likewise, and its e4m3 values and scales are quantize_fp8_reference of those rows, bit for bit.
    The logits stay as close to transformers on the dequantized weights as the unfused path's
    (KernelConfig(fp8_fused_act_quant=False), which makes no such call): the two differ only by
    the norm's bf16 roundings (FlashInfer's norm there)."""
    import torch.nn.functional as F

    from conftest import make_checkpoint
    from fp8_checkpoints import write_fp8
    from model_wrapper.kernels import KernelConfig, fp8
    from test_fp8_checkpoint import _cuda_vs_reference

    src = make_checkpoint(tmp_path / "src", "llama", hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                          num_key_value_heads=2)
    fp8_dir, deq, _ = write_fp8(src, tmp_path, "block")
    calls = {"norm": 0, "silu": 0}
    norm, silu = fp8_act.add_rms_norm_fp8, fp8_act.silu_and_mul_fp8

    def observed_norm(x, residual, weight, eps, group, write_x=False):
        act = norm(x, residual, weight, eps, group, write_x=True)
        base = x if residual is None else residual  # (updated in place: the residual stream)
        assert rel_err(act.x.double(), rms_norm(base, weight, eps).double()) < TOL[x.dtype]
        assert_is_reference_quantization(act, act.x, group)
        calls["norm"] += 1
        return act

    def observed_silu(gate_up, group, write_x=False):
        act = silu(gate_up, group, write_x=True)
        g, u = gate_up.float().chunk(2, dim=-1)
        assert rel_err(act.x.double(), (F.silu(g) * u).to(gate_up.dtype).double()) < TOL[gate_up.dtype]
        assert_is_reference_quantization(act, act.x, group)
        calls["silu"] += 1
        return act

    monkeypatch.setattr(fp8_act, "add_rms_norm_fp8", observed_norm)  # (FlashInferKernels imports it per call)
    monkeypatch.setattr(fp8, "silu_and_mul_fp8", observed_silu)  # (where fp8_gate_up_silu calls it)
    gen, err, top1 = _cuda_vs_reference(fp8_dir, deq, seed=4, cuda_graphs=False)  # eager: every step counted
    layers = len(gen.model_wrapper.model.model.layers)
    if calls["norm"] == 0:
        pytest.skip("this GPU's torch._scaled_mm takes no 128 x 128 block scales (no scaled_mm_block path)")
    assert calls["norm"] >= 2 * 2 * layers and calls["silu"] >= 2 * layers, (calls, layers)
    calls.update(norm=0, silu=0)
    _, err_off, top1_off = _cuda_vs_reference(fp8_dir, deq, seed=4, cuda_graphs=False,
                                              kernel_config=KernelConfig(fp8_fused_act_quant=False))
    assert calls == {"norm": 0, "silu": 0}
    assert err <= 1.5 * err_off + 0.02 and top1 >= top1_off - 0.2, (err, err_off, top1, top1_off)


@pytest.mark.cuda
@on_cuda_skip
def test_rowwise_linears_take_the_per_token_activation_as_the_unfused_one():
    """On the row-wise "scaled_mm" path (one weight scale a row; 17+ tokens), with
    fp8_fused_act_quant_per_token: quantized_input_group asks for one group a token (K) where the
    switch is on, the step is a prefill size and the row fits a producer's program; fp8_linear of the
    norm's per-token QuantizedActivation equals fp8_linear of the rows it wrote (the same quantized
    operand and GEMM: bit for bit), and gate_up with quant_group = down's K, then down, equals
    gate_up, silu_and_mul, down. fp8_fast_accum: the product stays within 2e-2 (relative, max) of
    the float64 product of the same e4m3 operands and scales. Llama-3-8B's widths, 40 tokens."""
    from model_wrapper.kernels import KernelConfig, fp8
    from model_wrapper.kernels.fp8_reference import dequantize_fp8_weight

    dev = "cuda"
    on = KernelConfig(fp8_fused_act_quant_per_token=True, fp8_fast_accum=False)
    g = torch.Generator(device=dev).manual_seed(2)
    H, inter, M = 4096, 14336, 40

    def weight(N, K):
        w = (torch.randn(N, K, device=dev, generator=g) * 64).clamp(-448, 448).to(E4M3)
        return w, torch.rand(N, 1, device=dev, generator=g) * 1e-3 + 1e-4

    gate_up, down = weight(2 * inter, H), weight(H, inter)
    group = fp8.quantized_input_group
    bf16, cuda = torch.bfloat16, torch.device(dev)
    if fp8.path_for(M, bf16, cuda, *down, inter, on) != "scaled_mm":
        pytest.skip("no row-wise torch._scaled_mm path on this GPU")
    assert group(M, bf16, cuda, *gate_up, None, on) == H and group(M, bf16, cuda, *down, None, on) == inter
    assert group(M, bf16, cuda, *down, None, KernelConfig(fp8_fused_act_quant_per_token=False)) is None
    assert group(on.fp8_skinny_max_tokens, bf16, cuda, *down, None, on) is None  # a weight-only step
    x = torch.randn(M, H, device=dev, dtype=bf16)
    r = torch.randn(M, H, device=dev, dtype=bf16)
    nw = torch.rand(H, device=dev, dtype=bf16) + 0.5
    act = fp8_act.add_rms_norm_fp8(x, r, nw, 1e-5, H, write_x=True)
    assert_is_reference_quantization(act, act.x, H)
    w, s = gate_up
    fused = fp8.fp8_gate_up_silu(act, w, s, H, cfg=on, quant_group=inter)
    plain = fp8.fp8_gate_up_silu(act.x, w, s, H, cfg=on)
    assert isinstance(fused, type(act)) and fused.rows == M and fused.scale.shape[1] == 1
    assert_is_reference_quantization(fused, plain, inter)
    y_fused = fp8.fp8_linear(fused, *down, inter, cfg=on)
    y_plain = fp8.fp8_linear(plain, *down, inter, cfg=on)
    assert y_fused.shape == (M, H) and torch.equal(y_fused, y_plain)
    fast = fp8.fp8_linear(fused, *down, inter, cfg=KernelConfig(fp8_fast_accum=True))
    want = fused.dequantize().double() @ dequantize_fp8_weight(*down, inter, torch.float32).double().t()
    assert rel_err(fast.double(), want) < 2e-2
    assert rel_err(y_fused.double(), want) < TOL[bf16]


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("fast_accum", [False, True], ids=["exact-accum", "fast-accum"])
def test_rowwise_fp8_model_prefill_quantizes_per_token_in_the_producers(checkpoint_dir, tmp_path, monkeypatch,
                                                                       fast_accum):
    """A tiny per-channel ("channel_dynamic") FP8 Llama on CUDA, eager, hidden 512 / intermediate 1024,
    with fp8_fused_act_quant_per_token (and fp8_fast_accum; the defaults: both on): its prefill steps run
    the fused norm and SiLU kernels with one group a token (counted; each call's e4m3 values and scales the reference
    quantization of its rows), and the logits stay within the FP8 bounds of transformers on the
    dequantized weights as closely as with both switches off (standalone per-token quantize kernels, exact
    accumulation)."""
    from conftest import make_checkpoint
    from fp8_checkpoints import write_fp8
    from model_wrapper.kernels import KernelConfig, fp8
    from test_fp8_checkpoint import _cuda_vs_reference

    src = make_checkpoint(tmp_path / "src", "llama", hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                          num_key_value_heads=2)
    fp8_dir, deq, _ = write_fp8(src, tmp_path, "channel_dynamic")
    calls = {512: 0, 1024: 0}
    norm, silu = fp8_act.add_rms_norm_fp8, fp8_act.silu_and_mul_fp8

    def observed_norm(x, residual, weight, eps, group, write_x=False):
        act = norm(x, residual, weight, eps, group, write_x=True)
        assert_is_reference_quantization(act, act.x, group)
        calls[group] = calls.get(group, 0) + 1
        return act

    def observed_silu(gate_up, group, write_x=False):
        act = silu(gate_up, group, write_x=True)
        assert_is_reference_quantization(act, act.x, group)
        calls[group] = calls.get(group, 0) + 1
        return act

    monkeypatch.setattr(fp8_act, "add_rms_norm_fp8", observed_norm)
    monkeypatch.setattr(fp8, "silu_and_mul_fp8", observed_silu)
    # (the script's prefill steps are 17-32 tokens and more: past 16 on the row-wise GEMM, as before session 43 moved
    # per-channel skinny_mma's bound to 32; with it, the steps up to 32 quantize for skinny_mma and none of these
    # producers ran)
    cfg = KernelConfig(fp8_fused_act_quant_per_token=True, fp8_fast_accum=fast_accum, fp8_skinny_mma_row_max_tokens=16)
    gen, err, top1 = _cuda_vs_reference(fp8_dir, deq, seed=4, cuda_graphs=False, kernel_config=cfg)
    layers = len(gen.model_wrapper.model.model.layers)
    assert set(calls) == {512, 1024} and calls[512] >= 2 * 2 * layers and calls[1024] >= 2 * layers, calls
    calls.clear()
    off = KernelConfig(fp8_fused_act_quant_per_token=False, fp8_fast_accum=False, fp8_skinny_mma_row_max_tokens=16)
    _, err_off, top1_off = _cuda_vs_reference(fp8_dir, deq, seed=4, cuda_graphs=False, kernel_config=off)
    assert not calls
    assert err <= 1.5 * err_off + 0.02 and top1 >= top1_off - 0.2, (err, err_off, top1, top1_off)


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("fmt", ["block", "channel_dynamic"])
def test_fp8_model_decode_steps_quantize_in_the_norms_for_skinny_mma(checkpoint_dir, tmp_path, monkeypatch, fmt):
    """A tiny FP8 Llama on CUDA (hidden 512), eager: with KernelConfig.fp8_skinny_mma_fused_quant (off by
    default) its multi-token decode steps (3 and 6 tokens: the "skinny_mma" path) take qkv's and gate_up's
    inputs quantized by the add + RMSNorm (counted, each call's e4m3 values and scales the reference
    quantization of its rows); quantized_input_group asks for exactly that (128 for block weights, K for a
    scale a row) and for nothing with the switch off; the logits stay as close to transformers on the
    dequantized weights as with the switch off (skinny_mma's own quantize kernel on the norm's bf16 rows)."""
    from conftest import make_checkpoint
    from fp8_checkpoints import write_fp8
    from model_wrapper.kernels import KernelConfig, fp8
    from test_fp8_checkpoint import _cuda_vs_reference

    src = make_checkpoint(tmp_path / "src", "llama", hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                          num_key_value_heads=2)
    fp8_dir, deq, _ = write_fp8(src, tmp_path, fmt)
    want_group = 128 if fmt == "block" else 512
    small = []
    norm = fp8_act.add_rms_norm_fp8

    def observed_norm(x, residual, weight, eps, group, write_x=False):
        act = norm(x, residual, weight, eps, group, write_x=True)
        assert_is_reference_quantization(act, act.x, group)
        if x.shape[0] <= 16:
            small.append(group)
        return act

    monkeypatch.setattr(fp8_act, "add_rms_norm_fp8", observed_norm)
    on, off = KernelConfig(fp8_skinny_mma_fused_quant=True), KernelConfig()  # (off: the default)
    gen, err, top1 = _cuda_vs_reference(fp8_dir, deq, seed=4, cuda_graphs=False, kernel_config=on)
    layers = gen.model_wrapper.model.model.layers
    qkv = layers[0].self_attn.qkv_proj
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    group = fp8.quantized_input_group(3, bf16, cuda, qkv.weight, qkv.weight_scale, None, on, qkv.method.group)
    assert group == want_group, group
    assert fp8.quantized_input_group(3, bf16, cuda, qkv.weight, qkv.weight_scale, None, off, qkv.method.group) is None
    assert small and set(small) == {want_group} and len(small) >= 2 * 2 * len(layers), small
    small.clear()
    _, err_off, top1_off = _cuda_vs_reference(fp8_dir, deq, seed=4, cuda_graphs=False, kernel_config=off)
    assert not small
    assert err <= 1.5 * err_off + 0.02 and top1 >= top1_off - 0.2, (err, err_off, top1, top1_off)
