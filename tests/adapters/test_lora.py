"""Multi-LoRA: forward_tensor with per-request adapters, exact against peft on the same folders.

Oracle: peft's own model (get_peft_model on transformers' model class, B matrices randomised since
peft initialises them to zero), run over each request's full sequence; the adapters are the folders
that model saved with save_pretrained, loaded through TextGenerator.load_adapter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model

from adapters import (AdapterIdsError, AdapterIdsFault, LoraError, LoraErrorCode, LoraManager, LoraStateError,
                      resolve_adapter_ids)
from adapters.peft_adapter import pattern_value
from conftest import PagedHarness, hf_model, make_checkpoint, rel_err
from text_generator import TextGenerator

ALL7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> LoraConfig kwargs: ranks 2..8, different targets, rslora, rank/alpha patterns, a regex target
ADAPTERS = {
    "a2": dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
    "b4rs": dict(r=4, lora_alpha=6, target_modules="all-linear", use_rslora=True, rank_pattern={"gate_proj": 8}),
    "c8": dict(r=8, lora_alpha=16, target_modules=["k_proj", "o_proj", "gate_proj", "down_proj"],
               layers_to_transform=[1]),
    "d_pat": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "up_proj", "down_proj"],
                  rank_pattern={"k_proj": 8, r"layers\.1\.mlp\.down_proj": 2, "model.layers.0.self_attn.q_proj": 6},
                  alpha_pattern={"up_proj": 32, r"layers\.0\..*\.k_proj": 3}),
    "e_re": dict(r=3, lora_alpha=5, target_modules=r".*\.(o_proj|up_proj)"),
}
MAX_RANK = 8
FAMILIES = ["llama", "qwen2", "qwen3"]  # qwen2: qkv bias, tied embeddings; qwen3: q_size != hidden


def make_adapter(base_path: str, out_dir, seed: int, **cfg):
    """A peft model over a fresh copy of the base with random (nonzero) B; saved to out_dir."""
    peft_model = get_peft_model(hf_model(base_path), LoraConfig(lora_dropout=0.0, **cfg))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    peft_model.save_pretrained(str(out_dir))
    return peft_model.eval()


def make_adapters(base_path: str, folder, names) -> dict[str, str]:
    """make_adapter for each of names (its ADAPTERS settings; seeds 1, 2, ... in order) into
    folder / name -> name -> that folder."""
    dirs = {}
    for seed, name in enumerate(names):
        dirs[name] = str(folder / name)
        make_adapter(base_path, dirs[name], seed + 1, **ADAPTERS[name])
    return dirs


_SETUPS: dict[str, SimpleNamespace] = {}


@pytest.fixture(scope="module")
def setup(checkpoint_dir, tmp_path_factory):
    """family -> base path, peft oracles (None = base model), adapter folders, a generator with all loaded."""

    def get(family: str) -> SimpleNamespace:
        if family not in _SETUPS:
            base = checkpoint_dir(family)
            root = tmp_path_factory.mktemp(f"lora_{family}")
            dirs, oracles = {}, {None: hf_model(base)}
            for seed, (name, cfg) in enumerate(ADAPTERS.items()):
                dirs[name] = str(root / name)
                oracles[name] = make_adapter(base, dirs[name], seed + 1, **cfg)
            gen = TextGenerator.from_pretrained(base, device="cpu", dtype=torch.float32)
            gen.enable_lora(max_loras=len(ADAPTERS) + 1, max_rank=MAX_RANK)
            for name in ADAPTERS:
                gen.load_adapter(name, dirs[name])
            _SETUPS[family] = SimpleNamespace(base=base, root=root, dirs=dirs, oracles=oracles, gen=gen)
        return _SETUPS[family]

    return get


@torch.no_grad()
def oracle_logits(s, adapter, seq) -> torch.Tensor:
    model = s.oracles[None if adapter in (None, "base") else adapter]
    return model(torch.tensor([seq])).logits[0].float()


def check(out: torch.Tensor, expected: list[torch.Tensor], what: str) -> None:
    """out: logits of the step, requests one after another; expected: each request's oracle rows."""
    assert out.shape[0] == sum(e.shape[0] for e in expected)
    start = 0
    for i, e in enumerate(expected):
        err = rel_err(out[start: start + e.shape[0]], e)
        assert err < 1e-4, f"{what}: request {i} rel err {err:.2e}"
        start += e.shape[0]


# requests of the mixed batch: (adapter, prompt length); adapters repeat non-adjacently, base in between
MIXED = [("a2", 5), (None, 4), ("b4rs", 6), ("c8", 3), ("base", 5), ("d_pat", 7), ("a2", 4), ("e_re", 3),
         ("b4rs", 2)]
DECODE_STEPS = [1, 1, 3]  # new tokens per request per decode step: two single-token steps, one multi-token


def run_mixed(s, requests, harness, seed=0):
    """Prefill then DECODE_STEPS on one batch; -> list of (step logits, expected rows per request)."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, 96, (plen + sum(DECODE_STEPS),), generator=g).tolist() for _, plen in requests]
    adapter_ids = [a for a, _ in requests]
    full = [oracle_logits(s, a, seq) for (a, _), seq in zip(requests, seqs)]
    results = []
    lens = [plen for _, plen in requests]
    out = harness.step({i: seqs[i][:lens[i]] for i in range(len(requests))}, is_prefill=True, adapter_ids=adapter_ids)
    results.append((out, [full[i][:lens[i]] for i in range(len(requests))]))
    for q in DECODE_STEPS:
        out = harness.step({i: seqs[i][lens[i]: lens[i] + q] for i in range(len(requests))}, is_prefill=False,
                           adapter_ids=adapter_ids)
        results.append((out, [full[i][lens[i]: lens[i] + q] for i in range(len(requests))]))
        lens = [n + q for n in lens]
    return results


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_batch_matches_peft_prefill_decode_multi_token(setup, family):
    s = setup(family)
    results = run_mixed(s, MIXED, PagedHarness(s.gen, num_blocks=64, block_size=4, seed=1))
    for step, (out, expected) in enumerate(results):
        check(out, expected, f"{family} step {step}")
    # not vacuous: every adapter moves the logits well away from the base model's
    for name in ADAPTERS:
        seq = list(range(1, 9))
        assert rel_err(oracle_logits(s, name, seq), oracle_logits(s, None, seq)) > 1e-2, name


def test_chunked_prefill_mixed_with_decode(setup):
    s = setup("qwen2")
    g = torch.Generator().manual_seed(7)
    seqs = {0: torch.randint(0, 96, (8,), generator=g).tolist(), 1: torch.randint(0, 96, (6,), generator=g).tolist(),
            2: torch.randint(0, 96, (5,), generator=g).tolist()}
    ids = ["b4rs", None, "d_pat"]
    full = [oracle_logits(s, a, seqs[i]) for i, a in enumerate(ids)]
    h = PagedHarness(s.gen, num_blocks=16, block_size=4, seed=2)
    out = h.step({0: seqs[0][:3], 1: seqs[1][:5], 2: seqs[2][:4]}, is_prefill=True, adapter_ids=ids)
    check(out, [full[0][:3], full[1][:5], full[2][:4]], "first chunks")
    # MIXED: request 0 brings its second prompt chunk, requests 1 and 2 one decode token each
    out = h.step({0: seqs[0][3:8], 1: seqs[1][5:6], 2: seqs[2][4:5]}, is_prefill=True, adapter_ids=ids)
    check(out, [full[0][3:8], full[1][5:6], full[2][4:5]], "chunk + decodes")


def test_one_adapter_id_applies_to_the_whole_batch(setup):
    s = setup("llama")
    requests = [("d_pat", 4), ("d_pat", 6), ("d_pat", 3)]
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 96, (n,), generator=g).tolist() for _, n in requests]
    h = PagedHarness(s.gen, num_blocks=16, block_size=4)
    out = h.step(dict(enumerate(seqs)), is_prefill=True, adapter_ids=["d_pat"])
    check(out, [oracle_logits(s, "d_pat", seq) for seq in seqs], "adapter_ids=['d_pat']")


def test_pattern_value_follows_peft_get_pattern_key():
    from peft.utils.other import get_pattern_key

    patterns = {"k_proj": 8, r"layers\.1\.mlp\.down_proj": 2, "model.layers.0.self_attn.q_proj": 6, "proj": 5}
    for key in ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                "model.layers.1.mlp.down_proj", "model.layers.0.mlp.down_proj", "model.layers.0.mlp.up_proj"]:
        assert pattern_value(patterns, key, 4) == patterns.get(get_pattern_key(patterns.keys(), key), 4), key


# -- load / unload / reload ---------------------------------------------------------------------

def small_generator(s, **lora):
    gen = TextGenerator.from_pretrained(s.base, device="cpu", dtype=torch.float32)
    gen.enable_lora(**{"max_loras": 2, "max_rank": MAX_RANK, **lora})
    return gen


def run_prefill(gen, requests, seed=3):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, 96, (n,), generator=g).tolist() for _, n in requests]
    out = PagedHarness(gen, num_blocks=32, block_size=4).step(dict(enumerate(seqs)), is_prefill=True,
                                                               adapter_ids=[a for a, _ in requests])
    return out, seqs


def test_unload_reload_gives_the_same_results_and_reuses_the_freed_slot(setup):
    s = setup("llama")
    gen = small_generator(s)
    assert gen.load_adapter("d_pat", s.dirs["d_pat"]) == 0  # ranks up to 8 in slot 0
    assert gen.load_adapter("c8", s.dirs["c8"]) == 1
    first_reqs = [("d_pat", 5), ("c8", 4), (None, 3)]
    first, seqs = run_prefill(gen, first_reqs)
    check(first, [oracle_logits(s, a, q) for (a, _), q in zip(first_reqs, seqs)], "d_pat + c8")

    gen.unload_adapter("d_pat")
    assert gen.list_adapters() == ["c8"]
    assert gen.load_adapter("a2", s.dirs["a2"]) == 0  # rank 2 in the freed slot: stale rows must be gone
    reqs = [("c8", 4), ("a2", 6), ("a2", 2)]
    out, seqs2 = run_prefill(gen, reqs, seed=4)
    check(out, [oracle_logits(s, a, q) for (a, _), q in zip(reqs, seqs2)], "a2 in the reused slot")
    assert_padded_product_matches(gen.lora_manager, "a2")

    with pytest.raises(LoraStateError) as e:  # both slots used: refused, nothing changes
        gen.load_adapter("e_re", s.dirs["e_re"])
    assert e.value.code == LoraErrorCode.NO_FREE_SLOT and gen.list_adapters() == ["c8", "a2"]

    gen.unload_adapter("a2")
    assert gen.load_adapter("d_pat", s.dirs["d_pat"]) == 0
    again, _ = run_prefill(gen, first_reqs)
    assert torch.equal(again, first)


def assert_padded_product_matches(m: LoraManager, name: str) -> None:
    """The segment-GEMM kernel multiplies whole slots at max_rank: the padding must be exact zeros,
    also in a slot that held an adapter of higher rank before."""
    lb = m.make_batch([name], fake_batch([4]))
    slot = m.slot_of(name)
    R = m.max_rank
    for module in ("qkv", "o", "gate_up", "down"):
        x = torch.randn(4, m.shapes.in_features(module))
        offsets = m.shapes.out_offsets(module)
        for layer in range(m.shapes.num_layers):
            h = x @ m.lora_a[module][layer, slot].T
            full = torch.cat([h[:, i * R:(i + 1) * R] @ b[layer, slot].T for i, b in enumerate(m.lora_b[module])], 1)
            got = lb.apply(layer, module, x, torch.zeros(4, offsets[-1]))
            assert torch.allclose(got, full, rtol=1e-5, atol=1e-6), (module, layer)


def test_preallocated_mapping_buffers_give_the_same_logits_and_refuse_larger_steps(setup):
    s = setup("llama")
    plain, buffered = small_generator(s), small_generator(s, max_num_tokens=16)
    for gen in (plain, buffered):
        gen.load_adapter("b4rs", s.dirs["b4rs"])
        gen.load_adapter("a2", s.dirs["a2"])
    reqs = [("a2", 5), (None, 3), ("b4rs", 4), ("a2", 2)]
    assert torch.equal(run_prefill(plain, reqs)[0], run_prefill(buffered, reqs)[0])
    h = PagedHarness(buffered, num_blocks=32, block_size=4)
    before = [(k.clone(), v.clone()) for k, v in h.kv_cache]
    with pytest.raises(LoraStateError) as e:
        h.step({0: list(range(10)), 1: list(range(9))}, is_prefill=True, adapter_ids=["a2", "b4rs"])
    assert e.value.code == LoraErrorCode.TOO_MANY_TOKENS
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(h.kv_cache, before))


# -- the per-step mapping -------------------------------------------------------------------------

def fake_batch(q_lens):
    q = torch.tensor(q_lens, dtype=torch.int32)
    return SimpleNamespace(q_lens_cpu=q, token_req=torch.repeat_interleave(torch.arange(len(q_lens)), q.long()))


def test_make_batch_groups_tokens_by_slot_once(setup):
    s = setup("llama")
    m = s.gen.lora_manager
    slot = {name: m.slot_of(name) for name in ("a2", "d_pat")}
    lb = m.make_batch(["d_pat", None, "a2", "d_pat"], fake_batch([3, 2, 1, 2]))
    d, a = slot["d_pat"], slot["a2"]
    assert lb.token_slot.tolist() == [d, d, d, -1, -1, a, d, d]
    lo, hi = sorted([(a, [5]), (d, [0, 1, 2, 6, 7])])
    assert lb.perm.tolist() == lo[1] + hi[1]
    assert lb.seg_slots.tolist() == [lo[0], hi[0]]
    assert lb.seg_indptr.tolist() == [0, len(lo[1]), 6]
    assert lb.segments == [(lo[0], 0, len(lo[1])), (hi[0], len(lo[1]), 6)]
    assert not lb.identity and lb.num_lora_tokens == 6 and lb.kernel == "torch"
    one = m.make_batch(["a2"], fake_batch([2, 3]))  # length 1: the whole batch
    assert one.identity and one.token_slot.tolist() == [a] * 5 and one.segments == [(a, 0, 5)]
    base = m.make_batch([None, "base"], fake_batch([2, 1]))
    assert base.segments == [] and base.perm.numel() == 0 and base.token_slot.tolist() == [-1] * 3
    y = torch.randn(3, 7)
    assert torch.equal(base.apply(0, "qkv", torch.randn(3, 5), y.clone()), y)
    with pytest.raises(LoraError) as e:
        m.make_batch(["zzz", None], fake_batch([1, 1]))
    assert e.value.code == LoraErrorCode.NOT_LOADED


@pytest.mark.parametrize("ids, batch, want", [
    (None, 3, None),
    (["a"], 3, ["a", "a", "a"]),
    (("a", None, "base"), 3, ["a", None, None]),
    (["base"], 2, None),  # no request uses an adapter
    ([None, "base"], 2, None),
    ("a", 2, AdapterIdsFault.TYPE),
    ({"a": 1}, 1, AdapterIdsFault.TYPE),
    (["a", 3], 2, AdapterIdsFault.TYPE),
    (["a", "a", "a"], 2, AdapterIdsFault.TOO_LONG),
    ([], 2, AdapterIdsFault.LENGTH),
    (["a", None], 3, AdapterIdsFault.LENGTH),
    (["a", "zz"], 2, AdapterIdsFault.NOT_LOADED),
])
def test_the_adapter_id_rule(ids, batch, want):
    """adapters.ids.resolve_adapter_ids, the one place that says what adapter_ids may be."""
    if isinstance(want, AdapterIdsFault):
        with pytest.raises(AdapterIdsError) as e:
            resolve_adapter_ids(ids, batch, ["a", "b"])
        assert e.value.fault is want and e.value.argument.startswith("adapter_ids")
        assert "expected" in e.value.detail and "got" in e.value.detail
    else:
        assert resolve_adapter_ids(ids, batch, ["a", "b"]) == want


# -- adapter_ids validation leaves the cache untouched ------------------------------------------

@pytest.mark.parametrize("adapter_ids, code", [
    (["a2", "nope"], "TG_ADAPTER_NOT_LOADED"),
    (["a2", "b4rs", "c8"], "TG_ADAPTER_IDS_TOO_LONG"),
    ([], "TG_ADAPTER_IDS_LENGTH"),
])
def test_bad_adapter_ids_leave_kv_cache_bit_for_bit_unchanged(setup, adapter_ids, code):
    s = setup("llama")
    h = PagedHarness(s.gen, num_blocks=16, block_size=4)
    h.step({0: [1, 2, 3], 1: [4, 5]}, is_prefill=True, adapter_ids=["a2", "b4rs"])
    before = [(k.clone(), v.clone()) for k, v in h.kv_cache]
    with pytest.raises(ValueError) as e:
        h.step({0: [6], 1: [7]}, is_prefill=False, adapter_ids=adapter_ids)
    assert e.value.code.value == code and "adapter_ids" in str(e.value)
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(h.kv_cache, before))


def test_length_between_one_and_batch_is_refused_and_unloaded_names_are_not_loaded(setup):
    s = setup("llama")
    gen = small_generator(s)
    gen.load_adapter("a2", s.dirs["a2"])
    h = PagedHarness(gen, num_blocks=16, block_size=4)
    h.step({0: [1, 2], 1: [3], 2: [4, 5]}, is_prefill=True, adapter_ids=["a2"])
    before = [(k.clone(), v.clone()) for k, v in h.kv_cache]
    with pytest.raises(ValueError) as e:
        h.step({0: [6], 1: [7], 2: [8]}, is_prefill=False, adapter_ids=["a2", None])
    assert e.value.code.value == "TG_ADAPTER_IDS_LENGTH"
    gen.unload_adapter("a2")
    with pytest.raises(ValueError) as e:
        h.step({0: [6], 1: [7], 2: [8]}, is_prefill=False, adapter_ids=["a2"])
    assert e.value.code.value == "TG_ADAPTER_NOT_LOADED" and "'a2'" in str(e.value)
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(h.kv_cache, before))


# -- load errors: each with its code; a refused load changes nothing ----------------------------

@pytest.fixture(scope="module")
def bad_adapters(setup, tmp_path_factory):
    """name -> (folder, expected code): adapters the llama base must refuse."""
    s = setup("llama")
    root = tmp_path_factory.mktemp("bad_lora")
    made = {}

    def peft_dir(name, base=None, **cfg):
        make_adapter(base or s.base, root / name, 0, **cfg)
        return str(root / name)

    made["rank16"] = (peft_dir("rank16", r=16, lora_alpha=16, target_modules=["q_proj"]), LoraErrorCode.RANK_TOO_LARGE)
    made["pattern16"] = (peft_dir("pattern16", r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                  rank_pattern={"v_proj": 16}), LoraErrorCode.RANK_TOO_LARGE)
    made["embed"] = (peft_dir("embed", r=2, lora_alpha=2, target_modules=["embed_tokens"]),
                     LoraErrorCode.UNSUPPORTED_MODULE)
    made["lm_head"] = (peft_dir("lm_head", r=2, lora_alpha=2, target_modules=["q_proj", "lm_head"]),
                       LoraErrorCode.UNSUPPORTED_MODULE)
    made["lm_head_regex"] = (peft_dir("lm_head_regex", r=2, lora_alpha=2, target_modules=r".*(q_proj|lm_head)"),
                             LoraErrorCode.UNSUPPORTED_MODULE)
    made["modules_to_save"] = (peft_dir("modules_to_save", r=2, lora_alpha=2, target_modules=["q_proj"],
                                        modules_to_save=["lm_head"]), LoraErrorCode.UNSUPPORTED_MODULE)
    made["dora"] = (peft_dir("dora", r=2, lora_alpha=2, target_modules=["q_proj"], use_dora=True),
                    LoraErrorCode.UNSUPPORTED_CONFIG)
    other = make_checkpoint(root / "other_base", "llama", intermediate_size=96)
    made["other_base"] = (peft_dir("other_base", base=other, r=2, lora_alpha=2, target_modules=["up_proj"]),
                          LoraErrorCode.SHAPE_MISMATCH)
    deeper = make_checkpoint(root / "deeper_base", "llama", num_hidden_layers=3)
    made["deeper_base"] = (peft_dir("deeper_base", base=deeper, r=2, lora_alpha=2, target_modules=["q_proj"]),
                           LoraErrorCode.SHAPE_MISMATCH)
    # a config whose rank disagrees with its weights
    shutil.copytree(s.dirs["a2"], root / "wrong_r")
    cfg_path = root / "wrong_r" / "adapter_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "r": 4}))
    made["wrong_r"] = (str(root / "wrong_r"), LoraErrorCode.SHAPE_MISMATCH)
    made["no_folder"] = (str(root / "does_not_exist"), LoraErrorCode.MISSING_FILE)
    os.makedirs(root / "no_weights")
    shutil.copy(cfg_path, root / "no_weights" / "adapter_config.json")
    made["no_weights"] = (str(root / "no_weights"), LoraErrorCode.MISSING_FILE)
    os.makedirs(root / "no_config")
    shutil.copy(root / "wrong_r" / "adapter_model.safetensors", root / "no_config")
    made["no_config"] = (str(root / "no_config"), LoraErrorCode.MISSING_FILE)
    # non-finite weights and bad scaling numbers (json writes NaN / Infinity, and reads them back)
    from safetensors.torch import load_file, save_file

    def variant(name, cfg_update=None, poison=None):
        shutil.copytree(s.dirs["a2"], root / name)
        if cfg_update:
            path = root / name / "adapter_config.json"
            path.write_text(json.dumps({**json.loads(path.read_text()), **cfg_update}))
        if poison is not None:
            path = str(root / name / "adapter_model.safetensors")
            state = load_file(path)
            key = sorted(k for k in state if "lora_B" in k)[0]
            state[key] = state[key].clone()
            state[key].view(-1)[1] = poison
            save_file(state, path, metadata={"format": "pt"})
        return str(root / name)

    made["nan_weight"] = (variant("nan_weight", poison=float("nan")), LoraErrorCode.NON_FINITE_WEIGHTS)
    made["inf_weight"] = (variant("inf_weight", poison=float("inf")), LoraErrorCode.NON_FINITE_WEIGHTS)
    made["overflow_scaled"] = (variant("overflow_scaled", {"lora_alpha": 1e38}, poison=1e38),
                               LoraErrorCode.NON_FINITE_WEIGHTS)
    for bad_alpha, tag in [(float("nan"), "nan"), (float("inf"), "inf"), (0, "zero"), (-2.0, "negative")]:
        made[f"alpha_{tag}"] = (variant(f"alpha_{tag}", {"lora_alpha": bad_alpha}), LoraErrorCode.INVALID_CONFIG)
    made["r_zero"] = (variant("r_zero", {"r": 0}), LoraErrorCode.INVALID_CONFIG)
    made["r_negative"] = (variant("r_negative", {"r": -2}), LoraErrorCode.INVALID_CONFIG)
    made["rank_pattern_zero"] = (variant("rank_pattern_zero", {"rank_pattern": {"q_proj": 0}}),
                                 LoraErrorCode.INVALID_CONFIG)
    made["alpha_pattern_nan"] = (variant("alpha_pattern_nan", {"alpha_pattern": {"q_proj": float("nan")}}),
                                 LoraErrorCode.INVALID_CONFIG)
    return made


BAD = ["rank16", "pattern16", "embed", "lm_head", "lm_head_regex", "modules_to_save", "dora", "other_base",
       "deeper_base", "wrong_r", "no_folder", "no_weights", "no_config", "nan_weight", "inf_weight",
       "overflow_scaled", "alpha_nan", "alpha_inf", "alpha_zero", "alpha_negative", "r_zero", "r_negative",
       "rank_pattern_zero", "alpha_pattern_nan"]


def snapshot(m: LoraManager):
    return (m.list_adapters(), {k: v.clone() for k, v in m.lora_a.items()},
            {k: [b.clone() for b in v] for k, v in m.lora_b.items()})


def assert_unchanged(m: LoraManager, snap):
    names, a, b = snap
    assert m.list_adapters() == names
    assert all(torch.equal(m.lora_a[k], a[k]) for k in a)
    assert all(torch.equal(x, y) for k in b for x, y in zip(m.lora_b[k], b[k]))


@pytest.mark.parametrize("bad", BAD)
def test_a_refused_adapter_raises_its_code_and_changes_nothing(setup, bad_adapters, bad):
    s = setup("llama")
    gen = small_generator(s)
    gen.load_adapter("a2", s.dirs["a2"])
    snap = snapshot(gen.lora_manager)
    path, code = bad_adapters[bad]
    with pytest.raises(LoraError) as e:
        gen.load_adapter("x", path)
    assert e.value.code == code and str(e.value).startswith(f"[{code.value}] load_adapter(name='x'): expected")
    assert_unchanged(gen.lora_manager, snap)


def test_rank_too_large_message(setup, bad_adapters):
    s = setup("llama")
    with pytest.raises(LoraError, match=r"^\[LORA_RANK_TOO_LARGE\] load_adapter\(name='x'\): "
                                        r"expected rank <= max_rank=8, got 16$"):
        small_generator(s).load_adapter("x", bad_adapters["rank16"][0])


def test_name_and_state_errors(setup):
    s = setup("llama")
    gen = TextGenerator.from_pretrained(s.base, device="cpu", dtype=torch.float32)
    assert gen.list_adapters() == []
    with pytest.raises(LoraStateError) as e:
        gen.load_adapter("a2", s.dirs["a2"])
    assert e.value.code == LoraErrorCode.NOT_ENABLED
    with pytest.raises(LoraError) as e:
        gen.unload_adapter("a2")
    assert e.value.code == LoraErrorCode.NOT_LOADED
    gen.enable_lora(max_loras=2, max_rank=MAX_RANK)
    with pytest.raises(LoraStateError) as e:
        gen.enable_lora()
    assert e.value.code == LoraErrorCode.ALREADY_ENABLED
    gen.load_adapter("a2", s.dirs["a2"])
    snap = snapshot(gen.lora_manager)
    for name, path, code in [("a2", s.dirs["c8"], LoraErrorCode.DUPLICATE_NAME),
                             ("base", s.dirs["c8"], LoraErrorCode.INVALID_NAME),
                             ("", s.dirs["c8"], LoraErrorCode.INVALID_NAME)]:
        with pytest.raises(LoraError) as e:
            gen.load_adapter(name, path)
        assert e.value.code == code, name
    for name, code in [("base", LoraErrorCode.UNLOAD_BASE), (None, LoraErrorCode.UNLOAD_BASE),
                       ("c8", LoraErrorCode.NOT_LOADED)]:
        with pytest.raises(LoraError) as e:
            gen.unload_adapter(name)
        assert e.value.code == code and f"unload_adapter(name={name!r})" in str(e.value)
    assert_unchanged(gen.lora_manager, snap)


def test_enable_lora_refuses_oversized_stacks_and_stays_disabled(setup):
    s = setup("llama")
    gen = TextGenerator.from_pretrained(s.base, device="cpu", dtype=torch.float32)
    for kw, code in [(dict(max_rank=2**20), LoraErrorCode.RANK_TOO_LARGE),
                     (dict(max_loras=2**40, max_rank=8), LoraErrorCode.INSUFFICIENT_MEMORY)]:
        with pytest.raises((LoraError, LoraStateError)) as e:
            gen.enable_lora(**kw)
        assert e.value.code == code and gen.lora_manager is None
    gen.enable_lora(max_loras=1, max_rank=MAX_RANK)
    gen.load_adapter("a2", s.dirs["a2"])


def test_manager_arguments_are_checked():
    kw = dict(num_layers=2, hidden_size=8, q_size=8, kv_size=4, intermediate_size=16, device="cpu",
              dtype=torch.float32)
    for bad in [dict(max_rank=0), dict(max_loras=-1), dict(hidden_size=8.0), dict(max_num_tokens=0),
                dict(kernel="triton"), dict(kernel="flashinfer"), dict(overlap=1)]:
        with pytest.raises(LoraError) as e:
            LoraManager(**{**kw, **bad})
        assert e.value.code == LoraErrorCode.INVALID_ARGUMENT, bad
    # sizes are checked before anything is allocated: a rank above hidden_size, or stacks larger
    # than the free memory (here 2**40 slots: petabytes), are refused at once
    with pytest.raises(LoraError) as e:
        LoraManager(**kw, max_rank=2**20)
    assert e.value.code == LoraErrorCode.RANK_TOO_LARGE and "hidden_size=8" in str(e.value)
    with pytest.raises(LoraStateError) as e:
        LoraManager(**kw, max_loras=2**40, max_rank=4)
    assert e.value.code == LoraErrorCode.INSUFFICIENT_MEMORY and "GiB" in str(e.value)
    with pytest.raises(LoraStateError) as e:  # the per-step mapping buffers count too
        LoraManager(**kw, max_loras=1, max_rank=4, max_num_tokens=2**50)
    assert e.value.code == LoraErrorCode.INSUFFICIENT_MEMORY
    m = LoraManager(**kw, max_loras=3, max_rank=4)
    assert m.lora_a["qkv"].shape == (2, 3, 12, 8) and [b.shape[2] for b in m.lora_b["qkv"]] == [8, 4, 4]
    assert m.lora_a["down"].shape == (2, 3, 4, 16) and m.lora_b["gate_up"][1].shape == (2, 3, 16, 4)
    assert not m.overlap and m.side is None  # a side stream only for the triton kernel on CUDA


# -- CUDA: FlashInfer segment GEMM against the torch kernel ---------------------------------------

@pytest.mark.cuda
def test_segment_gemm_matches_torch_kernel(setup):
    pytest.importorskip("flashinfer")
    s = setup("llama")
    cfg = s.gen.config
    m = LoraManager(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, q_size=cfg.num_heads * cfg.head_dim,
                    kv_size=cfg.num_kv_heads * cfg.head_dim, intermediate_size=cfg.intermediate_size,
                    max_loras=len(ADAPTERS), max_rank=MAX_RANK, device="cuda", dtype=torch.bfloat16,
                    kernel="flashinfer")
    for name in ADAPTERS:
        m.load_adapter(name, s.dirs[name])
    batch = fake_batch([3, 1, 2, 5, 1, 4])
    batch.token_req = batch.token_req.cuda()
    for ids in (["d_pat", None, "a2", "d_pat", "b4rs", "e_re"], ["c8"]):
        fi = m.make_batch(ids, batch)
        ref = dataclasses.replace(fi, kernel="torch")
        for module in ("qkv", "o", "gate_up", "down"):
            T = 16
            x = torch.randn(T, m.shapes.in_features(module), device="cuda", dtype=torch.bfloat16)
            y = torch.randn(T, sum(m.shapes.out_features(module)), device="cuda", dtype=torch.bfloat16)
            for layer in range(cfg.num_layers):
                got = fi.apply(layer, module, x, y.clone())
                want = ref.apply(layer, module, x, y.clone())
                assert rel_err(got - y, want - y) < 2e-2, (ids, module, layer)


@pytest.mark.cuda
def test_forward_tensor_on_cuda_flashinfer_vs_torch_kernel(checkpoint_dir, tmp_path):
    """head_dim 64: FlashInfer's attention kernels need a multiple of 64 (the tiny CPU base has 16)."""
    pytest.importorskip("flashinfer")
    base = checkpoint_dir("llama", hidden_size=256, intermediate_size=512, head_dim=64)
    dirs = {}
    for seed, (name, cfg) in enumerate(ADAPTERS.items()):
        dirs[name] = str(tmp_path / name)
        make_adapter(base, dirs[name], seed + 1, **cfg)
    outs = []
    for kernel in ("flashinfer", "torch"):
        gen = TextGenerator.from_pretrained(base, device="cuda", dtype=torch.bfloat16)
        gen.enable_lora(max_loras=len(ADAPTERS), max_rank=MAX_RANK, kernel=kernel)
        for name in ADAPTERS:
            gen.load_adapter(name, dirs[name])
        outs.append(run_prefill(gen, MIXED)[0])
    assert rel_err(outs[0], outs[1]) < 2e-2


# the engine with adapters ------------------------------------------------------------------------

@torch.no_grad()
def peft_greedy(s, adapter, prompt, n) -> list[int]:
    """Greedy continuation by the peft oracle (full forward per token: tiny model)."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(oracle_logits(s, adapter, seq)[-1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
def test_engine_serves_a_mix_of_adapters_like_peft(setup, run_ahead):
    """LLMEngine with per-request adapters (the same prompt under several adapters included: the
    prefix cache keys by adapter) gives each request its own peft model's greedy output."""
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    s = setup("llama")
    shared = [5, 9, 2, 7, 7, 1, 3, 8, 4]
    reqs = [(shared, "a2"), (shared, "c8"), (shared, None), ([4, 4, 6], "b4rs"), (shared + [11], "a2"),
            ([1, 2, 3, 4, 5], "e_re")]
    engine = LLMEngine(s.gen, num_blocks=64, block_size=4, max_num_batched_tokens=12, async_scheduling=run_ahead)
    outs = engine.generate([p for p, _ in reqs], SamplingParams(temperature=0.0, max_new_tokens=6),
                           adapters=[a for _, a in reqs], use_tqdm=False)
    for (prompt, adapter), out in zip(reqs, outs):
        assert out.token_ids == peft_greedy(s, adapter, prompt, 6), adapter
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
def test_unloading_an_adapter_mid_run_fails_only_its_requests(setup, run_ahead):
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    s = setup("llama")
    gen = small_generator(s, max_loras=2, max_rank=MAX_RANK)
    gen.load_adapter("a2", s.dirs["a2"])
    engine = LLMEngine(gen, num_blocks=64, block_size=4, async_scheduling=run_ahead)
    p = SamplingParams(temperature=0.0, max_new_tokens=8)
    doomed = engine.add_request([3, 1, 4], p, adapter="a2")
    kept = engine.add_request([2, 7, 1, 8], p)
    finals = {}
    for _ in range(3):
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    gen.unload_adapter("a2")
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals[doomed].finish_reason == "error" and "no longer loaded" in finals[doomed].error
    assert finals[kept].finish_reason == "length" and finals[kept].token_ids == peft_greedy(s, None, [2, 7, 1, 8], 8)
    assert engine.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
def test_reloading_a_name_with_other_weights_never_serves_the_old_cached_kv(setup, run_ahead):
    """unload_adapter("sql") + load_adapter("sql", other weights): the prefix cache is keyed by the
    adapter's load, not its name, so the same prompt recomputes its K/V and the output is the new
    weights' peft greedy output; the blocks cached under the old load leave the cache."""
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    s = setup("llama")
    gen = small_generator(s, max_loras=2, max_rank=MAX_RANK)
    gen.load_adapter("sql", s.dirs["a2"])
    engine = LLMEngine(gen, num_blocks=64, block_size=4, async_scheduling=run_ahead)
    p = SamplingParams(temperature=0.0, max_new_tokens=5)
    prompt = [5, 9, 2, 7, 7, 1, 3, 8, 4, 6]
    first = engine.generate([prompt], p, adapters="sql", use_tqdm=False)[0]
    assert first.token_ids == peft_greedy(s, "a2", prompt, 5)
    again = engine.generate([prompt], p, adapters="sql", use_tqdm=False)[0]
    assert again.num_cached_tokens == 8  # same weights: the cache serves the prompt's full blocks
    old_key = gen.adapter_cache_key("sql")
    gen.unload_adapter("sql")
    gen.load_adapter("sql", s.dirs["c8"])
    assert gen.adapter_cache_key("sql") != old_key
    out = engine.generate([prompt], p, adapters="sql", use_tqdm=False)[0]
    assert out.num_cached_tokens == 0 and out.token_ids == peft_greedy(s, "c8", prompt, 5)
    assert all(key[2] != old_key for key in engine.block_manager._cache)  # dropped, not just unreachable
    assert engine.block_manager.num_used_blocks == 0


def test_a_request_running_when_its_adapter_is_reloaded_fails_alone(setup):
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams

    s = setup("llama")
    gen = small_generator(s, max_loras=2, max_rank=MAX_RANK)
    gen.load_adapter("sql", s.dirs["a2"])
    engine = LLMEngine(gen, num_blocks=64, block_size=4, async_scheduling=False)
    p = SamplingParams(temperature=0.0, max_new_tokens=8)
    doomed = engine.add_request([3, 1, 4], p, adapter="sql")
    kept = engine.add_request([2, 7, 1, 8], p)
    finals = {}
    for _ in range(3):
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    gen.unload_adapter("sql")
    gen.load_adapter("sql", s.dirs["c8"])
    late = engine.add_request([3, 1, 4], p, adapter="sql")  # takes the new load's key
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals[doomed].finish_reason == "error" and "reloaded" in finals[doomed].error
    assert finals[kept].token_ids == peft_greedy(s, None, [2, 7, 1, 8], 8)
    assert finals[late].token_ids == peft_greedy(s, "c8", [3, 1, 4], 8)
    assert engine.block_manager.num_used_blocks == 0
