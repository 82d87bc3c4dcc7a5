"""FP8 (e4m3) KV caches through forward_tensor, against transformers with FP8-rounded K/V.

Oracle: transformers' own model classes on the same random checkpoint, with one change made
through transformers' public attention registry (AttentionInterface): before its eager attention,
each layer's K (after RoPE, and after the q/k norm where the family has one) and V are rounded
through float8_e4m3fn with that layer's scales, exactly what an FP8 cache holds:

    K~ = float(e4m3(clamp(K / k_scale, +-448))) * k_scale     (V likewise with v_scale)

and attention then runs over K~, V~ in float32. Our library writes the same rounded values into
its cache and reads them back, so the logits agree to float rounding (fp32: rel. error < 1e-4),
while a model without the rounding differs by far more (which shows the rounding is exercised).
Covered: prefill (batched, chunked), a mixed step, decode with lm_head_indices, multi-token
decode, spec_mask draft trees, scales != 1 (one that saturates), calibration, the refusals of
validation, and the block counts of the sizing helpers. The Triton kernels' FP8 paths are in
tests/kernels (test_kv_store.py, test_decode_attention.py); the GPU paths in test_cuda_model.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.models.llama.modeling_llama import eager_attention_forward

from conftest import PagedHarness, hf_model, rel_err
from test_masks import path, tree_rows
from kv_manager import num_blocks_for_budget
from text_generator import TextGenerator
from text_generator.errors import ErrorCode, ForwardArgumentError

pytestmark = pytest.mark.usefixtures("one_thread")

FP8 = torch.float8_e4m3fn
VOCAB = 96


def round_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x rounded through e4m3 with `scale`, back in x's dtype (the oracle's own few lines)."""
    return ((x.float() / scale).clamp(-448.0, 448.0).to(FP8).float() * scale).to(x.dtype)


def _register(name: str, attention) -> None:
    """transformers' attention registry: `name` runs `attention` with eager attention's masks."""
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def fp8_reference(path: str, k_scales, v_scales):
    """transformers' model of `path` whose attention sees K and V rounded through e4m3 per layer."""

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        i = module.layer_idx
        return eager_attention_forward(module, query, round_fp8(key, k_scales[i]), round_fp8(value, v_scales[i]),
                                       attention_mask, scaling, dropout, **kwargs)

    _register("fp8_kv_eager", attention)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="fp8_kv_eager")
    return model.eval()


def fp8_harness(gen, num_blocks: int, block_size: int) -> PagedHarness:
    h = PagedHarness(gen, num_blocks, block_size)
    h.kv_cache = gen.allocate_kv_cache(num_blocks, block_size, dtype=FP8)
    return h


SCALES = {  # (k_scales, v_scales) per layer; 0.002 saturates: |K| > 0.9 is clamped to 448 * 0.002
    "ones": ([1.0, 1.0], [1.0, 1.0]),
    "scaled": ([0.02, 0.002], [0.05, 0.01]),
}


def _full_and_steps(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    full = {r: torch.randint(0, VOCAB, (n,), generator=g).tolist() for r, n in ((0, 18), (1, 9), (2, 31))}
    steps = [  # (is_prefill, {rid: (start, end)}, lm_head)
        (True, {0: (0, 11), 1: (0, 5), 2: (0, 8)}, False),  # uneven prompts, request 2 chunked
        (True, {0: (11, 12), 1: (5, 6), 2: (8, 24)}, False),  # mixed: decodes + a prefill chunk
        (False, {0: (12, 13), 1: (6, 7), 2: (24, 25)}, True),  # decode, lm_head_indices
        (False, {0: (13, 16), 1: (7, 9), 2: (25, 26)}, False),  # multi-token decode
    ]
    return full, steps


def _scenario(gen, full, steps):
    """The steps over an e4m3 cache -> (logits [rows, vocab], the (request, position) of each row)."""
    h = fp8_harness(gen, 40, 4)
    got, where = [], []
    for is_prefill, spans, use_lm in steps:
        chunks = {r: full[r][a:b] for r, (a, b) in spans.items()}
        positions = [(r, p) for r, (a, b) in spans.items() for p in range(a, b)]
        lm = torch.arange(len(positions) - 1, -1, -1) if use_lm else None
        if lm is not None:
            positions = [positions[i] for i in lm.tolist()]
        got.append(h.step(chunks, is_prefill=is_prefill, lm_head_indices=lm))
        where += positions
    assert h.kv_cache[0][0].dtype == FP8
    return torch.cat(got), where


def _hf_rows(model, full, where):
    with torch.no_grad():
        logits = {r: model(torch.tensor([t])).logits[0].float() for r, t in full.items()}
    return torch.stack([logits[r][p] for r, p in where])


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
@pytest.mark.parametrize("scales", list(SCALES))
def test_fp8_cache_matches_transformers_over_fp8_rounded_kv(checkpoint_dir, family, scales):
    ckpt = checkpoint_dir(family)
    ks, vs = SCALES[scales]
    gen = TextGenerator.from_pretrained(ckpt, device="cpu", dtype=torch.float32)
    gen.set_kv_scales(ks, vs)
    assert torch.equal(gen.kv_scales, torch.tensor([ks, vs]))
    full, steps = _full_and_steps()
    got, where = _scenario(gen, full, steps)
    assert rel_err(got, _hf_rows(fp8_reference(ckpt, ks, vs), full, where)) < 1e-4
    assert rel_err(got, _hf_rows(hf_model(ckpt), full, where)) > 1e-3  # the rounding is real: far from the unrounded model


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fp8_cache_draft_tree_matches_root_to_node_paths(checkpoint_dir, family):
    """A spec_mask tree step over an FP8 cache: node i's logits = the FP8 oracle's last logits of
    context + the tokens of node i's root-to-node path."""
    ckpt = checkpoint_dir(family)
    ks, vs = SCALES["scaled"]
    gen = TextGenerator.from_pretrained(ckpt, device="cpu", dtype=torch.float32)
    gen.set_kv_scales(ks, vs)
    ref = fp8_reference(ckpt, ks, vs)
    g = torch.Generator().manual_seed(5)
    ctx = torch.randint(0, VOCAB, (10,), generator=g).tolist()
    parents = [-1, 0, 0, 1, 1, 2]
    toks = torch.randint(0, VOCAB, (len(parents),), generator=g).tolist()
    h = fp8_harness(gen, 16, 4)
    h.step({0: ctx}, is_prefill=True)
    mask, depth = tree_rows(parents)
    start = len(ctx)
    h.ensure(0, start + len(parents))
    bt = torch.tensor([h.tables[0]], dtype=torch.int32)
    out = gen.forward_tensor(torch.tensor(toks), torch.tensor([start + d for d in depth]), False, h.kv_cache, bt,
                             torch.tensor([h.slot(0, start + i) for i in range(len(parents))]),
                             torch.tensor([start + len(parents)]), 64, q_lens=[len(parents)], spec_mask=mask)
    with torch.no_grad():
        want = torch.stack([ref(torch.tensor([ctx + [toks[j] for j in path(parents, i)]])).logits[0, -1]
                            for i in range(len(parents))])
    assert rel_err(out, want) < 1e-4


def test_calibration_sets_amax_over_448_of_each_layers_k_and_v(checkpoint_dir):
    """Oracle: transformers' K (after RoPE) and V of the same prompts, captured in its attention."""
    ckpt = checkpoint_dir("llama")
    gen = TextGenerator.from_pretrained(ckpt, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (13, 5, 21)]
    amax = torch.zeros(2, 2)

    def capture(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        i = module.layer_idx
        amax[0, i] = max(amax[0, i], key.abs().max())
        amax[1, i] = max(amax[1, i], value.abs().max())
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)

    _register("amax_capture", capture)
    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="amax_capture").eval()
    with torch.no_grad():
        for p in prompts:
            ref(torch.tensor([p]))
    got = gen.calibrate_kv_scales(prompts)
    want = amax / 448.0
    assert torch.allclose(got, want, rtol=1e-5, atol=0)
    assert torch.allclose(gen.kv_scales, want, rtol=1e-5, atol=0)


def test_kv_scales_refused_unless_num_layers_positive_finite_floats(checkpoint_dir):
    gen = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu")
    before = gen.kv_scales.clone()
    for k, v, arg in (([1.0], [1.0, 1.0], "k_scales"), ([1.0, 0.0], [1.0, 1.0], "k_scales"),
                      ([1.0, 1.0], [1.0, float("nan")], "v_scales"), ([1.0, 1.0], "ab", "v_scales")):
        with pytest.raises(ForwardArgumentError) as e:
            gen.set_kv_scales(k, v)
        assert e.value.code == ErrorCode.INVALID_KV_SCALES and e.value.argument == arg
    assert torch.equal(gen.kv_scales, before)
    with pytest.raises(ForwardArgumentError) as e:
        gen.calibrate_kv_scales([[]])
    assert e.value.argument == "input_ids_list[0]"
    assert torch.equal(gen.kv_scales, before)


def test_checkpoint_kv_scales_are_taken_and_checked(checkpoint_dir):
    """The loader's checkpoint_kv_scales ((k [L], v [L]) float32; the FP8 checkpoint loader sets them)
    become kv_scales; a wrong count or a non-positive scale is refused with a MODEL_ code."""
    from model_wrapper import ModelErrorCode, ModelLoadError

    mw = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu").model_wrapper
    assert torch.equal(mw.kv_scales, torch.ones(2, 2))  # no scales in the checkpoint: 1.0
    mw.checkpoint_kv_scales = (torch.tensor([0.5, 0.25]), torch.tensor([2.0, 4.0]))
    mw.load_checkpoint_kv_scales()
    assert torch.equal(mw.kv_scales, torch.tensor([[0.5, 0.25], [2.0, 4.0]]))
    for bad, code in (((torch.ones(3), torch.ones(2)), ModelErrorCode.MISSHAPEN_TENSOR),
                      ((torch.ones(2), torch.tensor([1.0, -1.0])), ModelErrorCode.NONFINITE_WEIGHT)):
        mw.checkpoint_kv_scales = bad
        with pytest.raises(ModelLoadError) as e:
            mw.load_checkpoint_kv_scales()
        assert e.value.code == code
    assert torch.equal(mw.kv_scales, torch.tensor([[0.5, 0.25], [2.0, 4.0]]))


def test_cache_dtype_is_checked_against_the_model(checkpoint_dir):
    """An fp32 model takes an fp32 or an e4m3 cache; an fp16 cache, or layers of mixed dtypes, are
    refused with TG_INVALID_DTYPE naming the tensor, and nothing is written."""
    gen = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu", dtype=torch.float32)
    ids, pos, slots = torch.tensor([1, 2, 3]), torch.arange(3), torch.arange(3)
    args = (ids, pos, True)
    rest = (torch.tensor([[0]], dtype=torch.int32), slots, torch.tensor([3]), 16)
    fp16 = [tuple(t.to(torch.float16) for t in pair) for pair in gen.allocate_kv_cache(2, 4)]
    with pytest.raises(ForwardArgumentError) as e:
        gen.forward_tensor(*args, fp16, *rest)
    assert e.value.code == ErrorCode.INVALID_DTYPE and e.value.argument == "kv_cache[0].k_cache"
    mixed = gen.allocate_kv_cache(2, 4, dtype=FP8)
    mixed[1] = (mixed[1][0], torch.zeros(mixed[1][1].shape, dtype=torch.float32))
    with pytest.raises(ForwardArgumentError) as e:
        gen.forward_tensor(*args, mixed, *rest)
    assert e.value.code == ErrorCode.INVALID_DTYPE and e.value.argument == "kv_cache[1].v_cache"
    assert all(not t.float().any() for pair in mixed for t in pair)  # nothing written
    for bad in (torch.float16, "int8", torch.float8_e5m2, "fp8_e5m2"):
        with pytest.raises(ForwardArgumentError) as e:
            gen.allocate_kv_cache(2, 4, dtype=bad)
        assert e.value.code == ErrorCode.INVALID_KV_CACHE_DTYPE and e.value.argument == "kv_cache_dtype"
    assert gen.allocate_kv_cache(2, 4, dtype="fp8")[0][0].dtype == FP8
    assert gen.allocate_kv_cache(2, 4, dtype="fp8_e4m3")[0][0].dtype == FP8  # vLLM's name for it
    assert gen.allocate_kv_cache(2, 4, dtype=torch.float32)[0][0].dtype == torch.float32


def test_gpus_without_e4m3_take_no_fp8_cache_and_dequantize_fp8_weights(checkpoint_dir, monkeypatch):
    """Triton has no e4m3 type before compute capability 8.9, so on such a GPU (A100: sm80) FP8 weights are
    dequantized at load (runs_e4m3 False) and the model runs no FP8 cache: ModelWrapper.kv_cache_dtypes leaves
    e4m3 out there (a stand-in wrapper on a CUDA device of that capability), and a generator whose wrapper reports
    that refuses "fp8" / e4m3 caches with TG_INVALID_KV_CACHE_DTYPE naming kv_cache_dtype, and an e4m3 cache
    passed to forward_tensor with TG_INVALID_DTYPE naming the tensor, writing nothing."""
    from types import SimpleNamespace

    from model_wrapper import ModelWrapper
    from model_wrapper.layers.fp8_linear import runs_e4m3

    capability = {"cap": (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["cap"])
    cuda = torch.device("cuda", 0)
    wrapper = SimpleNamespace(device=cuda, dtype=torch.bfloat16)
    runs_e4m3.cache_clear()  # (a device's answer is cached; each capability below is a different GPU)
    assert not runs_e4m3(cuda) and ModelWrapper.kv_cache_dtypes(wrapper) == (torch.bfloat16,)
    for cap in ((8, 9), (9, 0), (10, 0)):  # L4 / L40S, H100 / H200, B200
        capability["cap"] = cap
        runs_e4m3.cache_clear()
        assert runs_e4m3(cuda) and ModelWrapper.kv_cache_dtypes(wrapper) == (torch.bfloat16, FP8)
    runs_e4m3.cache_clear()  # (no stubbed answer left behind for later tests)
    assert not runs_e4m3("cpu")  # the CPU dequantizes FP8 weights too, but runs an FP8 cache (the torch reference)
    assert ModelWrapper.kv_cache_dtypes(SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)) == (
        torch.float32, FP8)

    gen = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu", dtype=torch.float32)
    fp8_cache = gen.allocate_kv_cache(2, 4, dtype="fp8")
    monkeypatch.setattr(gen.model_wrapper, "kv_cache_dtypes", lambda: (torch.float32,))  # as on an sm80 GPU
    for bad in ("fp8", "fp8_e4m3", FP8):
        with pytest.raises(ForwardArgumentError) as e:
            gen.allocate_kv_cache(2, 4, dtype=bad)
        assert e.value.code == ErrorCode.INVALID_KV_CACHE_DTYPE and e.value.argument == "kv_cache_dtype"
        assert "compute capability 8.9" in str(e.value)
    ids, pos, slots = torch.tensor([1, 2, 3]), torch.arange(3), torch.arange(3)
    rest = (torch.tensor([[0]], dtype=torch.int32), slots, torch.tensor([3]), 16)
    with pytest.raises(ForwardArgumentError) as e:
        gen.forward_tensor(ids, pos, True, fp8_cache, *rest)
    assert e.value.code == ErrorCode.INVALID_DTYPE and e.value.argument == "kv_cache[0].k_cache"
    assert "needs a GPU with e4m3" in str(e.value)
    assert all(not t.float().any() for pair in fp8_cache for t in pair)  # nothing written
    cache = gen.allocate_kv_cache(2, 4)  # the model's own dtype still runs
    assert gen.forward_tensor(ids, pos, True, cache, *rest).shape == (3, gen.vocab_size)


def test_sizing_helpers_count_one_byte_elements(checkpoint_dir):
    """Bytes per block = 2 * layers * kv_heads * head_dim * block_size * element size: an e4m3 cache
    fits twice the blocks of a bf16 one (four times an fp32 one) in the same budget."""
    gen = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu", dtype=torch.bfloat16)
    spec16, spec8 = gen.kv_cache_spec_for(None), gen.kv_cache_spec_for("fp8")
    assert spec16.dtype == torch.bfloat16 and spec8.dtype == FP8
    per_token = 2 * 2 * 2 * 16  # layers, K and V, kv heads, head_dim (elements)
    assert spec8.bytes_per_block(16) == per_token * 16
    assert spec16.bytes_per_block(16) == 2 * per_token * 16
    budget = 1 << 20
    assert num_blocks_for_budget(spec8, 16, budget) == budget // (per_token * 16)
    assert num_blocks_for_budget(spec8, 16, budget) == 2 * num_blocks_for_budget(spec16, 16, budget)
    kv = gen.allocate_kv_cache(3, 16, dtype=FP8)
    assert sum(t.numel() * t.element_size() for pair in kv for t in pair) == 3 * spec8.bytes_per_block(16)


# -- the engine and the CLI with an FP8 cache ------------------------------------------------------------------


def _fp8_greedy(ref, ids: list[int], n: int) -> list[int]:
    """transformers' own greedy generate with the FP8-rounding attention: n new tokens."""
    with torch.no_grad():
        out = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_engine_with_fp8_cache_generates_what_transformers_over_fp8_kv_does(checkpoint_dir):
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    ckpt = checkpoint_dir("qwen2")
    gen = TextGenerator.from_pretrained(ckpt, device="cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (7, 19, 3)]
    scales = gen.calibrate_kv_scales(prompts)
    engine = LLMEngine(gen, num_blocks=32, block_size=4, kv_cache_dtype="fp8", freeze_gc=False)
    assert all(t.dtype == FP8 for pair in engine.kv_cache for t in pair)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True), use_tqdm=False)
    ref = fp8_reference(ckpt, scales[0].tolist(), scales[1].tolist())
    for p, o in zip(prompts, outs):
        assert o.token_ids == _fp8_greedy(ref, p, 8)
    with pytest.raises(ForwardArgumentError) as e:
        LLMEngine(gen, num_blocks=8, block_size=4, kv_cache_dtype="int4", freeze_gc=False)
    assert e.value.code == ErrorCode.INVALID_KV_CACHE_DTYPE


def test_engine_sizes_an_fp8_cache_at_twice_the_blocks(checkpoint_dir):
    """No num_blocks: the CPU budget holds twice as many e4m3 blocks as bf16 ones."""
    from text_generator.engine import LLMEngine

    gen = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu", dtype=torch.bfloat16)
    budget = 64 * gen.kv_cache_spec.bytes_per_block(4)
    kw = dict(block_size=4, max_seq_len=64, max_num_seqs=64, kv_cpu_budget_bytes=budget, freeze_gc=False)
    auto, fp8 = LLMEngine(gen, **kw), LLMEngine(gen, kv_cache_dtype="fp8", **kw)
    assert auto.kv_cache[0][0].shape[0] == 64 and fp8.kv_cache[0][0].shape[0] == 128


def cli_greedy_ids(capsys, path: str, *flags: str) -> list[int]:
    """`generate 5,17,33,2 --token-ids --json` on the CPU in fp32, 6 greedy tokens (EOS ignored), with flags:
    the token ids it prints."""
    import json

    from text_generator.cli import main

    code = main(["generate", "5,17,33,2", "--token-ids", "--model", path, "--device", "cpu", "--dtype", "float32",
                 "--temperature", "0", "--max-new-tokens", "6", "--ignore-eos", "--json", *flags])
    out = capsys.readouterr()
    assert code == 0, out.err
    (rec,) = [json.loads(line) for line in out.out.splitlines()]
    return rec["token_ids"]


def test_cli_generate_with_kv_cache_dtype_fp8(checkpoint_dir, monkeypatch, capsys):
    """`generate --kv-cache-dtype fp8` (scales 1.0: the checkpoint has none) prints the tokens
    transformers over FP8-rounded K/V generates greedily."""
    from text_generator.cli import main

    ckpt = checkpoint_dir("llama")
    assert cli_greedy_ids(capsys, ckpt, "--kv-cache-dtype", "fp8") == _fp8_greedy(fp8_reference(ckpt, [1.0, 1.0], [1.0, 1.0]), [5, 17, 33, 2], 6)
    for bad in ("int8", "fp8_e5m2"):  # argparse refuses them in one line (e4m3 caches only)
        with pytest.raises(SystemExit) as e:
            main(["generate", "x", "--device", "cpu", "--kv-cache-dtype", bad])
        assert e.value.code == 2 and "--kv-cache-dtype" in capsys.readouterr().err


# -- tensor parallelism: two gloo ranks, each with its own kv heads' e4m3 cache --------------------------------


def _tp_worker(rank, store, path, prompts, out_dir):
    import os

    import torch.distributed as dist

    from model_wrapper import TPGroup

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32, attention_backend="torch",
                                            tp_group=TPGroup.from_default_group())
        scales = gen.calibrate_kv_scales(prompts)
        full, steps = _full_and_steps()
        logits, where = _scenario(gen, full, steps)
        torch.save(dict(scales=scales, logits=logits, where=where, kv_heads=gen.kv_cache_spec.num_kv_heads),
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    from conftest import end_gloo_worker

    end_gloo_worker()  # only after a worker that raised nothing (the exception skips it)


def test_tp2_fp8_cache_calibrates_global_scales_and_matches_transformers(checkpoint_dir, tmp_path):
    """Each rank calibrates over its own kv heads and the ranks agree on the maxima: the scales equal
    one rank's calibration of the whole model; the logits match the FP8 oracle on both ranks."""
    import torch.multiprocessing as mp

    ckpt = checkpoint_dir("llama")
    full, _ = _full_and_steps()
    prompts = list(full.values())
    mp.spawn(_tp_worker, args=(str(tmp_path / "store"), ckpt, prompts, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    want = TextGenerator.from_pretrained(ckpt, device="cpu", dtype=torch.float32).calibrate_kv_scales(prompts)
    ref = fp8_reference(ckpt, want[0].tolist(), want[1].tolist())
    for res in ranks:
        assert res["kv_heads"] == 1  # TINY: 2 kv heads, one per rank
        assert torch.allclose(res["scales"], want, rtol=1e-5, atol=0)
        assert rel_err(res["logits"], _hf_rows(ref, full, res["where"])) < 1e-4
    assert torch.equal(ranks[0]["logits"], ranks[1]["logits"])


def test_fp8_kv_decode_refuses_unknown_kernels():
    """KernelConfig.fp8_kv_decode names the kernel of e4m3 decode rows: anything else is refused."""
    from model_wrapper.errors import ModelErrorCode, ModelLoadError
    from model_wrapper.kernels import KernelConfig

    with pytest.raises(ModelLoadError, match="fp8_kv_decode: expected one of .*'triton'.*got 'cutlass'") as e:
        KernelConfig(fp8_kv_decode="cutlass")
    assert e.value.code == ModelErrorCode.BAD_CONFIG
