"""FP8 weight checkpoints (model_wrapper/quantization.py, fp8_weights.py, layers/fp8_linear.py) on the CPU.

The checkpoints are written here from a tiny random transformers model: every linear weight
quantized to e4m3 by this file's own quantizer (per 128 x 128 block with weight_scale_inv, per
output channel or per tensor with weight_scale), saved with safetensors and the matching
quantization_config. The oracle is transformers' own model class loaded from a second folder
holding the DEQUANTIZED weights (fp8 * scale, in fp32) without a quantization_config. The CPU path
dequantizes once at load, so fp32 logits must agree to rel. err < 1e-4 over prefill, chunked,
mixed and multi-token decode steps on shuffled blocks. keep_fp8=True loads the CUDA storage (e4m3
+ per-row-group scales, Fp8Method) on the CPU, whose torch fallback must agree too. TP=2 on gloo
slices the weights with their scales: a block checkpoint's MLP cut at blocks (intermediate 384 -> 128 /
256, every projection e4m3), the slices that still start inside a block dequantized (experts:
test_moe_fp8_shards.py). LoRA adapters on an FP8 base are checked against peft on the
dequantized base. Every refusal asserts its code and that the message names the field or tensor.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from conftest import FAMILIES, hf_model, make_checkpoint, rel_err
from fp8_checkpoints import E4M3, FORMATS, quant_config, write_fp8
from model_wrapper import ModelLoadError
from model_wrapper.config import ModelConfig
from model_wrapper.errors import ModelErrorCode
from model_wrapper.loader import load_model
from model_wrapper.model_wrapper import ModelWrapper, make_backend
from model_wrapper.online_fp8 import with_quantization
from model_wrapper.parallel import TPGroup
from test_forward_parity import _max_err, _reference, _script, run_scenario
from text_generator import TextGenerator

pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(path, keep_fp8=None, tp=None, quantization=None) -> TextGenerator:
    """A CPU fp32 generator; keep_fp8=True: e4m3 storage kept (Fp8Method's fallback); quantization: from_pretrained's."""
    if keep_fp8 is None:
        return TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32, attention_backend="torch",
                                             tp_group=tp, quantization=quantization)
    cfg = ModelConfig.from_pretrained(path)
    if quantization is not None:
        cfg = with_quantization(cfg, quantization)
    cpu = torch.device("cpu")
    model = load_model(path, cfg, dtype=torch.float32, device=cpu, tp=tp, keep_fp8=keep_fp8)
    backend = make_backend("torch", cfg, cpu, torch.float32, model.shard)
    return TextGenerator(ModelWrapper(model, cfg, backend, cpu, torch.float32))


def _parity(fp8_path, deq_path, seed=0, keep_fp8=None) -> float:
    full, steps = _script(seed)
    outputs = run_scenario(_gen(fp8_path, keep_fp8), full, steps, block_size=4, seed=seed)
    return _max_err(outputs, _reference(deq_path, torch.float32, full))


# -- logits against transformers on the dequantized weights ----------------------------------------

@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("family", FAMILIES)
def test_dense_families_match_transformers_on_dequantized_weights(checkpoint_dir, tmp_path, family, fmt):
    fp8, deq, _ = write_fp8(checkpoint_dir(family), tmp_path, fmt)
    gen = _gen(fp8)
    assert gen.config.quant is not None and gen.config.quant.kind == FORMATS[fmt]
    assert all(lin.method.name == "unquantized" for lin in gen.model_wrapper.lora_linears().values())
    assert _parity(fp8, deq, seed=hash((family, fmt)) % 1000) < 1e-4


def test_the_dequantized_oracle_differs_from_the_float_model(checkpoint_dir, tmp_path):
    """The FP8 rounding is visible: the float checkpoint's logits are not the dequantized ones."""
    src = checkpoint_dir("llama")
    fp8, deq, _ = write_fp8(src, tmp_path, "channel_dynamic")
    full, steps = _script(1)
    outputs = run_scenario(_gen(fp8), full, steps, block_size=4)
    assert _max_err(outputs, _reference(deq, torch.float32, full)) < 1e-4
    assert _max_err(outputs, _reference(src, torch.float32, full)) > 1e-3


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory):
    """A Llama of several 128-blocks: hidden 256, heads of 64, intermediate 320 (a partial last block)."""
    return make_checkpoint(tmp_path_factory.mktemp("wide"), "llama", hidden_size=256, intermediate_size=320,
                           num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("keep_fp8", [None, True])
def test_block_fp8_several_blocks_and_a_partial_one(wide_llama, tmp_path, keep_fp8):
    """lm_head quantized too (nothing ignored); keep_fp8=True: e4m3 storage and Fp8Method's fallback."""
    fp8, deq, _ = write_fp8(wide_llama, tmp_path, "block", ignore=())
    gen = _gen(fp8, keep_fp8)
    if keep_fp8:
        layer = gen.model_wrapper.model.model.layers[0]
        down = layer.mlp.down_proj
        assert down.weight.dtype == E4M3 and down.weight_scale.shape == (256, 3)  # K 320 -> 3 groups
        assert gen.model_wrapper.model.lm_head.method.name == "fp8"
        # the stored scales are the checkpoint's, row-expanded: W = e4m3 * scale is the dequantized weight
        want = load_file(os.path.join(deq, "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
        assert torch.equal(down.method.dequantized(down, torch.float32), want)
    assert _parity(fp8, deq, seed=5, keep_fp8=keep_fp8) < 1e-4


def test_static_activations_keep_the_fused_max_input_scale(checkpoint_dir, tmp_path):
    """Static per-tensor activations: the CPU reference leaves activations unquantized (as
    transformers on the dequantized weights); the FP8 storage keeps input_scale, the max over a
    fused projection's parts."""
    fp8, deq, extra = write_fp8(checkpoint_dir("qwen3"), tmp_path, "tensor_static")
    gen = _gen(fp8, keep_fp8=True)
    qkv = gen.model_wrapper.model.model.layers[1].self_attn.qkv_proj
    want = max(float(extra[f"model.layers.1.self_attn.{p}_proj.input_scale"]) for p in "qkv")
    assert qkv.method.static and float(qkv.input_scale) == want
    assert _parity(fp8, deq, seed=2, keep_fp8=True) < 1e-4


def test_qwen3_moe_block_fp8_experts(checkpoint_dir, tmp_path):
    """Stacked experts (and the router, quantized here) dequantized into the model dtype on the CPU."""
    fp8, deq, _ = write_fp8(checkpoint_dir("qwen3_moe"), tmp_path, "block")
    assert _parity(fp8, deq, seed=8) < 1e-4


def test_ignore_list_and_kv_scales(checkpoint_dir, tmp_path):
    """compressed-tensors ignore (a name and a 're:' pattern) loads those linears as plain floats;
    kv_cache_scheme's k_scale / v_scale become ModelWrapper.checkpoint_kv_scales."""
    fp8, deq, extra = write_fp8(checkpoint_dir("mistral"), tmp_path, "channel_dynamic",
                                ignore=("lm_head", r"re:.*layers\.1\.mlp\.down_proj$"), kv=True)
    head = load_file(os.path.join(fp8, "model.safetensors"))
    assert head["model.layers.1.mlp.down_proj.weight"].dtype == torch.float32
    assert head["model.layers.0.mlp.down_proj.weight"].dtype == E4M3
    gen = _gen(fp8, keep_fp8=True)
    layers = gen.model_wrapper.model.model.layers
    assert layers[0].mlp.down_proj.method.name == "fp8" and layers[1].mlp.down_proj.method.name == "unquantized"
    k, v = gen.model_wrapper.checkpoint_kv_scales
    assert k.dtype == v.dtype == torch.float32 and k.shape == v.shape == (2,)
    assert torch.equal(k, torch.stack([extra["0.k"], extra["1.k"]]))
    assert torch.equal(v, torch.stack([extra["0.v"], extra["1.v"]]))
    assert _gen(deq).model_wrapper.checkpoint_kv_scales is None
    assert _parity(fp8, deq, seed=4) < 1e-4


# -- LoRA on an FP8 base -------------------------------------------------------------------------

def test_lora_mixed_batch_matches_peft_on_the_dequantized_base(checkpoint_dir, tmp_path):
    from test_lora import make_adapter

    fp8, deq, _ = write_fp8(checkpoint_dir("qwen3"), tmp_path, "block")
    oracles = {None: hf_model(deq)}
    cfgs = {"all": dict(r=4, lora_alpha=8, target_modules="all-linear"),
            "some": dict(r=2, lora_alpha=4, target_modules=["q_proj", "down_proj"])}
    gen = _gen(fp8, keep_fp8=True)
    gen.enable_lora(max_loras=2, max_rank=4)
    for seed, (name, cfg) in enumerate(cfgs.items()):
        oracles[name] = make_adapter(deq, tmp_path / name, seed + 1, **cfg)
        gen.load_adapter(name, str(tmp_path / name))
    g = torch.Generator().manual_seed(3)
    requests = [("all", 7), (None, 5), ("some", 9), ("all", 4)]
    seqs = [torch.randint(0, 96, (n + 2,), generator=g).tolist() for _, n in requests]
    ids = [a for a, _ in requests]
    from conftest import PagedHarness

    h = PagedHarness(gen, num_blocks=32, block_size=4)
    pre = h.step({i: s[:-2] for i, s in enumerate(seqs)}, is_prefill=True, adapter_ids=ids)
    dec = h.step({i: s[-2:] for i, s in enumerate(seqs)}, is_prefill=False, adapter_ids=ids)
    got, want, row, drow = [], [], 0, 0
    with torch.no_grad():
        for (adapter, n), seq in zip(requests, seqs):
            ref = oracles[adapter](torch.tensor([seq])).logits[0].float()
            got += [pre[row : row + n], dec[drow : drow + 2]]
            want += [ref[:n], ref[n:]]
            row, drow = row + n, drow + 2
    assert rel_err(torch.cat(got), torch.cat(want)) < 1e-4


def test_lora_fold_on_fp8_projections(checkpoint_dir, tmp_path):
    """fold="auto" never folds A rows into e4m3 weights; fold=True is refused and enables nothing."""
    from adapters import LoraError, LoraErrorCode

    fp8, _, _ = write_fp8(checkpoint_dir("llama"), tmp_path, "block")
    gen = _gen(fp8, keep_fp8=True)
    assert gen.model_wrapper.has_fp8_projections()
    with pytest.raises(LoraError) as info:
        gen.enable_lora(max_loras=2, max_rank=4, fold=True)
    assert info.value.code == LoraErrorCode.INVALID_ARGUMENT and "fold" in str(info.value)
    assert gen.lora_manager is None
    assert gen.enable_lora(max_loras=2, max_rank=4).folds is False
    # dequantized at load (the CPU default): plain projections, nothing to refuse
    assert not _gen(fp8).model_wrapper.has_fp8_projections()


# -- tensor parallelism: two gloo ranks ------------------------------------------------------------

WORLD = 2


def _tp_worker(rank, store, jobs, out_dir, world=WORLD, collect=None):
    """One gloo rank: each job's scenario -> {name}.rank{rank}.pt with its logits, the first layer's
    linear methods and what collect(gen) adds (a module-level function: spawned processes pickle it)."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        tp = TPGroup.from_default_group()
        for name, job in jobs.items():
            gen = _gen(job["path"], job["keep"], tp, job.get("quantization"))
            full, steps = _script(job["seed"])
            out = [(r, p, o) for r, p, o in run_scenario(gen, full, steps, block_size=4)]
            methods = {n: lin.method.name for (i, n), lin in gen.model_wrapper.lora_linears().items() if i == 0}
            res = dict(out=out, methods=methods, **(collect(gen) if collect is not None else {}))
            torch.save(res, os.path.join(out_dir, f"{name}.rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    from conftest import end_gloo_worker

    end_gloo_worker()  # only after a worker that raised nothing (the exception skips it)


@pytest.fixture(scope="module")
def tp2_fp8(checkpoint_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8_tp2")
    # intermediate 384: 3 blocks -> 128 / 256 columns (an even 192 each would start rank 1 inside a block)
    wide = make_checkpoint(root / "wide", "llama", hidden_size=256, intermediate_size=384,
                           num_attention_heads=4, num_key_value_heads=2)
    fp8, deq, _ = write_fp8(wide, root / "block", "block", ignore=())
    moe_fp8, moe_deq, _ = write_fp8(checkpoint_dir("qwen3_moe"), root / "moe", "block")
    ch_fp8, ch_deq, _ = write_fp8(checkpoint_dir("qwen2"), root / "channel", "tensor_static")
    # the tiny Llama's intermediate 112 (one block, 2 ranks: split evenly) and heads of 16 (o_proj K 32 a rank)
    tiny_fp8, tiny_deq, _ = write_fp8(checkpoint_dir("llama"), root / "tiny", "block", ignore=())
    jobs = {"block": dict(path=fp8, deq=deq, keep=None, seed=11),
            "block_storage": dict(path=fp8, deq=deq, keep=True, seed=12),
            "block_storage_cut": dict(path=tiny_fp8, deq=tiny_deq, keep=True, seed=15),
            "moe": dict(path=moe_fp8, deq=moe_deq, keep=None, seed=13),
            "tensor_storage": dict(path=ch_fp8, deq=ch_deq, keep=True, seed=14)}
    mp.spawn(_tp_worker, args=(str(root / "store"), jobs, str(root)), nprocs=WORLD, join=True)
    return {n: (j, [torch.load(root / f"{n}.rank{r}.pt", weights_only=False) for r in range(WORLD)])
            for n, j in jobs.items()}


def check_tp2(spec: dict, results: list) -> None:
    """The two gloo ranks' logits (_tp_worker's results of job spec): each within fp32 rel. 1e-4 of transformers
    on the dequantized weights, and bit-equal to each other."""
    full, _ = _script(spec["seed"])
    ref = _reference(spec["deq"], torch.float32, full)
    for res in results:
        assert _max_err(res["out"], ref) < 1e-4
    assert torch.equal(torch.stack([o for *_, o in results[0]["out"]]),
                       torch.stack([o for *_, o in results[1]["out"]]))


@pytest.mark.parametrize("job", ["block", "block_storage", "block_storage_cut", "moe", "tensor_storage"])
def test_tp2_matches_transformers_on_dequantized_weights(tp2_fp8, job):
    check_tp2(*tp2_fp8[job])


def test_tp2_block_fp8_mlp_is_cut_at_blocks(tp2_fp8):
    """Intermediate 384 = 3 blocks: rank 0 holds columns [0, 128), rank 1 [128, 384) (parallel.block_split,
    not 192 each), so both down_proj slices start on a block and every projection keeps e4m3."""
    _, (r0, r1) = tp2_fp8["block_storage"]
    assert r0["methods"] == r1["methods"] == {"qkv": "fp8", "o": "fp8", "gate_up": "fp8", "down": "fp8"}


def test_tp2_block_cut_by_the_shard_boundary_is_dequantized(tp2_fp8):
    """Where a row-parallel slice must still start inside a block (o_proj's K 32 a rank; a dense MLP of one
    block split evenly, 56 each), rank 1's layer is dequantized (exact) and the rest stays FP8."""
    _, (r0, r1) = tp2_fp8["block_storage_cut"]
    assert r0["methods"] == {"qkv": "fp8", "o": "fp8", "gate_up": "fp8", "down": "fp8"}
    assert r1["methods"] == {"qkv": "fp8", "o": "unquantized", "gate_up": "fp8", "down": "unquantized"}


# -- refusals --------------------------------------------------------------------------------------

def _ct(**changes) -> dict:
    q = quant_config("channel_dynamic")
    scheme = q["config_groups"]["group_0"]
    for path, value in changes.items():
        node, *keys = path.split("__")
        target = {"w": scheme["weights"], "a": scheme["input_activations"], "s": scheme, "q": q}[node]
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value
    return q


BAD_CONFIGS = [
    ({"quant_method": "awq", "bits": 4}, "quant_method"),
    ({"quant_method": "gptq", "bits": 4}, "quant_method"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method"),
    ({"quant_method": "mxfp4"}, "quant_method"),
    ({**quant_config("block"), "weight_block_size": [64, 64]}, "weight_block_size"),
    ({**quant_config("block"), "weight_block_size": [128, 64]}, "weight_block_size"),  # None: per tensor
    ({**quant_config("block"), "activation_scheme": "static"}, "activation_scheme"),
    ({**quant_config("block"), "fmt": "e5m2"}, "fmt"),
    (_ct(w__num_bits=4), "weights.num_bits"),
    (_ct(w__type="int"), "weights.type"),
    (_ct(w__symmetric=False), "weights.symmetric"),
    (_ct(w__strategy="group"), "weights.strategy"),
    (_ct(w__group_size=128), "weights.group_size"),
    (_ct(w__strategy="block"), "weights.strategy"),
    (_ct(a__type="int"), "input_activations.type"),
    (_ct(a__strategy="group"), "input_activations"),
    (_ct(s__targets=["re:.*mlp.*"]), "targets"),
    (_ct(q__format="pack-quantized"), "format"),
    (_ct(q__ignore="lm_head"), "ignore"),
    ({**_ct(), "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "head"}}, "kv_cache_scheme"),
    ({**_ct(), "config_groups": {}}, "config_groups"),
]


def refusal(qcfg) -> str:
    """A tiny Llama config.json with quantization_config qcfg -> the UNSUPPORTED_QUANTIZATION message it is refused with."""
    raw = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 112,
           "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 96, "quantization_config": qcfg}
    with pytest.raises(ModelLoadError) as info:
        ModelConfig.from_dict(raw)
    assert info.value.code == ModelErrorCode.UNSUPPORTED_QUANTIZATION
    return str(info.value)


@pytest.mark.parametrize("qcfg,field", BAD_CONFIGS, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD_CONFIGS)])
def test_unsupported_quantization_configs_are_refused_naming_the_field(qcfg, field):
    assert field in refusal(qcfg)


def _edit(fp8: str, out, fn):
    """A copy of the FP8 folder with its tensors passed through fn (a dict -> dict)."""
    shutil.copytree(fp8, out)
    tensors = load_file(os.path.join(fp8, "model.safetensors"))
    save_file(fn(dict(tensors)), os.path.join(out, "model.safetensors"))
    return str(out)


Q = "model.layers.0.self_attn.q_proj"


def _drop(name):
    return lambda t: {k: v for k, v in t.items() if k != name}


def _put(name, value):
    return lambda t: {**t, name: value}


BAD_TENSORS = [  # (format, edit, code, text the message must hold)
    ("block", _drop(f"{Q}.weight_scale_inv"), ModelErrorCode.MISSING_TENSOR, f"{Q}.weight_scale_inv"),
    ("block", _put(f"{Q}.weight_scale_inv", torch.ones(2, 1)), ModelErrorCode.MISSHAPEN_TENSOR,
     f"{Q}.weight_scale_inv"),
    ("block", _put(f"{Q}.weight_scale_inv", torch.ones(1, 1, dtype=torch.int32)), ModelErrorCode.UNSUPPORTED_DTYPE,
     f"{Q}.weight_scale_inv"),
    ("block", _put(f"{Q}.weight_scale_inv", torch.full((1, 1), float("inf"))), ModelErrorCode.NONFINITE_WEIGHT,
     f"{Q}.weight_scale_inv"),
    ("block", _put("lm_head.weight_scale_inv", torch.ones(1, 1)), ModelErrorCode.UNEXPECTED_TENSOR,
     "lm_head.weight_scale_inv"),  # lm_head is ignored: no scale
    ("block", lambda t: {**t, f"{Q}.weight": t[f"{Q}.weight"].float()}, ModelErrorCode.UNSUPPORTED_DTYPE,
     f"{Q}.weight"),
    ("block", lambda t: {**t, f"{Q}.weight": t[f"{Q}.weight"].float().to(torch.float8_e5m2)},
     ModelErrorCode.UNSUPPORTED_DTYPE, f"{Q}.weight"),
    ("block", lambda t: {**t, "model.norm.weight": t["model.norm.weight"].to(E4M3)},
     ModelErrorCode.UNSUPPORTED_DTYPE, "model.norm.weight"),
    ("block", lambda t: {**t, "model.embed_tokens.weight": t["model.embed_tokens.weight"].to(E4M3)},
     ModelErrorCode.UNSUPPORTED_DTYPE, "model.embed_tokens.weight"),
    ("block", lambda t: {**t, "lm_head.weight": t["lm_head.weight"].to(E4M3)},
     ModelErrorCode.UNSUPPORTED_DTYPE, "lm_head.weight"),
    ("block", lambda t: {**t, f"{Q}.weight": torch.full_like(t[f"{Q}.weight"], float("nan"))},
     ModelErrorCode.NONFINITE_WEIGHT, f"{Q}.weight"),
    ("channel_dynamic", _put(f"{Q}.weight_scale", torch.ones(64)), ModelErrorCode.MISSHAPEN_TENSOR,
     f"{Q}.weight_scale"),
    ("channel_dynamic", _put(f"{Q}.input_scale", torch.ones(1)), ModelErrorCode.UNEXPECTED_TENSOR,
     f"{Q}.input_scale"),  # dynamic activations: no input_scale
    ("tensor_static", _drop(f"{Q}.input_scale"), ModelErrorCode.MISSING_TENSOR, f"{Q}.input_scale"),
    ("tensor_static", _put(f"{Q}.input_scale", torch.ones(2)), ModelErrorCode.MISSHAPEN_TENSOR, f"{Q}.input_scale"),
    ("tensor_static", _put(f"{Q}.weight_scale", torch.ones(64, 1)), ModelErrorCode.MISSHAPEN_TENSOR,
     f"{Q}.weight_scale"),
    ("channel_dynamic", _put("model.layers.0.self_attn.k_scale", torch.ones(())), ModelErrorCode.UNEXPECTED_TENSOR,
     "model.layers.0.self_attn.k_scale"),  # no kv_cache_scheme
]


@pytest.mark.parametrize("fmt,edit,code,text", BAD_TENSORS,
                         ids=[f"{i}-{c.name}" for i, (_, _, c, _) in enumerate(BAD_TENSORS)])
def test_bad_fp8_tensors_are_refused_naming_the_tensor(checkpoint_dir, tmp_path, fmt, edit, code, text):
    fp8, _, _ = write_fp8(checkpoint_dir("llama"), tmp_path / "src", fmt)
    path = _edit(fp8, tmp_path / "bad", edit)
    with pytest.raises(ModelLoadError) as info:
        _gen(path)
    assert info.value.code == code, str(info.value)
    assert text in str(info.value)


def test_missing_kv_scale_is_refused(checkpoint_dir, tmp_path):
    fp8, _, _ = write_fp8(checkpoint_dir("llama"), tmp_path / "src", "channel_dynamic", kv=True)
    name = "model.layers.1.self_attn.v_scale"
    with pytest.raises(ModelLoadError) as info:
        _gen(_edit(fp8, tmp_path / "bad", _drop(name)))
    assert info.value.code == ModelErrorCode.MISSING_TENSOR and name in str(info.value)


# -- CUDA (`pytest -m cuda`): e4m3 kept, FP8 kernels (model_wrapper.kernels.fp8) or their fallback ----

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cuda_vs_reference(fp8: str, deq: str, seed: int, **kw):
    """-> (gen, rel. err, top-1 agreement) of bf16 CUDA logits against transformers fp32 on the dequantized weights."""
    gen = TextGenerator.from_pretrained(fp8, device="cuda", dtype=torch.bfloat16, **kw)
    full, steps = _script(seed)
    outputs = [(r, p, o.float().cpu()) for r, p, o in run_scenario(gen, full, steps, block_size=16)]
    ref = _reference(deq, torch.float32, full)
    got = torch.stack([o for *_, o in outputs])
    want = torch.stack([ref[r][p] for r, p, _ in outputs])
    return gen, _max_err(outputs, ref), float((got.argmax(-1) == want.argmax(-1)).float().mean())


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("fmt", ["block", "channel_dynamic", "tensor_static", "autofp8_static", "autofp8_dynamic"])
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_keeps_fp8_weights_within_bounds_of_the_dequantized_model(wide_llama, tmp_path, fmt, graphs):
    fp8, deq, _ = write_fp8(wide_llama, tmp_path, fmt, ignore=())
    gen, err, top1 = _cuda_vs_reference(fp8, deq, seed=3, cuda_graphs=graphs)
    lins = list(gen.model_wrapper.lora_linears().values()) + [gen.model_wrapper.model.lm_head]
    assert all(lin.method.name == "fp8" and lin.weight.dtype == E4M3 for lin in lins)
    _, err16, top1_16 = _cuda_vs_reference(deq, deq, seed=3, cuda_graphs=graphs)  # bf16 on the same weights
    _within_fp8_bounds(err, top1, err16, top1_16)


def _within_fp8_bounds(err, top1, err16, top1_16):
    """FP8 against fp32, beside bf16's own error on the same dequantized weights. Prefill steps
    quantize activations to e4m3 per token (3 mantissa bits: ~2-3% relative error per GEMM, which a
    random tiny model's near-flat logits turn into argmax flips); decode steps of 1-2 tokens are weight-only,
    of 3-16 tokens quantize per token and 128 columns (kernels/fp8_skinny_mma.py). The additive term covers the
    spread of that rounding over equivalent kernels: on an H100 (session 42) per-token models gave 0.12-0.17 across
    seeds 3-4, fast accumulation on or off and the norm's rounding before quantizing (bf16's own error: 0.016-0.021);
    a wrong scale or layout gives errors near 1."""
    assert err <= 4 * err16 + 0.15, (err, err16)
    assert top1 >= top1_16 - 0.2, (top1, top1_16)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("w8a8", [False, True], ids=["weight-only", "w8a8"])
def test_cuda_block_fp8_experts(checkpoint_dir, tmp_path, w8a8):
    """Stacked e4m3 experts + block scales through kernels.moe_experts(..., gate_up_scale, down_scale); w8a8:
    KernelConfig.moe_fp8_w8a8 (the steps past the decode path multiply e4m3 activations)."""
    from model_wrapper.kernels import KernelConfig

    fp8, deq, _ = write_fp8(checkpoint_dir("qwen3_moe"), tmp_path, "block", ignore=("lm_head", "mlp.gate"))
    gen, err, top1 = _cuda_vs_reference(fp8, deq, seed=8, kernel_config=KernelConfig(moe_fp8_w8a8=w8a8))
    experts = gen.model_wrapper.model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.dtype == E4M3 and experts.down_proj_scale.dtype == torch.float32
    _, err16, top1_16 = _cuda_vs_reference(deq, deq, seed=8)
    _within_fp8_bounds(err, top1, err16, top1_16)


@pytest.mark.cuda
@needs_cuda
def test_cuda_lora_on_fp8_base_does_not_fold(checkpoint_dir, tmp_path):
    from conftest import PagedHarness
    from test_lora import make_adapter

    fp8, deq, _ = write_fp8(checkpoint_dir("qwen3"), tmp_path, "block")
    gen = TextGenerator.from_pretrained(fp8, device="cuda", dtype=torch.bfloat16)
    assert gen.model_wrapper.has_fp8_projections()
    assert gen.enable_lora(max_loras=2, max_rank=4).folds is False
    peft = make_adapter(deq, tmp_path / "a", 1, r=4, lora_alpha=8, target_modules="all-linear")
    gen.load_adapter("a", str(tmp_path / "a"))
    seq = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    h = PagedHarness(gen, num_blocks=16, block_size=16)
    out = torch.cat([h.step({0: seq[:-1]}, is_prefill=True, adapter_ids=["a"]),
                     h.step({0: seq[-1:]}, is_prefill=False, adapter_ids=["a"])]).float().cpu()
    with torch.no_grad():
        ref = peft(torch.tensor([seq])).logits[0].float()
    assert rel_err(out, ref) < 0.1


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("batch", [3, 8])
def test_cuda_attention_merge_quantizes_o_input_as_the_quantize_kernel(checkpoint_dir, tmp_path, batch, monkeypatch):
    """KernelConfig.fp8_attention_out_quant: in the graphs' decode steps whose o projection runs skinny_mma on block
    weights (3-32 tokens), the decode attention's split merge hands o its input quantized per token and head
    (head_dim 128). The e4m3 operands are the quantize kernel's, so the logits equal those with the switch off, bit
    for bit, at every step; the merge's quantizing launch ran (counted) only with the switch on."""
    from conftest import PagedHarness
    from model_wrapper.kernels import KernelConfig, decode_attention

    src = make_checkpoint(tmp_path / "src", "llama", hidden_size=512, intermediate_size=512, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=128)
    fp8, _, _ = write_fp8(src, tmp_path, "block", ignore=())
    quantized = []
    real = decode_attention.merge_splits
    monkeypatch.setattr(decode_attention, "merge_splits",
                        lambda *a, **k: (quantized.append(k.get("quant", False)), real(*a, **k))[1])
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in torch.randint(3, 40, (batch,), generator=g)]
    tokens = torch.randint(0, 96, (4, batch), generator=g).tolist()
    runs = {}
    for on in (False, True):
        quantized.clear()
        gen = TextGenerator.from_pretrained(fp8, device="cuda", dtype=torch.bfloat16, cuda_graphs=True,
                                            kernel_config=KernelConfig(fp8_attention_out_quant=on))
        h = PagedHarness(gen, 64, 16, seed=3)
        last = torch.cumsum(torch.tensor([len(p) for p in prompts]), 0) - 1
        h.step({r: p for r, p in enumerate(prompts)}, is_prefill=True, lm_head_indices=last)
        runs[on] = [h.step({r: [t] for r, t in enumerate(ts)}, is_prefill=False) for ts in tokens]
        assert any(quantized) == on, on
        del gen
    for a, b in zip(runs[False], runs[True]):
        assert torch.equal(a, b)
