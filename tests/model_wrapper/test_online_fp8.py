"""Online FP8 (quantization="fp8", model_wrapper/online_fp8.py): a float checkpoint quantized to block FP8 at load.

The oracle: this file quantizes each linear weight itself (fp8_checkpoints.quantize, per 128 x 128 block,
scale amax / 448, e4m3 by torch's cast), writes the DEQUANTIZED weights (e4m3 * scale, fp32) with the
float tensors it leaves alone (lm_head, embeddings, norms, routers) to a folder, and loads transformers'
own model class from it. The CPU path dequantizes once at load, so fp32 logits must agree to rel. err
< 1e-4 over prefill, chunked, mixed and multi-token decode steps; keep_fp8=True holds the CUDA storage
(e4m3 + scales) on the CPU, whose torch fallback must agree too. TP=2 on gloo equals TP=1 and the oracle.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from conftest import make_checkpoint
from fp8_checkpoints import E4M3, quantize, write_fp8
from model_wrapper import ModelLoadError
from model_wrapper.errors import ModelErrorCode
from model_wrapper.online_fp8 import quantize_block_fp8
from test_fp8_checkpoint import _gen as _fp8_gen, _tp_worker
from test_forward_parity import _max_err, _reference, _script, run_scenario
from text_generator import TextGenerator

pytestmark = pytest.mark.usefixtures("one_thread")

LEFT_FLOAT = ("lm_head", "gate", "shared_expert_gate")  # modules the online quantization leaves alone


def _quantized(name: str) -> bool:
    """Whether checkpoint tensor `name` is a weight online FP8 quantizes (every projection and expert)."""
    if not name.endswith(".weight"):
        return False
    last = name[: -len(".weight")].rsplit(".", 1)[-1]
    return (last.endswith("_proj") or last in ("w1", "w2", "w3")) and last not in LEFT_FLOAT


def write_dequantized(src: str, out) -> str:
    """src (a float checkpoint) -> a folder with each quantized weight replaced by its block
    quantize-dequantize (computed here, directly with torch), everything else as in src."""
    tensors = load_file(os.path.join(src, "model.safetensors"))
    deq = {n: (quantize(w, "block")[2].to(w.dtype).contiguous() if _quantized(n) else w) for n, w in tensors.items()}
    os.makedirs(out, exist_ok=True)
    save_file(deq, os.path.join(out, "model.safetensors"))
    for f in os.listdir(src):
        if f != "model.safetensors":
            shutil.copy(os.path.join(src, f), os.path.join(out, f))
    return str(out)


def _gen(path, keep_fp8=None, tp=None) -> TextGenerator:
    return _fp8_gen(path, keep_fp8, tp, quantization="fp8")


def _parity(src, deq, seed, keep_fp8=None) -> float:
    full, steps = _script(seed)
    outputs = run_scenario(_gen(src, keep_fp8), full, steps, block_size=4, seed=seed)
    return _max_err(outputs, _reference(deq, torch.float32, full))


# -- the quantizer against the definition ------------------------------------------------------------

def test_block_quantization_is_the_definition():
    """Scales amax / 448 per 128 x 128 block (partial edge blocks too), an all-zero block scale 1 (zeros
    round-trip), e4m3 by round-to-nearest-even of w / scale; the same on a second call."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 200, generator=g) * torch.logspace(-3, 1, 200)
    w[128:256, 128:] = 0.0  # one zero block (block row 1, block column 1)
    q, scale = quantize_block_fp8(w.to(torch.bfloat16))
    wf = w.to(torch.bfloat16).float()
    assert q.dtype == E4M3 and q.shape == (300, 200) and scale.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            blk = wf[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            s = blk.abs().max() / 448.0 if blk.abs().max() > 0 else torch.tensor(1.0)
            assert scale[i, j].item() == s.item()
            want = (blk / s).to(E4M3)
            assert torch.equal(q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].view(torch.uint8), want.view(torch.uint8))
    assert scale[1, 1].item() == 1.0 and not q[128:256, 128:].float().any()
    assert q.float().abs().max().item() == 448.0  # each block's amax maps to e4m3's largest value
    q2, scale2 = quantize_block_fp8(w.to(torch.bfloat16))
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(scale, scale2)


# -- logits against transformers on the dequantized weights ----------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral"])
def test_logits_match_transformers_on_dequantized_weights(checkpoint_dir, tmp_path, family):
    src = checkpoint_dir(family)
    deq = write_dequantized(src, tmp_path / "deq")
    gen = _gen(src)
    assert gen.config.quant is not None and gen.config.quant.online and gen.config.quant.kind == "block"
    assert _parity(src, deq, seed=hash(family) % 1000) < 1e-4
    # what is left as floats is bit-equal to the checkpoint's
    ckpt = load_file(os.path.join(src, "model.safetensors"))
    params = dict(gen.model_wrapper.model.named_parameters())
    assert torch.equal(params["model.embed_tokens.weight"], ckpt["model.embed_tokens.weight"])
    if "lm_head.weight" in ckpt:
        assert torch.equal(params["lm_head.weight"], ckpt["lm_head.weight"])
    routers = [n for n in ckpt if n.endswith((".gate.weight", ".shared_expert_gate.weight"))]
    assert bool(routers) == (family in ("qwen3_moe", "qwen2_moe", "mixtral"))
    for n in routers:
        ours = n.replace("block_sparse_moe.", "mlp.")
        assert torch.equal(params[ours], ckpt[n]), n


def test_the_online_model_differs_from_the_float_model(checkpoint_dir, tmp_path):
    """The FP8 rounding is visible: the float checkpoint's own logits are not the online model's."""
    src = checkpoint_dir("llama")
    full, steps = _script(1)
    outputs = run_scenario(_gen(src), full, steps, block_size=4)
    assert _max_err(outputs, _reference(write_dequantized(src, tmp_path / "deq"), torch.float32, full)) < 1e-4
    assert _max_err(outputs, _reference(src, torch.float32, full)) > 1e-3


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory):
    """A Llama of several 128-blocks: hidden 256, heads of 64, intermediate 320 (a partial last block)."""
    return make_checkpoint(tmp_path_factory.mktemp("wide"), "llama", hidden_size=256, intermediate_size=320,
                           num_attention_heads=4, num_key_value_heads=2)


def test_keep_fp8_holds_e4m3_with_block_scales(wide_llama, tmp_path):
    """keep_fp8=True (the CUDA storage, on the CPU): every projection e4m3 with a scale per row and
    128-column group, whose product is the test's own dequantized weight; lm_head stays float."""
    deq = write_dequantized(wide_llama, tmp_path / "deq")
    gen = _gen(wide_llama, keep_fp8=True)
    layer = gen.model_wrapper.model.model.layers[0]
    for lin, k in ((layer.self_attn.qkv_proj, 256), (layer.self_attn.o_proj, 256),
                   (layer.mlp.gate_up_proj, 256), (layer.mlp.down_proj, 320)):
        assert lin.method.name == "fp8" and lin.weight.dtype == E4M3
        assert lin.weight_scale.shape == (lin.weight.shape[0], -(-k // 128))
    want = load_file(os.path.join(deq, "model.safetensors"))["model.layers.0.mlp.down_proj.weight"]
    down = layer.mlp.down_proj
    assert torch.equal(down.method.dequantized(down, torch.float32), want)
    assert gen.model_wrapper.model.lm_head.weight.dtype == torch.float32
    assert _parity(wide_llama, deq, seed=5, keep_fp8=True) < 1e-4


def test_keep_fp8_moe_experts_hold_e4m3(checkpoint_dir, tmp_path):
    src = checkpoint_dir("qwen3_moe")
    gen = _gen(src, keep_fp8=True)
    experts = gen.model_wrapper.model.model.layers[0].mlp.experts
    e, n, k = experts.gate_up_proj.shape
    assert experts.gate_up_proj.dtype == E4M3 and experts.down_proj.dtype == E4M3
    assert experts.gate_up_proj_scale.shape == (e, n, -(-k // 128))
    assert experts.down_proj_scale.shape == (e, experts.down_proj.shape[1], -(-experts.down_proj.shape[2] // 128))
    assert gen.model_wrapper.model.model.layers[0].mlp.gate.weight.dtype == torch.float32
    assert _parity(src, write_dequantized(src, tmp_path / "deq"), seed=7, keep_fp8=True) < 1e-4


# -- tensor parallelism: two gloo ranks ------------------------------------------------------------

@pytest.fixture(scope="module")
def tp2_online(checkpoint_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("online_tp2")
    wide = make_checkpoint(root / "wide", "llama", hidden_size=256, intermediate_size=384,
                           num_attention_heads=4, num_key_value_heads=2)
    moe = checkpoint_dir("qwen3_moe")
    jobs = {"dense": dict(path=wide, keep=None, seed=11), "dense_storage": dict(path=wide, keep=True, seed=12),
            "moe": dict(path=moe, keep=None, seed=13)}
    jobs = {n: dict(j, quantization="fp8") for n, j in jobs.items()}
    mp.spawn(_tp_worker, args=(str(root / "store"), jobs, str(root)), nprocs=2, join=True)
    return {n: (j, [torch.load(root / f"{n}.rank{r}.pt", weights_only=False) for r in range(2)])
            for n, j in jobs.items()}


@pytest.mark.parametrize("job", ["dense", "dense_storage", "moe"])
def test_tp2_equals_tp1_and_transformers(tp2_online, tmp_path, job):
    spec, results = tp2_online[job]
    full, steps = _script(spec["seed"])
    ref = _reference(write_dequantized(spec["path"], tmp_path / "deq"), torch.float32, full)
    single = run_scenario(_gen(spec["path"], spec["keep"]), full, steps, block_size=4)
    for res in results:
        assert _max_err(res["out"], ref) < 1e-4
        got, want = torch.stack([o for *_, o in res["out"]]), torch.stack([o for *_, o in single])
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5  # TP=2 = TP=1 (fp32 sum order)
    if job == "dense_storage":  # intermediate 384 cut at blocks (128 / 256): every projection e4m3 on both ranks
        assert results[0]["methods"] == results[1]["methods"] == {"qkv": "fp8", "o": "fp8", "gate_up": "fp8",
                                                                  "down": "fp8"}


# -- refusals ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["int8", "FP8", "fp8_e5m2", 8, True])
def test_unknown_quantization_is_refused(checkpoint_dir, value):
    with pytest.raises(ModelLoadError) as e:
        TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu", quantization=value)
    assert e.value.code == ModelErrorCode.UNSUPPORTED_QUANTIZATION
    assert "quantization" in str(e.value) and "'fp8'" in str(e.value) and repr(value) in str(e.value)


def test_an_fp8_checkpoint_loads_as_it_is_and_another_method_is_refused(checkpoint_dir, tmp_path):
    """As vLLM's --quantization: "fp8" on a quant_method "fp8" checkpoint serves it as it is (the same scales, the
    same logits as without the argument); on a compressed-tensors checkpoint it names another method: refused."""
    block, _, _ = write_fp8(checkpoint_dir("llama"), tmp_path / "block", "block")
    asked = TextGenerator.from_pretrained(block, device="cpu", quantization="fp8")
    plain = TextGenerator.from_pretrained(block, device="cpu")
    assert asked.config.quant == plain.config.quant and asked.config.quant.online is False
    full, steps = _script(2)
    got, want = (torch.stack([o for *_, o in run_scenario(g, full, steps, block_size=4)]) for g in (asked, plain))
    assert torch.equal(got, want)
    ct, _, _ = write_fp8(checkpoint_dir("llama"), tmp_path / "ct", "channel_dynamic")
    with pytest.raises(ModelLoadError) as e:
        TextGenerator.from_pretrained(ct, device="cpu", quantization="fp8")
    assert e.value.code == ModelErrorCode.UNSUPPORTED_QUANTIZATION
    assert "quantization" in str(e.value) and "already quantized" in str(e.value) and "compressed-tensors" in str(e.value)


def test_a_float_checkpoint_with_scale_tensors_is_refused(checkpoint_dir, tmp_path):
    src = checkpoint_dir("llama")
    out = tmp_path / "odd"
    shutil.copytree(src, out)
    tensors = load_file(os.path.join(out, "model.safetensors"))
    tensors["model.layers.0.mlp.down_proj.weight_scale_inv"] = torch.ones(1, 1)
    save_file(tensors, os.path.join(out, "model.safetensors"))
    with pytest.raises(ModelLoadError) as e:
        TextGenerator.from_pretrained(str(out), device="cpu", quantization="fp8")
    assert e.value.code == ModelErrorCode.UNEXPECTED_TENSOR and "down_proj.weight_scale_inv" in str(e.value)


# -- CLI ---------------------------------------------------------------------------------------------

def test_cli_generate_with_quantization_fp8(checkpoint_dir, tmp_path, capsys):
    """`generate --quantization fp8` prints the tokens transformers on the dequantized weights generates greedily."""
    from conftest import hf_model
    from test_fp8_kv_cache import cli_greedy_ids
    from text_generator.cli import build_parser, main

    src = checkpoint_dir("llama")
    got = cli_greedy_ids(capsys, src, "--quantization", "fp8")
    model = hf_model(write_dequantized(src, tmp_path / "deq"))
    with torch.no_grad():
        want = model.generate(torch.tensor([[5, 17, 33, 2]]), max_new_tokens=6, do_sample=False,
                              min_new_tokens=6)[0, 4:].tolist()
    assert got == want
    for sub in ("generate", "bench", "serve"):
        assert "--quantization" in build_parser()._subparsers._group_actions[0].choices[sub].format_help()
    with pytest.raises(SystemExit) as e:
        main(["generate", "x", "--device", "cpu", "--quantization", "int8"])
    assert e.value.code == 2 and "--quantization" in capsys.readouterr().err


# -- CUDA (`pytest -m cuda`) -------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("family", ["wide", "qwen3_moe"])
def test_cuda_serves_the_block_fp8_checkpoint_of_the_same_quantization(wide_llama, checkpoint_dir, tmp_path, family):
    """On CUDA quantization="fp8" keeps e4m3 weights and runs what a fine-grained (block) FP8 checkpoint of the
    same quantization runs: that checkpoint, written by the tests' own quantizer (fp8_checkpoints.write_fp8,
    the same lm_head / router left float), loads into the same e4m3 bytes and scales and gives the same logits.
    How close such a checkpoint's logits come to transformers is test_fp8_checkpoint's CUDA tests' subject (on
    these tiny random models an online wide Llama measured rel. err 0.10 / top-1 0.76 against bf16's 0.017 /
    0.98 on an H200, a block checkpoint 0.099 / 0.78: at the edge of that file's top-1 bound either way)."""
    src = wide_llama if family == "wide" else checkpoint_dir(family)
    ckpt, _, _ = write_fp8(src, tmp_path / "block", "block", ignore=("lm_head", "gate", "shared_expert_gate"))
    full, steps = _script(3)

    def run(path, **kw):
        gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, **kw)
        return gen, torch.stack([o.float().cpu() for *_, o in run_scenario(gen, full, steps, block_size=16)])

    gen, got = run(src, quantization="fp8")
    ref_gen, want = run(ckpt)
    layer, ref_layer = gen.model_wrapper.model.model.layers[0], ref_gen.model_wrapper.model.model.layers[0]
    assert layer.self_attn.qkv_proj.method.name == "fp8" and layer.self_attn.qkv_proj.weight.dtype == E4M3
    pairs = {"qkv weight": (layer.self_attn.qkv_proj.weight, ref_layer.self_attn.qkv_proj.weight),
             "qkv scale": (layer.self_attn.qkv_proj.weight_scale, ref_layer.self_attn.qkv_proj.weight_scale)}
    if family == "wide":
        assert all(lin.weight.dtype == E4M3 for lin in gen.model_wrapper.lora_linears().values())
    else:
        ex, ref_ex = layer.mlp.experts, ref_layer.mlp.experts
        assert ex.gate_up_proj.dtype == E4M3
        pairs.update({"gate_up experts": (ex.gate_up_proj, ref_ex.gate_up_proj),
                      "down expert scales": (ex.down_proj_scale, ref_ex.down_proj_scale)})
    for what, (a, b) in pairs.items():
        a, b = (t.view(torch.uint8) if t.dtype == E4M3 else t for t in (a, b))
        assert torch.equal(a, b), (what, int((a != b).sum()), a.numel())
    assert gen.model_wrapper.model.lm_head.weight.dtype == torch.bfloat16
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-3


def test_serve_quantization_fp8_builds_its_engine_on_the_online_model(checkpoint_dir, tmp_path):
    """`serve --quantization fp8`: the engine the server's engine process runs holds the online FP8 model
    (its greedy tokens: those of transformers on the dequantized weights)."""
    pytest.importorskip("fastapi")
    from conftest import hf_model
    from text_generator import SamplingParams
    from text_generator.cli import build_parser
    from text_generator.serve.engine_worker import build_engine

    src = checkpoint_dir("llama")
    args = build_parser().parse_args(["serve", src, "--device", "cpu", "--dtype", "float32", "--max-model-len", "64",
                                      "--max-num-seqs", "2", "--quantization", "fp8"])
    engine, _ = build_engine(args)
    assert engine.generator.config.quant.online
    (out,) = engine.generate([[5, 17, 33, 2]], SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True),
                             use_tqdm=False)
    with torch.no_grad():
        want = hf_model(write_dequantized(src, tmp_path / "deq")).generate(
            torch.tensor([[5, 17, 33, 2]]), max_new_tokens=6, min_new_tokens=6, do_sample=False)[0, 4:].tolist()
    assert out.token_ids == want


def test_llm_quantization_fp8(checkpoint_dir, tmp_path):
    """LLM(path, quantization="fp8"): greedy tokens of transformers on the dequantized weights."""
    from conftest import hf_model
    from text_generator import LLM, SamplingParams

    src = checkpoint_dir("qwen3")
    llm = LLM(src, device="cpu", dtype="float32", quantization="fp8", tokenizer=None)
    (out,) = llm.generate([[7, 3, 11]], SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True))
    with torch.no_grad():
        want = hf_model(write_dequantized(src, tmp_path / "deq")).generate(
            torch.tensor([[7, 3, 11]]), max_new_tokens=5, min_new_tokens=5, do_sample=False)[0, 3:].tolist()
    assert out.token_ids == want


@pytest.mark.cuda
@needs_cuda
def test_cuda_quantization_is_the_cpu_quantizers():
    """Quantized on the GPU, the bytes and scales are the test quantizer's (CPU) bit for bit: amax / 448 on CUDA
    (a product with the reciprocal) was one ulp off for some blocks, and so were some e4m3 bytes."""
    g = torch.Generator().manual_seed(5)
    for shape in [(384, 256), (200, 72), (4096, 1000)]:
        w = torch.randn(*shape, generator=g) * 0.02
        q, scale = quantize_block_fp8(w, "cuda")
        want_q, want_scale, _ = quantize(w, "block")
        assert torch.equal(scale, want_scale), shape
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), shape
