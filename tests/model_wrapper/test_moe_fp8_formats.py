"""compressed-tensors FP8 experts (per-channel and per-tensor weight scales) kept e4m3 (issues 25 / 26).

llm-compressor's FP8 MoE checkpoints (Qwen3-30B-A3B-FP8-dynamic, Mixtral-8x7B-Instruct-v0.1-FP8, ...) quantize
each expert's gate / up / down projection with a scale per output channel ([N, 1]) or per tensor ([1]). The
loader (fp8_weights.keep_fp8_storage, loader._fill_fp8) keeps those experts e4m3 with the layout of block
scales, a float32 scale per row and 128-column group [E, N, ceil(K / 128)] (every group of a row equal), so
the MoE kernels read them unchanged. Checked against independent oracles:
- storage: e4m3 experts with those scale shapes, and e4m3 * stored scale equal to W computed here straight
  from the checkpoint's tensors (gate's scale on gate's rows, up's on up's);
- logits (keep_fp8=True: the CUDA storage on the CPU, through the torch fallback) of Qwen3-MoE, Qwen2-MoE
  and Mixtral against transformers' own model on the dequantized weights, fp32 rel. err < 1e-4;
- TP=2 on gloo (the experts' columns cut at any point: the scale is per row) against transformers;
- on CUDA (`pytest -m cuda`): the model within the FP8 bounds of the dequantized one, eager and in CUDA
  graphs; the fused expert kernels (decode GEMVs, sorted grouped GEMMs) on the expanded scales against the
  reference experts on the dequantized weights.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from conftest import MOE_FAMILIES
from fp8_checkpoints import E4M3, write_fp8
from model_wrapper.config import ModelConfig
from model_wrapper.layers.moe import SparseMoE, dequantize_experts, experts_reference
from model_wrapper.loader import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
FORMATS = ["channel_dynamic", "tensor_static"]
# checkpoint names of expert i's (gate, up, down) projections per family
EXPERT_NAMES = {"qwen3_moe": ("gate_proj", "up_proj", "down_proj"), "qwen2_moe": ("gate_proj", "up_proj", "down_proj"),
                "mixtral": ("w1", "w3", "w2")}


def _sparse_layers(model):
    return [(i, layer.mlp) for i, layer in enumerate(model.model.layers) if isinstance(layer.mlp, SparseMoE)]


def _expert_prefix(family: str, layer: int, e: int) -> str:
    mlp = "block_sparse_moe" if family == "mixtral" else "mlp"
    return f"model.layers.{layer}.{mlp}.experts.{e}"


def _direct_weights(ckpt: dict, family: str, layer: int, num_experts: int):
    """W = e4m3 * weight_scale of every expert, straight from the checkpoint's tensors -> (gate_up, down) fp32."""
    def w(name):
        scale = ckpt[f"{name}.weight_scale"].float().reshape(-1, 1)  # [N, 1] per channel, [1, 1] per tensor
        return ckpt[f"{name}.weight"].float() * scale

    g, u, d = EXPERT_NAMES[family]
    pre = [_expert_prefix(family, layer, e) for e in range(num_experts)]
    gate_up = torch.stack([torch.cat([w(f"{p}.{g}"), w(f"{p}.{u}")]) for p in pre])
    down = torch.stack([w(f"{p}.{d}") for p in pre])
    return gate_up, down


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_experts_stay_e4m3_and_match_transformers(checkpoint_dir, tmp_path, family, fmt):
    fp8, deq, _ = write_fp8(checkpoint_dir(family), tmp_path, fmt)
    from test_fp8_checkpoint import _parity

    model = load_model(fp8, ModelConfig.from_pretrained(fp8), dtype=torch.float32, device=CPU, keep_fp8=True)
    ckpt = load_file(os.path.join(fp8, "model.safetensors"))
    layers = _sparse_layers(model)
    assert layers
    for i, mlp in layers:
        ex = mlp.experts
        E, two_i, H = ex.gate_up_proj.shape
        inter = ex.down_proj.shape[-1]
        assert ex.gate_up_proj.dtype == ex.down_proj.dtype == E4M3
        assert ex.gate_up_proj_scale.shape == (E, two_i, math.ceil(H / 128))
        assert ex.down_proj_scale.shape == (E, H, math.ceil(inter / 128))
        assert ex.gate_up_proj_scale.dtype == ex.down_proj_scale.dtype == torch.float32
        gate_up, down = _direct_weights(ckpt, family, i, E)
        assert torch.equal(dequantize_experts(ex.gate_up_proj, ex.gate_up_proj_scale, torch.float32), gate_up)
        assert torch.equal(dequantize_experts(ex.down_proj, ex.down_proj_scale, torch.float32), down)
    assert _parity(fp8, deq, seed=hash((family, fmt)) % 1000, keep_fp8=True) < 1e-4


@pytest.mark.parametrize("fmt", FORMATS)
def test_several_k_groups_repeat_the_row_scale(checkpoint_dir, tmp_path, fmt):
    """H 256 and I 160: gate_up 2 K-groups a row, down 2 (the last one partial); every group holds the row's
    checkpoint scale (per tensor: gate's scalar on gate's rows, up's on up's), and the logits still match."""
    src = checkpoint_dir("qwen3_moe", hidden_size=256, moe_intermediate_size=160, num_attention_heads=8)
    fp8, deq, _ = write_fp8(src, tmp_path, fmt)
    from test_fp8_checkpoint import _parity

    model = load_model(fp8, ModelConfig.from_pretrained(fp8), dtype=torch.float32, device=CPU, keep_fp8=True)
    ckpt = load_file(os.path.join(fp8, "model.safetensors"))
    i, mlp = _sparse_layers(model)[0]
    ex = mlp.experts
    assert ex.gate_up_proj_scale.shape == (8, 320, 2) and ex.down_proj_scale.shape == (8, 256, 2)
    for e in range(8):
        p = _expert_prefix("qwen3_moe", i, e)
        want_gu = torch.cat([ckpt[f"{p}.gate_proj.weight_scale"].float().reshape(-1, 1).expand(160, 2),
                             ckpt[f"{p}.up_proj.weight_scale"].float().reshape(-1, 1).expand(160, 2)])
        assert torch.equal(ex.gate_up_proj_scale[e], want_gu)
        want_dn = ckpt[f"{p}.down_proj.weight_scale"].float().reshape(-1, 1).expand(256, 2)
        assert torch.equal(ex.down_proj_scale[e], want_dn)
    # the storage's bytes: one a weight and 4 per row and 128 columns (ceil: the partial group too), about half
    # of bf16's 2 a weight
    nbytes = sum(t.numel() * t.element_size() for t in (ex.gate_up_proj, ex.down_proj, ex.gate_up_proj_scale,
                                                          ex.down_proj_scale))
    assert nbytes == 8 * (320 * 256 + 256 * 160) + 4 * 8 * (320 * 2 + 256 * 2)
    if fmt == "tensor_static":  # two different scalars: a mix-up of gate's and up's rows would show
        assert not torch.equal(ex.gate_up_proj_scale[0, 0], ex.gate_up_proj_scale[0, 160])
    assert _parity(fp8, deq, seed=21, keep_fp8=True) < 1e-4


@pytest.mark.parametrize("family,fmt,experts,seed", [
    # every expert in `ignore`: float in the checkpoint, kept in the model dtype, no scales
    ("qwen3_moe", "channel_dynamic", "re:.*mlp\\.experts\\..*", 4),
    # one expert of each layer left float: the stacked experts cannot be one e4m3 tensor, so all of them are
    # dequantized into the model dtype (exact)
    ("mixtral", "tensor_static", "re:.*experts\\.3\\..*", 6)])
def test_ignored_experts_stay_in_the_model_dtype(checkpoint_dir, tmp_path, family, fmt, experts, seed):
    fp8, deq, _ = write_fp8(checkpoint_dir(family), tmp_path, fmt, ignore=("lm_head", experts))
    from test_fp8_checkpoint import _parity

    model = load_model(fp8, ModelConfig.from_pretrained(fp8), dtype=torch.float32, device=CPU, keep_fp8=True)
    for _, mlp in _sparse_layers(model):
        ex = mlp.experts
        assert ex.gate_up_proj.dtype == ex.down_proj.dtype == torch.float32
        assert ex.gate_up_proj_scale is None and ex.down_proj_scale is None
    assert _parity(fp8, deq, seed=seed, keep_fp8=True) < 1e-4


# -- tensor parallelism: two gloo ranks ------------------------------------------------------------

def collect_experts(gen) -> dict:
    """The first sparse layer's stored experts of this rank (a module-level function: spawn pickles it)."""
    ex = _sparse_layers(gen.model_wrapper.model)[0][1].experts
    return dict(dtype=ex.gate_up_proj.dtype, scales=(tuple(ex.gate_up_proj_scale.shape),
                                                     tuple(ex.down_proj_scale.shape)))


@pytest.fixture(scope="module")
def tp2_ct(checkpoint_dir, tmp_path_factory):
    from test_fp8_checkpoint import WORLD, _tp_worker

    root = tmp_path_factory.mktemp("ct_moe_tp2")
    jobs = {}
    for j, (family, fmt) in enumerate([("qwen3_moe", "channel_dynamic"), ("qwen2_moe", "tensor_static"),
                                       ("mixtral", "tensor_static")]):
        fp8, deq, _ = write_fp8(checkpoint_dir(family), root / family, fmt)
        jobs[family] = dict(path=fp8, deq=deq, keep=True, seed=30 + j)
    mp.spawn(_tp_worker, args=(str(root / "store"), jobs, str(root), WORLD, collect_experts), nprocs=WORLD,
             join=True)
    return {n: (j, [torch.load(root / f"{n}.rank{r}.pt", weights_only=False) for r in range(WORLD)])
            for n, j in jobs.items()}


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_tp2_e4m3_experts_match_transformers(tp2_ct, family):
    from test_fp8_checkpoint import check_tp2

    spec, results = tp2_ct[family]
    check_tp2(spec, results)
    assert all(res["dtype"] == E4M3 for res in results)


# -- CUDA (`pytest -m cuda`) -------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("family", MOE_FAMILIES)
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_ct_experts_within_fp8_bounds(checkpoint_dir, tmp_path, family, fmt, graphs):
    """The experts alone quantized (attention, routers and Qwen2-MoE's shared expert left float: their FP8 is
    test_fp8_checkpoint's subject, and an FP8 router flips a near-flat random model's routing), on test_moe's
    CUDA shapes (head_dim 64: FlashInfer's prebuilt kernels). An H200 measured these formats' experts at rel. err
    0.10-0.14 (Qwen3-MoE / Qwen2-MoE / Mixtral, channel and tensor), block-FP8 experts 0.03-0.19, bf16 0.105-0.14."""
    from test_fp8_checkpoint import _cuda_vs_reference, _within_fp8_bounds
    from test_moe import _cuda_ckpt

    ignore = ("lm_head", "mlp.gate", "block_sparse_moe.gate", "shared_expert_gate", "re:.*self_attn.*",
              "re:.*shared_expert\\..*")
    fp8, deq, _ = write_fp8(_cuda_ckpt(checkpoint_dir, family), tmp_path, fmt, ignore=ignore)
    gen, err, top1 = _cuda_vs_reference(fp8, deq, seed=8, cuda_graphs=graphs)
    for _, mlp in _sparse_layers(gen.model_wrapper.model):
        assert mlp.experts.gate_up_proj.dtype == E4M3 and mlp.experts.down_proj_scale.dtype == torch.float32
    _, err16, top1_16 = _cuda_vs_reference(deq, deq, seed=8, cuda_graphs=graphs)
    _within_fp8_bounds(err, top1, err16, top1_16)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_expert_kernels_on_expanded_scales(tmp_path, fmt):
    """The fused FP8 MoE kernels (default, decode GEMVs, sorted grouped GEMMs weight-only and W8A8) on e4m3
    experts with expanded channel / tensor scales (H 256, I 384: several K-groups) against the reference experts
    on the dequantized weights, within twice the bf16 reference's own error against float64 (W8A8 steps: the
    float64 products of the same quantized activations; test_moe_fp8_shards.check_expert_case)."""
    from conftest import make_checkpoint
    from test_moe_fp8_shards import check_expert_case, cuda_moe_cases

    H, E, inter = 256, 16, 384
    src = make_checkpoint(tmp_path / "src", "qwen3_moe", moe_intermediate_size=inter, hidden_size=H,
                          num_experts=E, num_experts_per_tok=4, num_attention_heads=8)
    fp8, deq = write_fp8(src, tmp_path, fmt, ignore=("lm_head", "mlp.gate"))[:2]
    fe = _sparse_layers(load_model(deq, ModelConfig.from_pretrained(deq), dtype=torch.float32,
                                   device=CPU))[0][1].experts
    layer = _sparse_layers(load_model(fp8, ModelConfig.from_pretrained(fp8), dtype=torch.bfloat16,
                                      device=torch.device("cuda")))[0][1]
    assert layer.experts.gate_up_proj.dtype == E4M3 and layer.experts.gate_up_proj_scale.shape == (E, 2 * inter, 2)
    for name, kernels, T, x in cuda_moe_cases(H):
        w, ids = kernels.moe_router(x.cuda(), layer.gate.weight, layer.spec)
        w, ids = w.cpu(), ids.cpu()
        got = layer(x.cuda(), None, kernels)[0].cpu().double()
        check_expert_case(name, kernels, got, x, w, ids, layer.experts, fe.gate_up_proj, fe.down_proj)
