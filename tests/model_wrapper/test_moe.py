"""Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral with its window)
against transformers' own classes on tiny random checkpoints.

The same scenario as the dense families' parity test (batched uneven prompts on shuffled blocks, a
chunked prefill, a mixed step, decode with lm_head_indices, multi-token decode; draft trees under spec_mask
in test_speculative.py), routing ties, a dense layer between sparse ones, bf16 against transformers' own bf16
error, loader refusals of missing or misshapen experts, and LoRA on the attention of an MoE model
against peft (adapters on the experts are refused).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import MOE_FAMILIES, dequantize_fp8_blockwise, hf_model, make_checkpoint, quantize_fp8_blockwise, rel_err
from model_wrapper import KernelConfig
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from test_forward_parity import _max_err, _reference, _script, run_scenario
from text_generator import TextGenerator

pytestmark = pytest.mark.usefixtures("one_thread")


def _load(path, dtype=torch.float32):
    return TextGenerator.from_pretrained(path, device="cpu", dtype=dtype)


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_fp32_parity(checkpoint_dir, family, block_size):
    path = checkpoint_dir(family)
    gen = _load(path)
    sparse = gen.config.moe.sparse_layers
    assert sum(sparse) >= 2 and (family == "mixtral" or not sparse[1])  # a dense layer between sparse ones
    full, steps = _script(seed=hash(family) % 1000)
    outputs = run_scenario(gen, full, steps, block_size)
    assert _max_err(outputs, _reference(path, torch.float32, full)) < 1e-4


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_bf16_no_worse_than_transformers_bf16(checkpoint_dir, family):
    """Per position, our bf16 error against transformers' fp32 is transformers' own bf16 error's
    peer: bounded in mean and median by twice it. Not in max: where two experts' router scores
    nearly tie, any two bf16 computations may route a token differently (transformers' bf16 and
    fp32 do too), a discrete jump at that position."""
    path = checkpoint_dir(family)
    full, steps = _script(seed=7)
    ref32 = _reference(path, torch.float32, full)
    ref16 = _reference(path, torch.bfloat16, full)
    outputs = run_scenario(_load(path, torch.bfloat16), full, steps, block_size=16)
    ours = torch.tensor([rel_err(o, ref32[r][p]) for r, p, o in outputs])
    oracle = torch.tensor([rel_err(ref16[r][p], ref32[r][p]) for r, p, _ in outputs])
    assert ours.mean() <= 2 * oracle.mean() + 1e-3, (ours.mean(), oracle.mean())
    assert ours.median() <= 2 * oracle.median() + 1e-3, (ours.median(), oracle.median())


def test_routing_ties_pick_what_transformers_picks(tmp_path):
    """A zero router: every expert ties for every token; the top-k is torch.topk's choice in both."""
    path = make_checkpoint(tmp_path / "tie", "qwen3_moe")
    sd = load_file(os.path.join(path, "model.safetensors"))
    for name in sd:
        if name.endswith("mlp.gate.weight"):
            sd[name] = torch.zeros_like(sd[name])
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    full, steps = _script(seed=2)
    outputs = run_scenario(_load(path), full, steps, 4)
    assert _max_err(outputs, _reference(path, torch.float32, full)) < 1e-4


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_fp8_experts_match_transformers_on_their_dequantized_weights(tmp_path, family):
    """Experts held in e4m3 with per-row, 128-column scales (Experts.gate_up_proj_scale / down_proj_scale, which
    kernels.moe_experts dequantizes) against transformers on a checkpoint holding the dequantized values."""
    from model_wrapper.layers.moe import SparseMoE

    path = make_checkpoint(tmp_path / family, family)
    sd = load_file(os.path.join(path, "model.safetensors"))
    for name in sd:
        if ".experts." in name:
            sd[name] = dequantize_fp8_blockwise(*quantize_fp8_blockwise(sd[name]), torch.float32)
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    gen = _load(path)
    for m in gen.model_wrapper.model.modules():
        if isinstance(m, SparseMoE):  # the loaded (dequantized) experts back to e4m3 + scales
            ex = m.experts
            (gq, gs), (dq, ds) = quantize_fp8_blockwise(ex.gate_up_proj.data), quantize_fp8_blockwise(ex.down_proj.data)
            ex.gate_up_proj, ex.down_proj = torch.nn.Parameter(gq, False), torch.nn.Parameter(dq, False)
            ex.gate_up_proj_scale, ex.down_proj_scale = gs, ds
    full, steps = _script(seed=5)
    outputs = run_scenario(gen, full, steps, 4)
    assert _max_err(outputs, _reference(path, torch.float32, full)) < 1e-4


def _copy_without(src, dst, drop=None, reshape=None):
    shutil.copytree(src, dst)
    sd = load_file(os.path.join(dst, "model.safetensors"))
    if drop:
        del sd[drop]
    if reshape:
        sd[reshape] = sd[reshape][:-1]
    save_file(sd, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


@pytest.mark.parametrize("family,tensor", [("qwen3_moe", "model.layers.0.mlp.experts.5.up_proj.weight"),
                                           ("mixtral", "model.layers.1.block_sparse_moe.experts.7.w2.weight"),
                                           ("qwen2_moe", "model.layers.2.mlp.shared_expert.down_proj.weight")])
def test_missing_or_misshapen_experts_are_refused(checkpoint_dir, tmp_path, family, tensor):
    path = checkpoint_dir(family)
    for i, kw in enumerate([dict(drop=tensor), dict(reshape=tensor)]):
        bad = _copy_without(path, tmp_path / f"bad{i}", **kw)
        with pytest.raises(ModelLoadError) as e:
            _load(bad)
        want = ModelErrorCode.MISSING_TENSOR if "drop" in kw else ModelErrorCode.MISSHAPEN_TENSOR
        assert e.value.code is want and tensor in str(e.value)


def test_bad_moe_config_is_refused(checkpoint_dir, tmp_path):
    path = checkpoint_dir("qwen3_moe")
    for i, change in enumerate([dict(num_experts_per_tok=9), dict(mlp_only_layers=[7]), dict(num_local_experts=10**7),
                                dict(moe_intermediate_size=64)]):
        bad = tmp_path / f"cfg{i}"
        shutil.copytree(path, bad)
        with open(bad / "config.json") as f:
            cfg = json.load(f)
        cfg.update(change)
        with open(bad / "config.json", "w") as f:
            json.dump(cfg, f)
        with pytest.raises(ModelLoadError) as e:
            _load(str(bad))
        assert e.value.code in (ModelErrorCode.BAD_CONFIG, ModelErrorCode.MISSING_TENSOR,
                                ModelErrorCode.MISSHAPEN_TENSOR), change


def test_lora_on_an_moe_model_attention_matches_peft(checkpoint_dir, tmp_path):
    """Adapters on the attention projections of an MoE model: a mixed batch against peft."""
    from test_lora import make_adapter

    from conftest import PagedHarness

    base = checkpoint_dir("qwen3_moe")
    peft_model = make_adapter(base, tmp_path / "ad", seed=1, r=4, lora_alpha=8,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    gen = _load(base)
    gen.enable_lora(max_loras=2, max_rank=8)
    gen.load_adapter("ad", str(tmp_path / "ad"))
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (9, 6, 12)]
    ids = ["ad", None, "ad"]
    h = PagedHarness(gen, num_blocks=32, block_size=4)
    out = h.step({i: s[:-2] for i, s in enumerate(seqs)}, is_prefill=True, adapter_ids=ids,
                 lm_head_indices=None)
    dec = h.step({i: s[-2:] for i, s in enumerate(seqs)}, is_prefill=False, adapter_ids=ids)
    base_model = hf_model(base)
    row = 0
    with torch.no_grad():
        for i, (s, a) in enumerate(zip(seqs, ids)):
            ref = (peft_model if a else base_model)(torch.tensor([s])).logits[0]
            n = len(s) - 2
            assert rel_err(out[row:row + n], ref[:n]) < 1e-4, (i, a)
            row += n
        row = 0
        for i, (s, a) in enumerate(zip(seqs, ids)):
            ref = (peft_model if a else base_model)(torch.tensor([s])).logits[0]
            assert rel_err(dec[row:row + 2], ref[-2:]) < 1e-4, (i, a)
            row += 2


def test_lora_on_experts_is_refused(checkpoint_dir, tmp_path):
    """peft adapts a stacked-expert model's MLP through target_parameters; a file naming expert
    modules is refused the same way: coded, nothing loaded."""
    from adapters import LoraError, LoraErrorCode
    from test_lora import make_adapter

    base = checkpoint_dir("qwen3_moe")
    make_adapter(base, tmp_path / "mlp", seed=1, r=4, lora_alpha=8, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"])
    gen = _load(base)
    gen.enable_lora(max_loras=2, max_rank=8)
    with pytest.raises(LoraError) as e:
        gen.load_adapter("mlp", str(tmp_path / "mlp"))
    assert e.value.code is LoraErrorCode.UNSUPPORTED_CONFIG and "target_parameters" in str(e.value)
    assert "mlp" not in gen.loaded_adapters()
    make_adapter(base, tmp_path / "ad", seed=1, r=4, lora_alpha=8, target_modules=["q_proj"])
    path = tmp_path / "ad" / "adapter_model.safetensors"
    sd = load_file(str(path))
    a = next(k for k in sd if "lora_A" in k)
    sd[a.replace("self_attn.q_proj", "mlp.experts.3.gate_proj")] = torch.randn(4, 64)
    sd[a.replace("self_attn.q_proj", "mlp.experts.3.gate_proj").replace("lora_A", "lora_B")] = torch.randn(32, 4)
    save_file(sd, str(path))
    with pytest.raises(LoraError) as e:
        gen.load_adapter("ad", str(tmp_path / "ad"))
    assert e.value.code is LoraErrorCode.UNSUPPORTED_MODULE and "experts" in str(e.value)
    assert "ad" not in gen.loaded_adapters()


# -- CUDA: the fused MoE kernels inside the model, eager and in decode graphs -------------------

def _cuda_ckpt(checkpoint_dir, family):
    """head_dim 64 and no window (FlashInfer's prebuilt kernels; another variant would compile), a
    width the fused kernels tile in several blocks, and 16 experts of which top-k pick a few."""
    extra = dict(hidden_size=256, head_dim=64, num_attention_heads=4, num_key_value_heads=2)
    if family == "mixtral":
        extra.update(sliding_window=None, num_local_experts=16, intermediate_size=96)
    else:
        extra.update(num_experts=16, moe_intermediate_size=96)
    return checkpoint_dir(family, **extra)


@pytest.mark.cuda
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_cuda_bf16_no_worse_than_transformers_bf16(checkpoint_dir, family):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = _cuda_ckpt(checkpoint_dir, family)
    full, steps = _script(seed=7)
    ref32 = _reference(path, torch.float32, full)
    ref16 = _reference(path, torch.bfloat16, full)
    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    outputs = [(r, p, o.cpu()) for r, p, o in run_scenario(gen, full, steps, block_size=16)]
    ours = torch.tensor([rel_err(o, ref32[r][p]) for r, p, o in outputs])
    oracle = torch.tensor([rel_err(ref16[r][p], ref32[r][p]) for r, p, _ in outputs])
    assert ours.mean() <= 2 * oracle.mean() + 1e-3, (ours.mean(), oracle.mean())
    assert ours.median() <= 2 * oracle.median() + 1e-3, (ours.median(), oracle.median())


@pytest.mark.cuda
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_cuda_graph_replay_equals_eager(checkpoint_dir, family):
    """Routing is data-dependent; the captured graph is not: the same decode steps replayed and run
    eagerly agree. The graphs' decode attention is FlashInfer's, as eager steps': the Triton one
    rounds differently, and a near-tie of two experts' router scores may then route a token apart
    (the prefill runs eagerly for the same reason: mixed graphs run the Triton prefill kernel)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from test_cuda_model import _decode_run

    path = _cuda_ckpt(checkpoint_dir, family)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in (5, 17, 9, 30, 3)]
    tokens = torch.randint(0, 96, (6, len(prompts)), generator=g).tolist()
    eager = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    graph = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                          kernel_config=KernelConfig(triton_decode=False, mixed_graphs=False))
    a, _ = _decode_run(eager, prompts, tokens)
    b, _ = _decode_run(graph, prompts, tokens)
    assert graph.model_wrapper.graphs._graphs, "no graph was captured"
    for x, y in zip(a, b):
        assert rel_err(y, x) < 2e-2
