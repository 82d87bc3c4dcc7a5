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
