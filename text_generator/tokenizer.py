"""Tokenizers for the engine and the CLI: a checkpoint's own (transformers), or a byte-level one.

`load_tokenizer(path)` reads what a checkpoint folder carries: `byte_tokenizer.json` (the demo
checkpoint's ByteTokenizer) or Hugging Face tokenizer files (AutoTokenizer, local files only);
None when there is neither. The engine needs only `encode(str) -> ids`, `decode(ids) -> str`
and `eos_token_id`, so any object with those works.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

BYTE_TOKENIZER_FILE = "byte_tokenizer.json"
_HF_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class ByteTokenizer:
    """Token ids 0..255 are the bytes of the UTF-8 text; 256 is BOS, 257 is EOS (vocab 258).

    encode adds BOS in front, as Llama tokenizers do; decode drops BOS, EOS and any id >= 258
    (a model with a padded vocabulary may sample them) and replaces invalid UTF-8 with U+FFFD.
    """

    vocab_size = 258
    bos_token_id = 256
    eos_token_id = 257

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id] + ids if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def save_pretrained(self, path: str) -> None:
        with open(os.path.join(path, BYTE_TOKENIZER_FILE), "w") as f:
            json.dump({"type": "byte", "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id}, f)


def load_tokenizer(path: str):
    """The tokenizer stored in a checkpoint folder, or None if it has no tokenizer files."""
    if os.path.isfile(os.path.join(path, BYTE_TOKENIZER_FILE)):
        return ByteTokenizer()
    if any(os.path.isfile(os.path.join(path, f)) for f in _HF_FILES):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    return None


def decode_tokens(tokenizer, ids: Sequence[int]) -> str:
    """decode without special tokens when the tokenizer supports it (HF and ByteTokenizer do)."""
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=True)
    except TypeError:
        return tokenizer.decode(list(ids))
