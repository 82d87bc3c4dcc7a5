"""Per-tensor "fp8" checkpoints: quant_method "fp8" without weight_block_size (AutoFP8, vLLM's Fp8Config).

The checkpoints are written by tests/model_wrapper/fp8_checkpoints.py's own quantizer from a tiny random
transformers model, as AutoFP8 saves them: every linear not in "ignored_layers" e4m3 with a 0-d float32
weight_scale (W = weight * weight_scale), a 0-d input_scale per linear when activation_scheme is
"static", and with kv_cache_scheme "static" the K / V scales in one of the layouts AutoFP8 wrote
(self_attn.k_scale / v_scale, one self_attn.kv_scale, or k_proj / v_proj.output_scale). Oracles:
- logits: transformers' own model class on the DEQUANTIZED weights (a second folder, no
  quantization_config), fp32 rel. err < 1e-4, for every family of conftest's FAMILIES and MOE_FAMILIES,
  static and dynamic activations (the CPU reference dequantizes at load; keep_fp8=True runs the e4m3
  storage through its torch fallback), and TP=2 on gloo;
- KV scales: the values written, and an FP8 KV cache against test_fp8_kv_cache.fp8_reference (transformers
  with K / V rounded through e4m3 with those scales) on the dequantized weights;
- refusals: the coded error naming the field or tensor; CUDA (`pytest -m cuda`): Mixtral's experts e4m3 within
  test_fp8_checkpoint._within_fp8_bounds, the KV scales on the device (the dense model's CUDA bound test is
  test_fp8_checkpoint's, parametrized over these formats too).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from conftest import FAMILIES, MOE_FAMILIES, rel_err
from fp8_checkpoints import E4M3, quant_config, write_fp8
from model_wrapper import ModelLoadError
from model_wrapper.config import ModelConfig
from model_wrapper.errors import ModelErrorCode
from test_forward_parity import _max_err, _reference, _script
from test_fp8_checkpoint import _edit, _gen, _parity

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEMES = ["autofp8_static", "autofp8_dynamic"]


# -- logits against transformers on the dequantized weights ----------------------------------------

@pytest.mark.parametrize("fmt", SCHEMES)
@pytest.mark.parametrize("family", FAMILIES + MOE_FAMILIES)
def test_families_match_transformers_on_dequantized_weights(checkpoint_dir, tmp_path, family, fmt):
    fp8, deq, _ = write_fp8(checkpoint_dir(family), tmp_path, fmt)
    scale = load_file(os.path.join(fp8, "model.safetensors"))["model.layers.0.self_attn.q_proj.weight_scale"]
    assert scale.shape == () and scale.dtype == torch.float32  # as AutoFP8 saves it
    quant = ModelConfig.from_pretrained(fp8).quant
    assert (quant.method, quant.kind, quant.activation) == ("fp8", "tensor", fmt.split("_")[1])
    assert _parity(fp8, deq, seed=hash((family, fmt)) % 1000) < 1e-4


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_fp8_storage_keeps_each_parts_scale_and_the_max_input_scale(checkpoint_dir, tmp_path, family):
    """keep_fp8=True (the CUDA storage, Fp8Method's torch fallback on the CPU): e4m3 weights whose
    e4m3 * stored scale is the dequantized weight (q's, k's and v's different scalars each on their own
    rows of the fused qkv), input_scale the max over the parts; Mixtral's w1 / w3 / w2 experts stacked e4m3."""
    fp8, deq, extra = write_fp8(checkpoint_dir(family), tmp_path, "autofp8_static")
    gen = _gen(fp8, keep_fp8=True)
    attn = gen.model_wrapper.model.model.layers[1].self_attn
    qkv = attn.qkv_proj
    assert qkv.method.name == "fp8" and qkv.weight.dtype == E4M3 and qkv.method.static
    want = load_file(os.path.join(deq, "model.safetensors"))
    parts = [want[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"]
    assert torch.equal(qkv.method.dequantized(qkv, torch.float32), torch.cat(parts))
    assert float(qkv.input_scale) == max(float(extra[f"model.layers.1.self_attn.{p}_proj.input_scale"]) for p in "qkv")
    if family == "mixtral":
        experts = gen.model_wrapper.model.model.layers[0].mlp.experts
        assert experts.gate_up_proj.dtype == experts.down_proj.dtype == E4M3
    assert _parity(fp8, deq, seed=7, keep_fp8=True) < 1e-4


def test_quantization_fp8_loads_the_checkpoint_as_it_is(checkpoint_dir, tmp_path):
    """quantization="fp8" (vLLM's --quantization fp8) on an AutoFP8 checkpoint: its own scales, nothing
    re-quantized online (the logits are those of its dequantized weights)."""
    fp8, deq, _ = write_fp8(checkpoint_dir("qwen3"), tmp_path, "autofp8_static")
    gen = _gen(fp8, quantization="fp8")
    assert gen.config.quant.kind == "tensor" and not gen.config.quant.online
    full, steps = _script(9)
    from test_forward_parity import run_scenario

    assert _max_err(run_scenario(gen, full, steps, block_size=4), _reference(deq, torch.float32, full)) < 1e-4


# -- the ignore list ------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["ignored_layers", "modules_to_not_convert"])
def test_ignore_list_leaves_those_linears_float(checkpoint_dir, tmp_path, key):
    """AutoFP8's ignored_layers (full module names, Mixtral's routers among them) or transformers'
    modules_to_not_convert: those linears are plain floats, loaded unquantized; the rest e4m3."""
    down1 = "model.layers.1.mlp.down_proj"
    fp8, deq, _ = write_fp8(checkpoint_dir("llama"), tmp_path, "autofp8_dynamic", ignore=("lm_head", down1))
    cfg_path = os.path.join(fp8, "config.json")
    raw = json.load(open(cfg_path))
    raw["quantization_config"][key] = raw["quantization_config"].pop("ignored_layers")
    json.dump(raw, open(cfg_path, "w"))
    tensors = load_file(os.path.join(fp8, "model.safetensors"))
    assert tensors[f"{down1}.weight"].dtype == torch.float32 and f"{down1}.weight_scale" not in tensors
    gen = _gen(fp8, keep_fp8=True)
    layers = gen.model_wrapper.model.model.layers
    assert layers[0].mlp.down_proj.method.name == "fp8" and layers[1].mlp.down_proj.method.name == "unquantized"
    assert gen.model_wrapper.model.lm_head.method.name == "unquantized"
    assert _parity(fp8, deq, seed=3, keep_fp8=True) < 1e-4


def test_mixtral_routers_ignored_as_autofp8_example_does(checkpoint_dir, tmp_path):
    """AutoFP8's Mixtral example: ignore_patterns ["re:.*lm_head", "re:.*gate"] -> ignored_layers lists
    lm_head and every block_sparse_moe.gate by full name."""
    routers = tuple(f"model.layers.{i}.block_sparse_moe.gate" for i in range(2))
    fp8, deq, _ = write_fp8(checkpoint_dir("mixtral"), tmp_path, "autofp8_static", ignore=("lm_head",) + routers)
    tensors = load_file(os.path.join(fp8, "model.safetensors"))
    assert tensors[f"{routers[0]}.weight"].dtype == torch.float32
    assert tensors["model.layers.0.block_sparse_moe.experts.0.w1.weight"].dtype == E4M3
    assert _parity(fp8, deq, seed=12) < 1e-4
    assert _parity(fp8, deq, seed=13, keep_fp8=True) < 1e-4


# -- KV cache scales --------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["k_scale", "kv_scale", "output_scale"])
def test_kv_scales_of_each_autofp8_layout_drive_an_fp8_cache(checkpoint_dir, tmp_path, layout):
    """self_attn.k_scale / v_scale, one self_attn.kv_scale (K and V both), or k_proj / v_proj.output_scale
    become the per-layer K / V scales; an e4m3 cache with them matches transformers with K / V rounded
    through e4m3 with the scales written (fp8_reference) on the dequantized weights."""
    from test_fp8_kv_cache import _full_and_steps, _hf_rows, _scenario, fp8_reference

    fp8, deq, extra = write_fp8(checkpoint_dir("llama"), tmp_path, "autofp8_static", kv=layout)
    assert json.load(open(os.path.join(fp8, "config.json")))["quantization_config"]["kv_cache_scheme"] == "static"
    gen = _gen(fp8)
    ks = [float(extra[f"{i}.k"]) for i in range(2)]
    vs = [float(extra[f"{i}.v"]) for i in range(2)]
    if layout == "kv_scale":
        assert ks == vs
    assert torch.equal(gen.kv_scales, torch.tensor([ks, vs]))
    full, steps = _full_and_steps(4)
    got, where = _scenario(gen, full, steps)
    assert rel_err(got, _hf_rows(fp8_reference(deq, ks, vs), full, where)) < 1e-4


def test_kv_scales_read_without_kv_cache_scheme_and_absent_ones_stay_one(checkpoint_dir, tmp_path):
    """As vLLM, the scales are found by name (a config without kv_cache_scheme); a checkpoint without
    any keeps 1.0 (the block FP8 variant reads them the same way)."""
    fp8, _, extra = write_fp8(checkpoint_dir("qwen2"), tmp_path / "kv", "autofp8_dynamic", kv=True)
    cfg_path = os.path.join(fp8, "config.json")
    raw = json.load(open(cfg_path))
    del raw["quantization_config"]["kv_cache_scheme"]
    json.dump(raw, open(cfg_path, "w"))
    want = torch.tensor([[float(extra[f"{i}.{s}"]) for i in range(2)] for s in "kv"])
    assert torch.equal(_gen(fp8).kv_scales, want)
    block, _, extra = write_fp8(checkpoint_dir("qwen2"), tmp_path / "block", "block", kv=True)
    want = torch.tensor([[float(extra[f"{i}.{s}"]) for i in range(2)] for s in "kv"])
    assert torch.equal(_gen(block).kv_scales, want)
    plain, _, _ = write_fp8(checkpoint_dir("qwen2"), tmp_path / "none", "autofp8_dynamic")
    assert torch.equal(_gen(plain).kv_scales, torch.ones(2, 2))


# -- tensor parallelism: two gloo ranks ------------------------------------------------------------

@pytest.fixture(scope="module")
def tp2_pertensor(checkpoint_dir, tmp_path_factory):
    from test_fp8_checkpoint import WORLD, _tp_worker

    root = tmp_path_factory.mktemp("pertensor_tp2")
    jobs = {}
    for j, (family, fmt, keep) in enumerate([("qwen2", "autofp8_static", True), ("llama", "autofp8_dynamic", None),
                                             ("mixtral", "autofp8_static", True),
                                             ("qwen3_moe", "autofp8_dynamic", None)]):
        fp8, deq, _ = write_fp8(checkpoint_dir(family), root / family, fmt)
        jobs[family] = dict(path=fp8, deq=deq, keep=keep, seed=40 + j)
    mp.spawn(_tp_worker, args=(str(root / "store"), jobs, str(root)), nprocs=WORLD, join=True)
    return {n: (j, [torch.load(root / f"{n}.rank{r}.pt", weights_only=False) for r in range(WORLD)])
            for n, j in jobs.items()}


@pytest.mark.parametrize("job", ["qwen2", "llama", "mixtral", "qwen3_moe"])
def test_tp2_matches_transformers_on_dequantized_weights(tp2_pertensor, job):
    from test_fp8_checkpoint import check_tp2

    spec, results = tp2_pertensor[job]
    check_tp2(spec, results)
    if spec["keep"]:  # a per-tensor scale is per row: any TP cut keeps e4m3
        assert all(set(res["methods"].values()) == {"fp8"} for res in results)


# -- refusals --------------------------------------------------------------------------------------

def _pt(**changes) -> dict:
    return {**quant_config("autofp8_static"), **changes}


BAD_CONFIGS = [
    (_pt(weight_block_size=[64, 64]), "weight_block_size"),
    (_pt(weight_block_size=[128]), "weight_block_size"),
    (_pt(activation_scheme="per_token"), "activation_scheme"),
    (_pt(activation_scheme=None), "activation_scheme"),
    ({k: v for k, v in _pt().items() if k != "activation_scheme"}, "activation_scheme"),
    (_pt(kv_cache_scheme="dynamic"), "kv_cache_scheme"),
    (_pt(kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "tensor"}), "kv_cache_scheme"),
    (_pt(fmt="e5m2"), "fmt"),
    (_pt(ignored_layers="lm_head"), "ignored_layers"),
    (_pt(ignored_layers=[], modules_to_not_convert=["re:("]), "modules_to_not_convert"),
]


@pytest.mark.parametrize("qcfg,field", BAD_CONFIGS, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD_CONFIGS)])
def test_unsupported_configs_are_refused_naming_the_field(qcfg, field):
    from test_fp8_checkpoint import refusal

    assert f"quantization_config.{field}" in refusal(qcfg)


Q = "model.layers.0.self_attn.q_proj"
ATTN1 = "model.layers.1.self_attn"


def _drop(*names):
    return lambda t: {k: v for k, v in t.items() if k not in names}


def _put(name, value):
    return lambda t: {**t, name: value}


def _rename(old, new):
    return lambda t: {(new if k == old else k): v for k, v in t.items()}


BAD_TENSORS = [  # (format, kv layout, edit, code, text the message must hold)
    ("autofp8_static", False, _drop(f"{Q}.weight_scale"), ModelErrorCode.MISSING_TENSOR, f"{Q}.weight_scale"),
    ("autofp8_dynamic", False, _rename(f"{Q}.weight_scale", f"{Q}.weight_scale_inv"), ModelErrorCode.MISSING_TENSOR,
     f"{Q}.weight_scale"),  # the block variant's name is not this one's
    ("autofp8_static", False, _put(f"{Q}.weight_scale", torch.ones(64, 1)), ModelErrorCode.MISSHAPEN_TENSOR,
     f"{Q}.weight_scale"),
    ("autofp8_static", False, _put(f"{Q}.weight_scale", torch.tensor(float("nan"))), ModelErrorCode.NONFINITE_WEIGHT,
     f"{Q}.weight_scale"),
    ("autofp8_static", False, _drop(f"{Q}.input_scale"), ModelErrorCode.MISSING_TENSOR, f"{Q}.input_scale"),
    ("autofp8_static", False, _rename(f"{Q}.input_scale", f"{Q}.act_scale"), ModelErrorCode.MISSING_TENSOR,
     f"{Q}.input_scale"),  # AutoFP8's name before 2024-06
    ("autofp8_dynamic", False, _put(f"{Q}.input_scale", torch.ones(())), ModelErrorCode.UNEXPECTED_TENSOR,
     f"{Q}.input_scale"),  # dynamic activations: no input_scale
    ("autofp8_static", False, _put("lm_head.weight_scale", torch.ones(())), ModelErrorCode.UNEXPECTED_TENSOR,
     "lm_head.weight_scale"),  # lm_head is in ignored_layers
    ("autofp8_static", "k_scale", _drop(f"{ATTN1}.v_scale"), ModelErrorCode.MISSING_TENSOR, f"{ATTN1}.v_scale"),
    ("autofp8_static", "kv_scale", _drop(f"{ATTN1}.kv_scale"), ModelErrorCode.MISSING_TENSOR, f"{ATTN1}.kv_scale"),
    ("autofp8_static", "k_scale", _put(f"{ATTN1}.k_scale", torch.ones(2)), ModelErrorCode.MISSHAPEN_TENSOR,
     f"{ATTN1}.k_scale"),
    ("autofp8_static", "k_scale", _put(f"{ATTN1}.k_scale", torch.tensor(0.0)), ModelErrorCode.NONFINITE_WEIGHT,
     "k_scale"),  # a zero scale: the positive-scale check
    ("autofp8_static", "k_scale", _drop(*(f"model.layers.{i}.self_attn.{s}_scale" for i in range(2) for s in "kv")),
     ModelErrorCode.MISSING_TENSOR, "model.layers.0.self_attn.k_scale"),  # kv_cache_scheme "static" needs them
    ("autofp8_static", "k_scale", _put(f"{ATTN1}.kv_scale", torch.ones(())), ModelErrorCode.UNEXPECTED_TENSOR,
     f"{ATTN1}.kv_scale"),  # two layouts at once
    ("autofp8_static", "output_scale", _put(f"{ATTN1}.q_proj.output_scale", torch.ones(())),
     ModelErrorCode.UNEXPECTED_TENSOR, f"{ATTN1}.q_proj.output_scale"),  # vLLM's q_scale: not served
]


@pytest.mark.parametrize("fmt,kv,edit,code,text", BAD_TENSORS,
                         ids=[f"{i}-{c.name}" for i, (_, _, _, c, _) in enumerate(BAD_TENSORS)])
def test_bad_tensors_are_refused_naming_the_tensor(checkpoint_dir, tmp_path, fmt, kv, edit, code, text):
    fp8, _, _ = write_fp8(checkpoint_dir("llama"), tmp_path / "src", fmt, kv=kv)
    path = _edit(fp8, tmp_path / "bad", edit)
    with pytest.raises(ModelLoadError) as info:
        _gen(path)
    assert info.value.code == code, str(info.value)
    assert text in str(info.value)


# -- CUDA (`pytest -m cuda`): e4m3 kept, FP8 kernels -------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("fmt", SCHEMES)
def test_cuda_mixtral_experts_stay_e4m3(checkpoint_dir, tmp_path, fmt):
    """Mixtral-8x7B-Instruct-v0.1-FP8's shape of checkpoint: per-expert w1 / w2 / w3 e4m3 with per-tensor scales
    (routers and attention left float, as test_moe_fp8_formats' CUDA test does), on test_moe's CUDA shapes."""
    from test_fp8_checkpoint import _cuda_vs_reference, _within_fp8_bounds
    from test_moe import _cuda_ckpt

    ignore = ("lm_head", "block_sparse_moe.gate", "re:.*self_attn.*")
    fp8, deq, _ = write_fp8(_cuda_ckpt(checkpoint_dir, "mixtral"), tmp_path, fmt, ignore=ignore)
    gen, err, top1 = _cuda_vs_reference(fp8, deq, seed=8)
    for layer in gen.model_wrapper.model.model.layers:
        ex = layer.mlp.experts
        assert ex.gate_up_proj.dtype == ex.down_proj.dtype == E4M3 and ex.down_proj_scale.dtype == torch.float32
    _, err16, top1_16 = _cuda_vs_reference(deq, deq, seed=8)
    _within_fp8_bounds(err, top1, err16, top1_16)


@pytest.mark.cuda
@needs_cuda
def test_cuda_fp8_kv_cache_with_checkpoint_scales(checkpoint_dir, tmp_path):
    """The checkpoint's one kv_scale per layer reaches the CUDA KV store as its K and V scales (head_dim 64:
    FlashInfer's prebuilt kernels)."""
    src = checkpoint_dir("llama", hidden_size=256, head_dim=64, num_attention_heads=4, num_key_value_heads=2)
    fp8, _, extra = write_fp8(src, tmp_path, "autofp8_static", kv="kv_scale")
    from text_generator import TextGenerator

    gen = TextGenerator.from_pretrained(fp8, device="cuda", dtype=torch.bfloat16)
    want = torch.tensor([[float(extra[f"{i}.{s}"]) for i in range(2)] for s in "kv"])
    assert torch.equal(gen.kv_scales.cpu(), want)
