"""The block-FP8 GEMM through FlashInfer's DeepGEMM port (model_wrapper/kernels/fp8_deepgemm.py), the
second backend of kernels/fp8.py's "scaled_mm_block" path (KernelConfig.fp8_block_gemm_backend).

CPU: the config field is checked, and the backend declines what it cannot take (another backend
asked, an input off the GPU, fp16, N not a multiple of 64, fewer than 32 rows, "auto" below its
row bound: cuBLASLt above it). CUDA (`pytest -m cuda`, sm90 with FlashInfer's runner built; skipped elsewhere): the
GEMM on the producers' operands (e4m3 [Mp, K], scales [Mp, K / 128] with stride(0) 1) against the
float64 product of the same operands, beside cuBLASLt's error; fp8_linear and the fused producers'
QuantizedActivation take it when configured; a CUDA graph replays it bit for bit and a capture at
an unseen size takes cuBLASLt; a tiny block-FP8 Llama's prefill with it stays within
test_fp8_checkpoint.py's bounds of transformers on the dequantized weights, eager and graphed.
"""

import pytest
import torch

from triton_interpret import TOL, on_cuda_skip  # first: it sets up the interpreter

from model_wrapper.errors import ModelErrorCode, ModelLoadError  # noqa: E402
from model_wrapper.kernels import KernelConfig  # noqa: E402
from model_wrapper.kernels import fp8_deepgemm  # noqa: E402
from conftest import rel_err  # noqa: E402

E4M3 = torch.float8_e4m3fn
DEEPGEMM = KernelConfig(fp8_block_gemm_backend="deepgemm")
LLAMA_SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


def test_backend_field_is_checked():
    with pytest.raises(ModelLoadError) as e:
        KernelConfig(fp8_block_gemm_backend="cutlass")
    assert e.value.code == ModelErrorCode.BAD_CONFIG
    msg = str(e.value)
    assert "fp8_block_gemm_backend" in msg and "'auto', 'cublaslt', 'deepgemm'" in msg and "'cutlass'" in msg
    assert {KernelConfig(fp8_block_gemm_backend=b).fp8_block_gemm_backend for b in ("auto", "cublaslt", "deepgemm")} \
        == {"auto", "cublaslt", "deepgemm"}


def test_backend_declines_what_it_cannot_take():
    """wants() before any device query: each refusal below holds on any machine."""
    cuda, cpu, bf16 = torch.device("cuda", 0), torch.device("cpu"), torch.bfloat16
    auto = KernelConfig(fp8_block_gemm_backend="auto")
    assert not fp8_deepgemm.wants(KernelConfig(fp8_block_gemm_backend="cublaslt"), cuda, bf16, 4096, 4096, 4096)
    assert not fp8_deepgemm.wants(auto, cuda, bf16, 4096, 4096, fp8_deepgemm.AUTO_MAX_ROWS + 16)
    assert not fp8_deepgemm.wants(DEEPGEMM, cpu, bf16, 4096, 4096, 4096)
    assert not fp8_deepgemm.wants(DEEPGEMM, cuda, torch.float16, 4096, 4096, 4096)  # the binding writes bf16
    assert not fp8_deepgemm.wants(DEEPGEMM, cuda, bf16, 4096 + 32, 4096, 4096)  # N % 64
    assert not fp8_deepgemm.wants(DEEPGEMM, cuda, bf16, 4096, 4096, 16)  # the swapAB kernel's sizes


def test_block_weights_are_each_block_fp8_shape_once(tmp_path):
    """block_weights (the shapes warm() runs at load): a tiny block-FP8 Llama (hidden 512,
    intermediate 1024, 2 layers) loaded on the CPU with its e4m3 storage kept: one linear of each
    projection shape (fused qkv 768 x 512, o 512 x 512, fused gate_up 2048 x 512, down 512 x 1024),
    its e4m3 weight, and block scales [K/128, N/128] with stride(0) 1 whose transpose is a
    checkpoint's weight_scale_inv of that projection; warm() leaves a CPU model alone."""
    import os

    from safetensors.torch import load_file

    from conftest import make_checkpoint
    from fp8_checkpoints import write_fp8
    from model_wrapper.config import ModelConfig
    from model_wrapper.loader import load_model

    src = make_checkpoint(tmp_path / "src", "llama", hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                          num_key_value_heads=2)
    fp8_dir, _, _ = write_fp8(src, tmp_path, "block")
    model = load_model(fp8_dir, ModelConfig.from_pretrained(fp8_dir), dtype=torch.float32, device=torch.device("cpu"),
                       keep_fp8=True)
    got = fp8_deepgemm.block_weights(model)
    assert set(got) == {(768, 512), (512, 512), (2048, 512), (512, 1024)}
    ckpt = load_file(os.path.join(fp8_dir, "model.safetensors"))
    for (N, K), (w, bs) in got.items():
        assert w.dtype == E4M3 and w.shape == (N, K)
        assert bs.shape == (K // 128, N // 128) and bs.stride(0) == 1
    for proj in ("o_proj", "down_proj"):  # (unfused: their scales are the checkpoint's as they stand)
        N, K = (512, 512) if proj == "o_proj" else (512, 1024)
        want = [t for name, t in ckpt.items() if name.endswith(f"{proj}.weight_scale_inv")]
        assert any(torch.equal(got[(N, K)][1].t(), t.float()) for t in want), proj
    fp8_deepgemm.warm(model, DEEPGEMM, torch.device("cpu"), torch.bfloat16)  # no-op off CUDA


# -- CUDA ---------------------------------------------------------------------------------------------

def _usable_or_skip(N=4096, K=4096):
    dev = torch.device("cuda", torch.cuda.current_device())
    if torch.cuda.get_device_capability(dev) != (9, 0):
        pytest.skip("FlashInfer's DeepGEMM port runs on sm90 only")
    if not fp8_deepgemm.usable(dev, N, K):
        pytest.skip("FlashInfer's DeepGEMM runner did not build or load here (its warning says why)")
    return dev


def _activation(M, K, g, dev):
    """x [M, K] bf16 and the producers' operands: e4m3 [Mp, K] and scales [Mp, K / 128] with
    stride(0) == 1 (fp8_act._quantize, as fp8_scaled_mm_block calls it)."""
    from model_wrapper.kernels.fp8_act import _quantize

    x = torch.randn(M, K, device=dev, generator=g).to(torch.bfloat16)
    return (x, *_quantize(x, 128, None, rows=-(-M // 16) * 16, outer=True))


def _weight(N, K, g, dev):
    """e4m3 [N, K] and its block scales as Fp8Method keeps them ([K/128, N/128], stride(0) == 1),
    different per 128 x 128 block."""
    w = (torch.randn(N, K, device=dev, generator=g) * 64).clamp(-448, 448).to(E4M3)
    blocks = torch.exp(torch.randn(N // 128, K // 128, device=dev, generator=g)) / (64 * K**0.5)
    return w, blocks.t()


def _product(a, a_s, M, w, blocks):
    """float64 product of the first M rows of the e4m3 operands with their scales."""
    return (a[:M].double() * a_s[:M].double().repeat_interleave(128, dim=1)) @ (
        w.double() * blocks.t().double().repeat_interleave(128, 0).repeat_interleave(128, 1)).t()


def _operands(M, N, K, g, dev):
    x, a, a_s = _activation(M, K, g, dev)
    w, blocks = _weight(N, K, g, dev)
    return x, a, a_s, w, blocks, _product(a, a_s, M, w, blocks)


@pytest.mark.cuda
@on_cuda_skip
def test_deepgemm_is_the_product_of_its_operands():
    """Llama-3-8B's four projection shapes and a small one (768 x 512) at 17, 64, 257, 1000 and 4096
    tokens: max rel. error against float64 of the same e4m3 operands within bf16's bound and at most
    twice cuBLASLt's (the fp32 promotion every 128 K: no fast-accumulation drift at K = 14336)."""
    from model_wrapper.kernels.fp8 import _block_mm

    dev = _usable_or_skip()
    g = torch.Generator(device=dev).manual_seed(3)
    for N, K in LLAMA_SHAPES + ((768, 512),):
        for M in (17, 64, 257, 1000, 4096):
            if M == 4096 and N == 28672:
                continue  # the same kernel as 1000 tokens, longer
            _, a, a_s, w, blocks, want = _operands(M, N, K, g, dev)
            got = fp8_deepgemm.block_mm(a, a_s, M, w, blocks)
            assert got is not None and got.shape == (M, N) and got.dtype == torch.bfloat16
            blas = _block_mm(a, a_s, M, w, blocks, None, torch.bfloat16, None)
            err, err_blas = rel_err(got.double(), want), rel_err(blas.double(), want)
            assert err < TOL[torch.bfloat16] and err <= 2 * err_blas + 1e-3, (M, N, K, err, err_blas)


@pytest.mark.cuda
@on_cuda_skip
def test_fp8_linear_takes_deepgemm_when_configured():
    """With fp8_block_gemm_backend "deepgemm", fp8_linear of bf16 rows (its own quantization) and of
    the norm's QuantizedActivation (the fused producer, kernels/fp8_act.py) both equal block_mm on
    the same quantized operands, bit for bit; with "cublaslt" the product is cuBLASLt's."""
    from model_wrapper.kernels import fp8, fp8_act
    from model_wrapper.kernels.fp8 import _block_mm

    dev = _usable_or_skip()
    g = torch.Generator(device=dev).manual_seed(4)
    M, N, K = 300, 6144, 4096
    x, a, a_s, w, blocks, _ = _operands(M, N, K, g, dev)
    s = blocks.t().repeat_interleave(128, 0).contiguous()  # the per-row scales [N, K / 128]
    assert fp8.fp8_path(x, w, s, 128, DEEPGEMM, block_scale=blocks) == "scaled_mm_block"
    direct = fp8_deepgemm.block_mm(a, a_s, M, w, blocks)
    assert torch.equal(fp8.fp8_linear(x, w, s, 128, cfg=DEEPGEMM, block_scale=blocks), direct)
    cublas = KernelConfig(fp8_block_gemm_backend="cublaslt")
    assert torch.equal(fp8.fp8_linear(x, w, s, 128, cfg=cublas, block_scale=blocks),
                       _block_mm(a, a_s, M, w, blocks, None, torch.bfloat16, None))
    nw = torch.ones(K, device=dev, dtype=torch.bfloat16)
    act = fp8_act.add_rms_norm_fp8(x, None, nw, 1e-5, 128, write_x=True)
    y = fp8.fp8_linear(act, w, s, 128, cfg=DEEPGEMM, block_scale=blocks)
    assert torch.equal(y, fp8_deepgemm.block_mm(act.q, act.scale, M, w, blocks))
    assert rel_err(y.double(), act.dequantize().double() @ (w.double() * s.double().repeat_interleave(128, 1)).t()) \
        < TOL[torch.bfloat16]


@pytest.mark.cuda
@on_cuda_skip
def test_deepgemm_replays_in_a_cuda_graph():
    """A size run eagerly first replays in a CUDA graph bit for bit; a capture at a size never run
    outside one takes cuBLASLt (no compile inside a capture) and is still the product."""
    from model_wrapper.kernels.fp8 import _block_mm

    dev = _usable_or_skip()
    g = torch.Generator(device=dev).manual_seed(5)
    N, K = 4096, 4096
    w, blocks = _weight(N, K, g, dev)
    _, a, a_s = _activation(512, K, g, dev)
    _, a2, a2_s = _activation(1100, K, g, dev)  # 1104 padded rows: no other test runs that size
    eager = _block_mm(a, a_s, 512, w, blocks, None, torch.bfloat16, DEEPGEMM)
    assert (dev.index, N, K, 512) in fp8_deepgemm._SEEN and (dev.index, N, K, 1104) not in fp8_deepgemm._SEEN
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = _block_mm(a, a_s, 512, w, blocks, None, torch.bfloat16, DEEPGEMM)
        y2 = _block_mm(a2, a2_s, 1100, w, blocks, None, torch.bfloat16, DEEPGEMM)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager)
    assert rel_err(y2.double(), _product(a2, a2_s, 1100, w, blocks)) < TOL[torch.bfloat16]  # (cuBLASLt's)
    assert (dev.index, N, K, 1104) not in fp8_deepgemm._SEEN  # the capture compiled nothing


def _run_model(fp8_dir, deq, seed, graphs, cfg):
    """-> (logits [steps' outputs, vocab] float32, max rel. err and top-1 agreement against transformers
    fp32 on the dequantized weights) of test_fp8_checkpoint's scenario (prefill, mixed and decode steps)."""
    from test_forward_parity import _max_err, _reference, _script, run_scenario
    from text_generator import TextGenerator

    gen = TextGenerator.from_pretrained(fp8_dir, device="cuda", dtype=torch.bfloat16, cuda_graphs=graphs,
                                        kernel_config=cfg)
    full, steps = _script(seed)
    outputs = [(r, p, o.float().cpu()) for r, p, o in run_scenario(gen, full, steps, block_size=16)]
    ref = _reference(deq, torch.float32, full)
    got = torch.stack([o for *_, o in outputs])
    want = torch.stack([ref[r][p] for r, p, _ in outputs])
    return got, _max_err(outputs, ref), float((got.argmax(-1) == want.argmax(-1)).float().mean())


@pytest.mark.cuda
@on_cuda_skip
@pytest.mark.parametrize("graphs", [False, True])
def test_block_fp8_model_with_deepgemm_within_bounds(tmp_path, monkeypatch, graphs):
    """A tiny block-FP8 Llama (hidden 512, intermediate 1024: every projection's N a multiple of 64
    and K of 128) with fp8_block_gemm_backend "deepgemm": its prefill and multi-token steps run the
    DeepGEMM GEMM (the calls counted on the real function); its logits against transformers fp32 on the
    dequantized weights stay within test_fp8_checkpoint.py's error bound beside bf16 on the same
    weights, and the same model with the cuBLASLt backend gives nearly the same logits (the two GEMMs
    differ by fp32 summation order only, which an e4m3 rounding downstream may amplify; a wrong scale
    layout or padding would be O(1)), eager and in CUDA graphs."""
    from conftest import make_checkpoint
    from fp8_checkpoints import write_fp8

    _usable_or_skip(768, 512)
    src = make_checkpoint(tmp_path / "src", "llama", hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                          num_key_value_heads=2)
    fp8_dir, deq, _ = write_fp8(src, tmp_path, "block")
    calls = []
    real = fp8_deepgemm.block_mm

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(fp8_deepgemm, "block_mm", counted)  # (kernels/fp8.py calls it through the module)
    got, err, top1 = _run_model(fp8_dir, deq, 4, graphs, DEEPGEMM)
    assert calls, "no step took the DeepGEMM GEMM"
    n = len(calls)
    blas, err_blas, top1_blas = _run_model(fp8_dir, deq, 4, graphs, KernelConfig(fp8_block_gemm_backend="cublaslt"))
    assert len(calls) == n  # (the cuBLASLt run made no DeepGEMM call)
    _, err16, top1_16 = _run_model(deq, deq, 4, graphs, KernelConfig())
    apart = rel_err(got, blas)
    print(f"graphs={graphs}: {n} DeepGEMM calls; rel. err / top-1 against fp32: DeepGEMM {err:.4f} / {top1:.3f}, "
          f"cuBLASLt {err_blas:.4f} / {top1_blas:.3f}, bf16 {err16:.4f} / {top1_16:.3f}; DeepGEMM against "
          f"cuBLASLt {apart:.4f}, top-1 {float((got.argmax(-1) == blas.argmax(-1)).float().mean()):.3f}")
    assert apart < max(0.05, 0.5 * err_blas), (apart, err_blas)
    assert err <= 4 * err16 + 0.1, (err, err16)  # test_fp8_checkpoint._within_fp8_bounds' error bound
    assert err <= 1.5 * err_blas + 0.02 and top1 >= top1_blas - 0.1, (err, err_blas, top1, top1_blas)
