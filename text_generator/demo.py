"""The demo checkpoint: a small random Llama with a byte-level tokenizer, made once, no downloads.

The CLI uses it when no --model is given, so `python -m text_generator generate "hello"` runs
anywhere. Its weights are random: it exercises the whole stack, and its text is noise.

Where: `cache_dir` if given, else $TEXT_GENERATOR_CACHE/demo-llama, else
~/.cache/text_generator/demo-llama. It is written to a temporary folder and renamed into place,
so concurrent first runs never see half a checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from text_generator.tokenizer import BYTE_TOKENIZER_FILE, ByteTokenizer

DEMO_NAME = "demo-llama"
DEMO_CONFIG = dict(
    vocab_size=ByteTokenizer.vocab_size, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, rms_norm_eps=1e-5,
    rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.05,
    bos_token_id=ByteTokenizer.bos_token_id, eos_token_id=ByteTokenizer.eos_token_id,
)


def default_demo_dir() -> str:
    root = os.environ.get("TEXT_GENERATOR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "text_generator")
    return os.path.join(root, DEMO_NAME)


def is_complete(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, f)) for f in ("config.json", "model.safetensors", BYTE_TOKENIZER_FILE))


def ensure_demo_checkpoint(cache_dir: str | None = None) -> str:
    """Path of the demo checkpoint folder, creating it on first use (a few seconds, ~12 MB)."""
    path = cache_dir or default_demo_dir()
    if is_complete(path):
        return path
    import torch
    import transformers

    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".demo-", dir=parent)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**DEMO_CONFIG))
        model.save_pretrained(tmp)
        ByteTokenizer().save_pretrained(tmp)
        if os.path.isdir(path):  # an incomplete leftover
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:
            if not is_complete(path):  # not someone else's finished copy: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def ensure_demo_eagle3_head(cache_dir: str | None = None) -> str:
    """Path of a random EAGLE-3 draft head for the demo checkpoint (the public layout: config.json
    + model.safetensors with fc, midlayer.*, norm, lm_head over a 128-token draft vocabulary, d2t,
    t2d), created on first use next to it. Random: it drafts noise, and speculation stays exact."""
    path = cache_dir or os.path.join(os.path.dirname(default_demo_dir()), DEMO_NAME + "-eagle3")
    if all(os.path.isfile(os.path.join(path, f)) for f in ("config.json", "model.safetensors")):
        return path
    import json

    import torch
    from safetensors.torch import save_file

    H, inter, V, Vd = DEMO_CONFIG["hidden_size"], DEMO_CONFIG["intermediate_size"], DEMO_CONFIG["vocab_size"], 128
    heads, kv_heads = DEMO_CONFIG["num_attention_heads"], DEMO_CONFIG["num_key_value_heads"]
    hd = H // heads
    g = torch.Generator().manual_seed(0)
    a = "midlayer.self_attn."
    shapes = {"fc.weight": (H, 3 * H), a + "q_proj.weight": (heads * hd, 2 * H), a + "k_proj.weight": (kv_heads * hd, 2 * H),
              a + "v_proj.weight": (kv_heads * hd, 2 * H), a + "o_proj.weight": (H, heads * hd),
              "midlayer.mlp.gate_proj.weight": (inter, H), "midlayer.mlp.up_proj.weight": (inter, H),
              "midlayer.mlp.down_proj.weight": (H, inter), "lm_head.weight": (Vd, H)}
    tensors = {n: torch.randn(s, generator=g) * 0.05 for n, s in shapes.items()}
    for n in ("midlayer.input_layernorm", "midlayer.hidden_norm", "midlayer.post_attention_layernorm", "norm"):
        tensors[n + ".weight"] = torch.ones(H)
    kept = torch.randperm(V, generator=g)[:Vd].sort().values  # the draft vocabulary's target ids
    tensors["d2t"] = kept - torch.arange(Vd)
    tensors["t2d"] = torch.zeros(V, dtype=torch.bool).index_fill_(0, kept, True)
    config = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=H, intermediate_size=inter,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=1, vocab_size=V,
                  draft_vocab_size=Vd, target_hidden_size=H, rms_norm_eps=DEMO_CONFIG["rms_norm_eps"],
                  rope_theta=DEMO_CONFIG["rope_theta"], max_position_embeddings=DEMO_CONFIG["max_position_embeddings"],
                  hidden_act="silu", tie_word_embeddings=False, torch_dtype="float32")
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".demo-eagle3-", dir=parent)
    try:
        save_file(tensors, os.path.join(tmp, "model.safetensors"))
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        if os.path.isdir(path):  # an incomplete leftover
            shutil.rmtree(path, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
