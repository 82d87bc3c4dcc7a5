"""GPU tests (`pytest -m cuda`) of KernelConfig.gemv_add_norm: the residual add + RMSNorm inside the
prologue of the GEMV after it (qkv, dense gate_up; bf16 and FP8 weights; a MoE model's qkv), against the
same model with the switch off (the add_rms_norm kernel, then the GEMV), in decode graphs at batch 1 and
2 (gemv_add_norm_max_tokens 2, every consumer on: the fused path at both). The fused prologue may round
the normalized rows an ulp apart (its sum of squares in another order: tests/kernels/test_norm_prologue.py),
so the steps agree within a bf16 bound, and their greedy tokens wherever the top two logits are further
apart than the two runs differ. A spy on the kernels' entry points (calling through) checks that the
fused path ran."""

from __future__ import annotations

import pytest
import torch

from conftest import make_checkpoint, rel_err

pytestmark = pytest.mark.cuda

if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("flashinfer")

from model_wrapper.kernels import KernelConfig  # noqa: E402
from text_generator import TextGenerator  # noqa: E402

TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            vocab_size=96, max_position_embeddings=1024)
MOE = dict(TINY, num_experts=16, moe_intermediate_size=96)


def _decode(gen, batch: int, seed: int = 5):
    """A prefill of `batch` prompts, then six decode steps of random tokens -> the steps' logits."""
    from test_cuda_model import _decode_run

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in torch.randint(3, 30, (batch,),
                                                                                               generator=g)]
    tokens = torch.randint(0, 96, (6, batch), generator=g).tolist()
    steps, _ = _decode_run(gen, prompts, tokens)
    return steps


def _spy(monkeypatch):
    """Count the fused launches: gemv / fp8_gemv with add_norm (calling through)."""
    import model_wrapper.kernels.fp8 as fp8
    import model_wrapper.kernels.ops as ops

    seen = []

    def wrap(mod, name):
        fn = getattr(mod, name)

        def spied(*args, **kw):
            if kw.get("add_norm") is not None:
                seen.append(name)
            return fn(*args, **kw)

        monkeypatch.setattr(mod, name, spied)

    wrap(ops, "gemv")
    wrap(fp8, "fp8_gemv")
    return seen


def _agree(a, b):
    for x, y in zip(a, b):
        assert rel_err(y, x) < 2e-2
        ax, ay = x.argmax(-1, keepdim=True), y.argmax(-1, keepdim=True)
        margin = (x.gather(-1, ax) - x.gather(-1, ay)).squeeze(-1)
        assert torch.all((ax == ay).squeeze(-1) | (margin <= 2 * (x - y).abs().amax(-1)))


def _on_off(path, batch, monkeypatch, want):
    off = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                        kernel_config=KernelConfig(gemv_add_norm=False))
    a = _decode(off, batch)
    del off
    seen = _spy(monkeypatch)
    on = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                       kernel_config=KernelConfig(gemv_add_norm=True, gemv_add_norm_max_tokens=2,
                                                                 gemv_add_norm_qkv=True))
    b = _decode(on, batch)
    assert on.model_wrapper.graphs._graphs, "no graph was captured"
    assert set(seen) == want, seen
    _agree(a, b)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_decode_graphs_with_the_norm_in_the_gemv(tmp_path, family, batch, monkeypatch):
    path = make_checkpoint(tmp_path / family, family, **TINY)
    _on_off(path, batch, monkeypatch, {"gemv"})


@pytest.mark.parametrize("batch", [1, 2])
def test_fp8_decode_graphs_with_the_norm_in_the_fp8_gemv(tmp_path, batch, monkeypatch):
    from fp8_checkpoints import write_fp8

    src = make_checkpoint(tmp_path / "src", "llama", **TINY)
    path, _, _ = write_fp8(src, tmp_path / "fp8", "block")
    _on_off(path, batch, monkeypatch, {"fp8_gemv"})


@pytest.mark.parametrize("batch", [1, 2])
def test_moe_decode_graphs_with_the_norm_in_qkv(tmp_path, batch, monkeypatch):
    path = make_checkpoint(tmp_path / "moe", "qwen3_moe", **MOE)
    _on_off(path, batch, monkeypatch, {"gemv"})
