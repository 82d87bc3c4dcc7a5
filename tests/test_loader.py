"""Checkpoint loading: shards with an index, tied embeddings, dtype casting, and clear errors."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import PagedHarness, hf_model, make_checkpoint, rel_err
from model_wrapper import ModelErrorCode, ModelLoadError
from text_generator import TextGenerator


def _prefill_logits(gen, tokens):
    return PagedHarness(gen, 16, 8).step({0: tokens}, is_prefill=True)


def test_sharded_checkpoint_with_index(tmp_path):
    path = make_checkpoint(tmp_path / "src", "llama")
    model = hf_model(path)
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
    files = os.listdir(tmp_path / "sharded")
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
    gen = TextGenerator.from_pretrained(str(tmp_path / "sharded"), device="cpu")
    toks = [3, 1, 4, 1, 5, 9, 2, 6]
    assert rel_err(_prefill_logits(gen, toks), model(torch.tensor([toks])).logits[0]) < 1e-4


def test_loading_shards_shows_a_progress_bar_that_can_be_turned_off(tmp_path, capsys):
    path = make_checkpoint(tmp_path / "src", "llama")
    hf_model(path).save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
    capsys.readouterr()
    TextGenerator.from_pretrained(str(tmp_path / "sharded"), device="cpu")
    assert "loading shards" in capsys.readouterr().err
    TextGenerator.from_pretrained(str(tmp_path / "sharded"), device="cpu", progress=False)
    assert "loading shards" not in capsys.readouterr().err


def test_tied_embeddings_share_one_tensor(checkpoint_dir):
    path = checkpoint_dir("qwen2")  # made with tie_word_embeddings=True
    assert "lm_head.weight" not in load_file(os.path.join(path, "model.safetensors"))
    gen = TextGenerator.from_pretrained(path, device="cpu")
    m = gen.model_wrapper.model
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    toks = [7, 7, 8, 1]
    assert rel_err(_prefill_logits(gen, toks), hf_model(path)(torch.tensor([toks])).logits[0]) < 1e-4


def test_dtype_casting_and_default(checkpoint_dir, tmp_path):
    path = checkpoint_dir("llama")
    assert TextGenerator.from_pretrained(path, device="cpu").dtype == torch.float32  # checkpoint's own
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype="bfloat16")
    assert gen.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in gen.model_wrapper.model.parameters())
    bf16_path = make_checkpoint(tmp_path / "bf16", "llama", dtype=torch.bfloat16)
    assert TextGenerator.from_pretrained(bf16_path, device="cpu").dtype == torch.bfloat16


def _copy(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def _expect(code, fn):
    with pytest.raises(ModelLoadError) as info:
        fn()
    assert info.value.code == code and str(info.value).startswith(f"[{code.value}]")
    return str(info.value)


def test_unsupported_architecture(checkpoint_dir, tmp_path):
    path = _copy(checkpoint_dir("llama"), tmp_path / "x")
    cfg = json.load(open(os.path.join(path, "config.json")))
    cfg["architectures"] = ["GPT2LMHeadModel"]
    json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    msg = _expect(ModelErrorCode.UNSUPPORTED_ARCHITECTURE, lambda: TextGenerator.from_pretrained(path, device="cpu"))
    assert "GPT2LMHeadModel" in msg and "LlamaForCausalLM" in msg


def test_missing_and_misshapen_tensors(checkpoint_dir, tmp_path):
    src = checkpoint_dir("llama")
    tensors = load_file(os.path.join(src, "model.safetensors"))
    missing = _copy(src, tmp_path / "missing")
    save_file({k: v for k, v in tensors.items() if "layers.1.self_attn.k_proj" not in k},
              os.path.join(missing, "model.safetensors"), metadata={"format": "pt"})
    msg = _expect(ModelErrorCode.MISSING_TENSOR, lambda: TextGenerator.from_pretrained(missing, device="cpu"))
    assert "model.layers.1.self_attn.k_proj.weight" in msg

    bad = _copy(src, tmp_path / "bad")
    t = dict(tensors)
    t["model.layers.0.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(t, os.path.join(bad, "model.safetensors"), metadata={"format": "pt"})
    msg = _expect(ModelErrorCode.MISSHAPEN_TENSOR, lambda: TextGenerator.from_pretrained(bad, device="cpu"))
    assert "model.layers.0.mlp.down_proj.weight" in msg and "(64, 112)" in msg and "(3, 3)" in msg


def test_missing_files(checkpoint_dir, tmp_path):
    _expect(ModelErrorCode.MISSING_FILE, lambda: TextGenerator.from_pretrained(str(tmp_path / "nope"), device="cpu"))
    no_cfg = _copy(checkpoint_dir("llama"), tmp_path / "nocfg")
    os.remove(os.path.join(no_cfg, "config.json"))
    assert "config.json" in _expect(ModelErrorCode.MISSING_FILE, lambda: TextGenerator.from_pretrained(no_cfg, device="cpu"))
    no_w = _copy(checkpoint_dir("llama"), tmp_path / "now")
    os.remove(os.path.join(no_w, "model.safetensors"))
    _expect(ModelErrorCode.MISSING_FILE, lambda: TextGenerator.from_pretrained(no_w, device="cpu"))
    # an index naming a shard that is not there
    json.dump({"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}},
              open(os.path.join(no_w, "model.safetensors.index.json"), "w"))
    msg = _expect(ModelErrorCode.MISSING_FILE, lambda: TextGenerator.from_pretrained(no_w, device="cpu"))
    assert "model-00002-of-00002.safetensors" in msg


def test_pickle_only_checkpoint_gets_a_conversion_hint(checkpoint_dir, tmp_path):
    old = _copy(checkpoint_dir("llama"), tmp_path / "bin")  # an old-style checkpoint: pickled weights only
    torch.save(load_file(os.path.join(old, "model.safetensors")), os.path.join(old, "pytorch_model.bin"))
    os.remove(os.path.join(old, "model.safetensors"))
    msg = _expect(ModelErrorCode.MISSING_FILE, lambda: TextGenerator.from_pretrained(old, device="cpu"))
    assert "pytorch_model" in msg and "safe_serialization=True" in msg


def test_a_hub_id_is_not_fetched():
    msg = _expect(ModelErrorCode.MISSING_FILE,
                  lambda: TextGenerator.from_pretrained("meta-llama/Llama-3.1-8B", device="cpu"))
    assert "local folder" in msg


def test_unsupported_rope_and_activation(checkpoint_dir, tmp_path):
    for field, value, code in (("rope_parameters", {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4},
                                ModelErrorCode.UNSUPPORTED_FEATURE),
                               ("hidden_act", "gelu", ModelErrorCode.UNSUPPORTED_FEATURE)):
        path = _copy(checkpoint_dir("llama"), tmp_path / field)
        cfg = json.load(open(os.path.join(path, "config.json")))
        cfg[field] = value
        json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
        _expect(code, lambda: TextGenerator.from_pretrained(path, device="cpu"))


def test_kv_cache_allocation_layout(checkpoint_dir):
    gen = TextGenerator.from_pretrained(checkpoint_dir("qwen3"), device="cpu")
    kv = gen.allocate_kv_cache(num_blocks=5, block_size=16)
    assert len(kv) == gen.config.num_layers
    for k, v in kv:
        assert k.shape == v.shape == (5, 16, 2, 32) and k.dtype == gen.dtype
    spec = gen.kv_cache_spec
    assert spec.bytes_per_token == 2 * 2 * 2 * 32 * 4
