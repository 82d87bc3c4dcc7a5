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


def test_path_must_be_a_folder_name(tmp_path):
    for bad in (None, 3, b"folder", str(tmp_path / "file.txt")):
        open(tmp_path / "file.txt", "w").close()
        assert "local folder" in _expect(ModelErrorCode.MISSING_FILE, lambda: _load(bad))


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


# -- refusals: everything that cannot be served faithfully is a coded error before allocation ---

_DELETE = object()


def _variant(src, dst, config=None, tensors=None) -> str:
    """A copy of checkpoint src with config.json fields replaced (_DELETE removes one) and/or
    model.safetensors rewritten by tensors(dict of tensors) -> dict of tensors."""
    path = _copy(src, dst)
    if config is not None:
        cfg = json.load(open(os.path.join(path, "config.json")))
        for k, v in config.items():
            cfg.pop(k) if v is _DELETE else cfg.__setitem__(k, v)
        json.dump(cfg, open(os.path.join(path, "config.json"), "w"))
    if tensors is not None:
        file = os.path.join(path, "model.safetensors")
        save_file(tensors(load_file(file)), file, metadata={"format": "pt"})
    return path


def _load(path, **kw):
    return TextGenerator.from_pretrained(path, device="cpu", **kw)


def test_quantized_checkpoint_refused(checkpoint_dir, tmp_path):
    # a DeepSeek-style block-FP8 checkpoint: e4m3 weights, one float32 scale per 128 x 128 block
    # (served: tests/model_wrapper/test_fp8_checkpoint.py; here only what is refused)
    def to_fp8(t):
        out = {}
        for k, v in t.items():
            if k.endswith("proj.weight"):
                out[k] = v.to(torch.float8_e4m3fn)
                out[k + "_scale_inv"] = torch.ones(1, 1)
            else:
                out[k] = v
        return out

    # any other method, and a quantization_config of the wrong shape, are refused the same way
    for i, q in enumerate(({"quant_method": "awq", "bits": 4}, {"bits": 4}, "gptq")):
        path = _variant(checkpoint_dir("llama"), tmp_path / f"q{i}", config={"quantization_config": q})
        _expect(ModelErrorCode.UNSUPPORTED_QUANTIZATION, lambda: _load(path))
    path = _variant(checkpoint_dir("llama"), tmp_path / "ct", config={"compression_config": {
        "quant_method": "compressed-tensors", "format": "float-quantized"}})
    assert "config_groups" in _expect(ModelErrorCode.UNSUPPORTED_QUANTIZATION, lambda: _load(path))
    # the same FP8 tensors without the config: refused by dtype, not read as numbers
    path = _variant(checkpoint_dir("llama"), tmp_path / "fp8_nocfg", tensors=to_fp8)
    msg = _expect(ModelErrorCode.UNSUPPORTED_DTYPE, lambda: _load(path))
    assert "F8_E4M3" in msg


def test_layer_count_must_match_the_checkpoint(checkpoint_dir, tmp_path):
    src = checkpoint_dir("llama")  # 2 layers
    msg = _expect(ModelErrorCode.UNEXPECTED_TENSOR,
                  lambda: _load(_variant(src, tmp_path / "one", config={"num_hidden_layers": 1})))
    assert "num_hidden_layers=1" in msg and "model.layers.1." in msg
    msg = _expect(ModelErrorCode.MISSING_TENSOR,
                  lambda: _load(_variant(src, tmp_path / "three", config={"num_hidden_layers": 3})))
    assert "num_hidden_layers=3" in msg
    for bad in (0, -1, 2.0, True, "2"):
        path = _variant(src, tmp_path / f"bad{bad!r}", config={"num_hidden_layers": bad})
        assert "num_hidden_layers" in _expect(ModelErrorCode.BAD_CONFIG, lambda: _load(path))


def test_every_checkpoint_tensor_is_used_once(checkpoint_dir, tmp_path):
    src = checkpoint_dir("llama")
    extra = _variant(src, tmp_path / "extra", tensors=lambda t: {**t, "model.layers.0.mlp.extra.weight": torch.ones(2),
                                                                "vision_tower.proj.weight": torch.ones(2)})
    msg = _expect(ModelErrorCode.UNEXPECTED_TENSOR, lambda: _load(extra))
    assert "model.layers.0.mlp.extra.weight" in msg and "vision_tower.proj.weight" in msg

    # one tensor in two shards (and in the index once)
    model = hf_model(src)
    sharded = tmp_path / "sharded"
    model.save_pretrained(str(sharded), max_shard_size="20KB")
    index = json.load(open(sharded / "model.safetensors.index.json"))
    name, first = "model.norm.weight", index["weight_map"]["model.norm.weight"]
    other = next(f for f in sorted(set(index["weight_map"].values())) if f != first)
    t = load_file(str(sharded / other))
    t[name] = load_file(str(sharded / first))[name]
    save_file(t, str(sharded / other), metadata={"format": "pt"})
    msg = _expect(ModelErrorCode.DUPLICATE_TENSOR, lambda: _load(str(sharded)))
    assert name in msg and first in msg and other in msg

    # a rotary buffer saved by old exports is recomputed from config.json, so it may be present
    rotary = _variant(src, tmp_path / "rotary", tensors=lambda t: {
        **t, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    toks = [3, 1, 4, 1]
    assert rel_err(_prefill_logits(_load(rotary), toks), model(torch.tensor([toks])).logits[0]) < 1e-4


def test_tied_embeddings_with_a_saved_lm_head(checkpoint_dir, tmp_path):
    src = checkpoint_dir("qwen2")  # tie_word_embeddings=True, lm_head not saved
    same = _variant(src, tmp_path / "same", tensors=lambda t: {**t, "lm_head.weight": t["model.embed_tokens.weight"].clone()})
    toks = [7, 7, 8, 1]
    assert rel_err(_prefill_logits(_load(same), toks), hf_model(same)(torch.tensor([toks])).logits[0]) < 1e-4
    # transformers unties a different copy; serving it tied would be wrong: refused
    other = _variant(src, tmp_path / "other", tensors=lambda t: {
        **t, "lm_head.weight": torch.randn_like(t["model.embed_tokens.weight"])})
    msg = _expect(ModelErrorCode.UNEXPECTED_TENSOR, lambda: _load(other))
    assert "lm_head.weight" in msg and "tie_word_embeddings" in msg


@pytest.mark.parametrize("field,value", [
    ("num_hidden_layers", 10**6), ("vocab_size", 10**8), ("intermediate_size", 10**7), ("hidden_size", 2**40),
    ("vocab_size", 2**60), ("num_attention_heads", 2), ("num_key_value_heads", 4), ("head_dim", 32),
])
def test_config_sizes_checked_against_headers_before_allocating(checkpoint_dir, tmp_path, field, value):
    # sizes like 2**60 could not be allocated at all: an error other than ModelLoadError (or a
    # hang) means the model was built before the headers were compared
    path = _variant(checkpoint_dir("llama"), tmp_path / "x", config={field: value})
    code = ModelErrorCode.MISSING_TENSOR if field == "num_hidden_layers" else ModelErrorCode.MISSHAPEN_TENSOR
    _expect(code, lambda: _load(path))


@pytest.mark.parametrize("field,value,code", [
    ("num_attention_heads", 0, "BAD_CONFIG"), ("num_attention_heads", "four", "BAD_CONFIG"),
    ("num_key_value_heads", 0, "BAD_CONFIG"), ("num_key_value_heads", 3, "BAD_CONFIG"),
    ("hidden_size", None, "BAD_CONFIG"), ("hidden_size", [64], "BAD_CONFIG"), ("vocab_size", 0, "BAD_CONFIG"),
    ("vocab_size", _DELETE, "BAD_CONFIG"), ("intermediate_size", 1.5, "BAD_CONFIG"),
    ("max_position_embeddings", 0, "BAD_CONFIG"), ("max_position_embeddings", -5, "BAD_CONFIG"),
    ("max_position_embeddings", 2**40, "BAD_CONFIG"),
    ("rms_norm_eps", -1e-6, "BAD_CONFIG"), ("rms_norm_eps", "1e-5", "BAD_CONFIG"), ("rms_norm_eps", float("inf"), "BAD_CONFIG"),
    ("rms_norm_eps", float("nan"), "BAD_CONFIG"), ("rope_theta", float("inf"), "BAD_CONFIG"),
    ("rope_theta", 0, "BAD_CONFIG"), ("rope_theta", -1.0, "BAD_CONFIG"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 0.0}, "BAD_CONFIG"),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e4, "factor": 0}, "BAD_CONFIG"),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 2.0,
                         "high_freq_factor": 2.0, "original_max_position_embeddings": 64}, "BAD_CONFIG"),
    ("rope_parameters", "default", "BAD_CONFIG"),
    ("sliding_window", -4, "BAD_CONFIG"), ("sliding_window", "6", "BAD_CONFIG"),
    ("head_dim", 15, "BAD_CONFIG"), ("head_dim", 0, "BAD_CONFIG"),
    ("tie_word_embeddings", "false", "BAD_CONFIG"), ("attention_bias", 1, "BAD_CONFIG"),
    ("layer_types", ["full_attention"], "BAD_CONFIG"),
    ("architectures", "LlamaForCausalLM", "UNSUPPORTED_ARCHITECTURE"), ("architectures", [7], "UNSUPPORTED_ARCHITECTURE"),
    ("dtype", "int32", "UNSUPPORTED_DTYPE"), ("dtype", 32, "UNSUPPORTED_DTYPE"),
])
def test_impossible_config_values(checkpoint_dir, tmp_path, field, value, code):
    src = checkpoint_dir("llama")
    if field == "rope_theta":  # a 4.x-style top-level rope_theta (no rope_parameters)
        path = _variant(src, tmp_path / "x", config={"rope_parameters": _DELETE, field: value})
    else:
        path = _variant(src, tmp_path / "x", config={field: value})
    msg = _expect(ModelErrorCode[code], lambda: _load(path))
    if code == "BAD_CONFIG" and field != "rope_parameters":
        assert field in msg


def test_hidden_size_not_divisible_by_heads(checkpoint_dir, tmp_path):
    path = _variant(checkpoint_dir("llama"), tmp_path / "x", config={"num_attention_heads": 5, "head_dim": _DELETE,
                                                                     "num_key_value_heads": 5})
    msg = _expect(ModelErrorCode.BAD_CONFIG, lambda: _load(path))
    assert "hidden_size (64)" in msg and "num_attention_heads (5)" in msg


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.float8_e4m3fn, "int8", 16])
def test_requested_dtype_must_be_a_serving_float(checkpoint_dir, dtype):
    msg = _expect(ModelErrorCode.UNSUPPORTED_DTYPE, lambda: _load(checkpoint_dir("llama"), dtype=dtype))
    assert "dtype" in msg and str(dtype) in msg


def _write(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)


def test_corrupt_files(checkpoint_dir, tmp_path):
    src = checkpoint_dir("llama")
    blob = open(os.path.join(src, "model.safetensors"), "rb").read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    name = "model.layers.1.mlp.down_proj.weight"

    def with_header(h) -> bytes:
        text = json.dumps(h).encode()
        return len(text).to_bytes(8, "little") + text + blob[8 + n :]

    lie = json.loads(json.dumps(header))
    lie[name]["data_offsets"][1] += 10**9  # past the end of the file
    shape_lie = json.loads(json.dumps(header))
    shape_lie[name]["shape"] = [64, 10**6]
    overlap = json.loads(json.dumps(header))
    overlap[name]["data_offsets"] = overlap["model.layers.0.mlp.down_proj.weight"]["data_offsets"]
    cases = {
        "truncated": blob[: len(blob) // 2],
        "tiny": blob[:5],
        "empty": b"",
        "header_length_lies": (10**12).to_bytes(8, "little") + blob[8:],
        "header_not_json": len(b"{nope").to_bytes(8, "little") + b"{nope" + blob[8 + n :],
        "header_not_object": with_header([1, 2]),
        "offsets_past_eof": with_header(lie),
        "shape_lies": with_header(shape_lie),
        "overlapping": with_header(overlap),
        "unknown_dtype": with_header({**header, name: {**header[name], "dtype": "F7"}}),
    }
    for case, data in cases.items():
        path = _copy(src, tmp_path / case)
        _write(os.path.join(path, "model.safetensors"), data)
        msg = _expect(ModelErrorCode.CORRUPT_FILE, lambda: _load(path))
        assert "model.safetensors" in msg, case
    # a name twice in one header: json would keep the last entry silently
    text = json.dumps(header)
    dup = text[:-1] + ", " + json.dumps({name: header[name]})[1:]
    dup = dup.encode()
    path = _copy(src, tmp_path / "dup_key")
    _write(os.path.join(path, "model.safetensors"), len(dup).to_bytes(8, "little") + dup + blob[8 + n :])
    assert "appears twice" in _expect(ModelErrorCode.CORRUPT_FILE, lambda: _load(path))
    for case, text in {"cfg_not_json": "{ nope", "cfg_array": "[1, 2]",
                       "cfg_binary": "\udcff"}.items():
        path = _copy(src, tmp_path / case)
        _write(os.path.join(path, "config.json"), text.encode("utf-8", "surrogateescape"))
        assert "config.json" in _expect(ModelErrorCode.CORRUPT_FILE, lambda: _load(path))


def _sharded(src, dst) -> str:
    hf_model(src).save_pretrained(str(dst), max_shard_size="20KB")
    return str(dst)


def test_bad_index(checkpoint_dir, tmp_path):
    base = _sharded(checkpoint_dir("llama"), tmp_path / "base")
    index = json.load(open(os.path.join(base, "model.safetensors.index.json")))
    wm = index["weight_map"]
    moved = dict(wm)
    moved["model.norm.weight"] = next(f for f in sorted(set(wm.values())) if f != wm["model.norm.weight"])
    dropped = {k: v for k, v in wm.items() if k != "model.norm.weight"}
    cases = {"no_weight_map": ({"metadata": {}}, ModelErrorCode.BAD_INDEX),
             "list_weight_map": ({"weight_map": list(wm.items())}, ModelErrorCode.BAD_INDEX),
             "int_file": ({"weight_map": {**wm, "model.norm.weight": 3}}, ModelErrorCode.BAD_INDEX),
             "moved": ({"weight_map": moved}, ModelErrorCode.BAD_INDEX),
             "dropped": ({"weight_map": dropped}, ModelErrorCode.BAD_INDEX),
             "not_json": ("{", ModelErrorCode.CORRUPT_FILE),
             "twice": (json.dumps({"weight_map": wm})[:-2] + ', "model.norm.weight": "x.safetensors"}}',
                       ModelErrorCode.CORRUPT_FILE),
             "array": ([wm], ModelErrorCode.CORRUPT_FILE)}
    for case, (content, code) in cases.items():
        path = _copy(base, tmp_path / case)
        text = content if isinstance(content, str) else json.dumps(content)
        _write(os.path.join(path, "model.safetensors.index.json"), text.encode())
        assert "model.safetensors.index.json" in _expect(code, lambda: _load(path)), case


def test_index_cannot_name_files_outside_the_folder(checkpoint_dir, tmp_path):
    src = checkpoint_dir("llama")
    # a valid shard just outside the folder: reading it would "work", which is the danger
    shutil.copy(os.path.join(src, "model.safetensors"), tmp_path / "outside.safetensors")
    names = list(load_file(os.path.join(src, "model.safetensors")))
    for case, target in {"dotdot": "../outside.safetensors", "absolute": str(tmp_path / "outside.safetensors"),
                         "symlink": "link.safetensors", "dir_symlink": "sub/outside.safetensors"}.items():
        path = _copy(src, tmp_path / case)
        os.remove(os.path.join(path, "model.safetensors"))
        if case == "symlink":
            os.symlink(tmp_path / "outside.safetensors", os.path.join(path, "link.safetensors"))
        if case == "dir_symlink":
            os.symlink(tmp_path, os.path.join(path, "sub"))
        json.dump({"weight_map": {n: target for n in names}}, open(os.path.join(path, "model.safetensors.index.json"), "w"))
        msg = _expect(ModelErrorCode.UNSAFE_PATH, lambda: _load(path))
        assert target in msg, case
    # a lone model.safetensors that is a link out of the folder, and config.json likewise
    for f in ("model.safetensors", "config.json"):
        path = _copy(src, tmp_path / f"lone_{f}")
        shutil.move(os.path.join(path, f), tmp_path / f"moved_{f}")
        os.symlink(tmp_path / f"moved_{f}", os.path.join(path, f))
        _expect(ModelErrorCode.UNSAFE_PATH, lambda: _load(path))
    # a FIFO inside the folder would block a reader forever
    path = _copy(src, tmp_path / "fifo")
    os.remove(os.path.join(path, "model.safetensors"))
    os.mkfifo(os.path.join(path, "model.safetensors"))
    _expect(ModelErrorCode.UNSAFE_PATH, lambda: _load(path))


def test_hub_cache_layout_loads(checkpoint_dir, tmp_path):
    # snapshot_download's layout: <repo>/snapshots/<rev>/<file> -> ../../blobs/<hash>
    src = checkpoint_dir("llama")
    repo = tmp_path / "models--tiny--llama"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    for i, f in enumerate(sorted(os.listdir(src))):
        shutil.copy(os.path.join(src, f), repo / "blobs" / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / f)
    toks = [5, 4, 3]
    assert rel_err(_prefill_logits(_load(str(snap)), toks), hf_model(src)(torch.tensor([toks])).logits[0]) < 1e-4


def test_nonfinite_weights_refused(checkpoint_dir, tmp_path):
    src = checkpoint_dir("llama")
    name = "model.layers.1.self_attn.v_proj.weight"
    for bad in (float("nan"), float("inf"), float("-inf")):
        def poison(t, bad=bad):
            t[name][3, 5] = bad
            return t
        path = _variant(src, tmp_path / str(bad), tensors=poison)
        assert name in _expect(ModelErrorCode.NONFINITE_WEIGHT, lambda: _load(path))

    def big(t):
        t[name][0, 0] = 1e5  # finite in float32 / bfloat16, inf in float16 (max 65504)
        return t
    path = _variant(src, tmp_path / "big", tensors=big)
    assert _load(path, dtype="bfloat16").dtype == torch.bfloat16
    msg = _expect(ModelErrorCode.NONFINITE_WEIGHT, lambda: _load(path, dtype="float16"))
    assert name in msg and "float16" in msg


def test_pickle_only_checkpoint_refused_with_a_hint(checkpoint_dir, tmp_path):
    path = _copy(checkpoint_dir("llama"), tmp_path / "bin")
    tensors = load_file(os.path.join(path, "model.safetensors"))
    os.remove(os.path.join(path, "model.safetensors"))
    torch.save(tensors, os.path.join(path, "pytorch_model.bin"))
    msg = _expect(ModelErrorCode.UNSUPPORTED_FORMAT, lambda: _load(path))
    assert "pytorch_model.bin" in msg and "save_pretrained" in msg and "safe_serialization=True" in msg


def test_non_float_tensor_refused(checkpoint_dir, tmp_path):
    name = "model.norm.weight"
    path = _variant(checkpoint_dir("llama"), tmp_path / "int",
                    tensors=lambda t: {**t, name: t[name].to(torch.int32)})
    msg = _expect(ModelErrorCode.UNSUPPORTED_DTYPE, lambda: _load(path))
    assert name in msg and "I32" in msg
