"""Admission checks for LLMEngine.add_request: a request's sampling parameters, prompt and adapter.

Each check takes what the caller passed and returns the normalised value (SamplingParams, a list
of token ids, an adapter name or None), or raises ValueError naming the argument, what was
expected and what came. The engine turns that error into the request's finish_reason "error"
(its other requests go on); nothing here touches engine state.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from adapters.ids import AdapterIdsError, resolve_adapter_ids
from text_generator.errors import ErrorCode, GeneratorStateError
from text_generator.sampling import SamplingParams
from text_generator.structured import GrammarCompiler


def check_params(params, tokenizer) -> SamplingParams:
    """SamplingParams, a dict of its fields, or None (the defaults) -> a validated SamplingParams."""
    if params is None:
        return SamplingParams()
    if isinstance(params, dict):
        known = {f.name for f in dataclasses.fields(SamplingParams)}
        unknown = sorted(map(str, set(params) - known))
        if unknown:
            raise ValueError(f"sampling_params: expected SamplingParams fields ({sorted(known)}), got {unknown}")
        return SamplingParams(**params)
    if not isinstance(params, SamplingParams):
        raise ValueError(f"sampling_params: expected a SamplingParams, a dict or None, got {type(params).__name__}")
    params.__post_init__()  # re-validate: fields may have been changed after construction
    if params.stop and tokenizer is None:
        raise ValueError("SamplingParams.stop: stop strings need a tokenizer; the engine has none")
    return params


def check_prompt(prompt, tokenizer, vocab_size: int, max_seq_len: int) -> list[int]:
    """A str (encoded with tokenizer), a sequence of int ids or a 1-D integer tensor -> token ids,
    each in [0, vocab_size), at most max_seq_len - 1 of them (room for one output token)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: a str prompt needs a tokenizer; the engine has none (pass token ids)")
        ids = list(tokenizer.encode(prompt))
    elif isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype == torch.bool:
            raise ValueError(f"prompt: expected a 1-D integer tensor, got {prompt.dtype} {list(prompt.shape)}")
        ids = prompt.tolist()
    elif isinstance(prompt, Sequence):
        ids = list(prompt)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt: expected a str or a sequence of int token ids")
    else:
        raise ValueError(f"prompt: expected a str, a sequence of int token ids or a 1-D integer tensor, "
                         f"got {type(prompt).__name__}")
    if not ids:
        raise ValueError("prompt: expected at least one token, got none")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt: expected token ids in [0, {vocab_size}), got {bad[0]}")
    if len(ids) >= max_seq_len:
        raise ValueError(f"prompt: expected at most max_seq_len - 1 = {max_seq_len - 1} tokens "
                         f"(room for one output token), got {len(ids)}")
    return ids


def check_adapter(adapter, loaded: list[str]) -> str | None:
    """-> the adapter name, or None for the base model (adapters.ids' rule, for one request)."""
    try:
        ids = resolve_adapter_ids([adapter], 1, loaded)
    except AdapterIdsError as e:
        raise ValueError(f"adapter: {e.detail}") from None
    return None if ids is None else ids[0]


def make_grammar_compiler(tokenizer, vocab_size: int, eos_token_id: int | None) -> GrammarCompiler:
    """The engine's one GrammarCompiler (built at its first structured request); raises
    GeneratorStateError STRUCTURED_OUTPUT_UNAVAILABLE without a tokenizer."""
    if tokenizer is None:
        raise GeneratorStateError(ErrorCode.STRUCTURED_OUTPUT_UNAVAILABLE, "tokenizer",
                                  "expected an engine with a tokenizer for structured output, got none")
    stops = None if eos_token_id is None else [eos_token_id]
    return GrammarCompiler(tokenizer, vocab_size, stops)
