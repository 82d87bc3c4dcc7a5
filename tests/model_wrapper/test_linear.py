"""The linear seam (model_wrapper/layers/linear.py) and LoRA as its wrapper (adapters/lora_layers.py).

Oracles: the direct computation (x @ W^T + b, silu(gate) * up) for the linears and a weight
format plugged in as a method; transformers' model for a generator whose projections LoRA wraps.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from adapters import LoraLinear
from conftest import PagedHarness, hf_model, rel_err
from model_wrapper.layers.kernels import TorchKernels
from model_wrapper.layers.linear import GateUpLinear, Linear, RowParallelLinear
from model_wrapper.parallel import TPGroup
from text_generator import TextGenerator

KERNELS = TorchKernels(torch.ones(4), torch.float64)


def _filled(linear: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in linear.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    return linear


@pytest.mark.parametrize("bias", [False, True])
def test_linears_compute_the_projection(bias):
    x = torch.randn(5, 12, dtype=torch.float64)
    lin = _filled(Linear(12, 10, bias=bias).double(), 1)
    row = _filled(RowParallelLinear(12, 10, bias=bias, tp=TPGroup.single()).double(), 2)
    gate_up = _filled(GateUpLinear(12, 2 * 7, bias=bias).double(), 3)
    for proj in (lin, row):
        y, tail = proj(x, None, KERNELS)
        want = x @ proj.weight.T + (proj.bias if bias else 0)
        assert tail is None and torch.allclose(y, want, rtol=1e-12, atol=1e-12)
    gu = x @ gate_up.weight.T + (gate_up.bias if bias else 0)
    want = F.silu(gu[:, :7]) * gu[:, 7:]
    assert torch.allclose(gate_up.silu(x, None, KERNELS), want, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="row scale"):  # nothing to take a norm's scale with
        gate_up.silu(x, None, KERNELS, scale=torch.ones(5))


def test_the_parameter_names_are_the_loaders():
    names = dict(Linear(4, 3, bias=True).named_parameters())
    assert set(names) == {"weight", "bias"} and names["weight"].shape == (3, 4)
    assert set(dict(RowParallelLinear(4, 3, bias=False, tp=TPGroup.single()).named_parameters())) == {"weight"}


class _ColumnMajor:
    """A weight format of its own: W stored transposed ([in, out]) with a per-output scale."""

    name = "column-major"

    def create_weights(self, linear, in_features, out_features):
        linear.weight_t = nn.Parameter(torch.empty(in_features, out_features))
        linear.scale = nn.Parameter(torch.empty(out_features))

    def apply(self, linear, x, bias, kernels):
        y = (x @ linear.weight_t) * linear.scale
        return y if bias is None else y + bias


def test_a_method_owns_the_weight_format():
    lin = _filled(Linear(6, 4, bias=True, method=_ColumnMajor()).double(), 4)
    assert set(dict(lin.named_parameters())) == {"weight_t", "scale", "bias"}
    x = torch.randn(3, 6, dtype=torch.float64)
    y, _ = lin(x, None, KERNELS)
    assert torch.allclose(y, x @ lin.weight_t * lin.scale + lin.bias, rtol=1e-12, atol=1e-12)


def test_lora_linear_refuses_an_unknown_module():
    with pytest.raises(ValueError, match="module.*'qkv'.*got 'q'"):
        LoraLinear(Linear(4, 4, bias=False), 0, "q")


def test_enable_lora_wraps_every_projection_and_keeps_the_base_weights(checkpoint_dir):
    """After enable_lora each decoder projection is a LoraLinear around the very parameters the
    loader filled; steps without adapters still give transformers' logits."""
    path = checkpoint_dir("qwen2")  # qkv bias, tied embeddings
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32)
    mw = gen.model_wrapper
    before = {k: (lin.weight, lin.bias) for k, lin in mw.lora_linears().items()}
    assert set(before) == {(i, m) for i in range(gen.config.num_layers) for m in ("qkv", "o", "gate_up", "down")}
    gen.enable_lora(max_loras=2, max_rank=4)
    wrapped = mw.model.projections()
    assert all(isinstance(getattr(parent, attr), LoraLinear) for parent, attr in wrapped.values())
    after = mw.lora_linears()
    assert all(after[k].weight is w and after[k].bias is b for k, (w, b) in before.items())
    seq = torch.randint(0, 96, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    h = PagedHarness(gen, num_blocks=8, block_size=4)
    out = torch.cat([h.step({0: seq[:7]}, is_prefill=True), h.step({0: seq[7:]}, is_prefill=False, q_lens=[2])])
    with torch.no_grad():
        want = hf_model(path)(torch.tensor([seq])).logits[0].float()
    assert rel_err(out, want) < 1e-4
