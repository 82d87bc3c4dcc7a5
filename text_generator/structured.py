"""Structured output: a request's tokens constrained to a JSON schema, any JSON object, a regex or
an EBNF grammar, with xgrammar (optional extra `structured`; the library imports without it).

Where the data goes (LLMEngine):

    add_request     SamplingParams.structured (a StructuredOutput)
                    --GrammarCompiler.compile--> RequestGrammar (an xgrammar GrammarMatcher: the
                    grammar's state after the request's output tokens so far)
    every step      mask_logits_(logits [B, V], grammars): one int32 bitmask [B, ceil(V / 32)],
                    a row filled per structured row, applied in place (disallowed -> -inf) BEFORE
                    the Sampler's penalties, temperature and filters; other rows untouched, and
                    no work at all when no row is structured
    every token     RequestGrammar.accept(token); the grammar's termination (it accepts the stop
                    token once the structure is complete) ends the request with "stop"
    speculation     speculative.verify.verify_greedy_grammar walks the draft tree's accepted path
                    with the request's grammar, masking each node's row (see there)

Bitmask layout (xgrammar's): bit j of int32 word w in a row allows token 32 * w + j.

    token:   0 .. 31 | 32 .. 63 | ... | V - 1 (padding bits of the last word: never read)
    word:       0    |    1     | ... | ceil(V / 32) - 1

The model's vocabulary V may be larger than the tokenizer's (a padded lm_head): the tokenizer
info is built with vocab_size = V, and xgrammar treats the ids past the tokenizer as special
tokens that no grammar allows, so they are masked out.

Logprobs of a structured request are those of the masked distribution (what the token was
drawn from): tokens outside the grammar have logprob -inf.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

import torch

from text_generator.errors import ErrorCode, ForwardArgumentError, GeneratorStateError

_FIELDS = ("json_schema", "json_object", "regex", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    """What the output must match; exactly one field is set.

    json_schema:  a JSON schema (dict, or its JSON text); output is compact JSON
                  (`{"a": 1, "b": "x"}`, separators ", " and ": ") that validates against it;
                  properties the schema does not list are not produced (xgrammar's strict mode)
    json_object:  True: any JSON object (OpenAI's response_format {"type": "json_object"})
    regex:        the output fullmatches this regular expression
    grammar:      an EBNF grammar (xgrammar / GBNF syntax) whose `root` rule the output matches

    Whitespace between JSON tokens is fixed rather than free: a free choice lets a weak model
    spend its whole budget on spaces and newlines.
    """

    json_schema: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        if self.json_schema is not None and not isinstance(self.json_schema, (dict, str)):
            _invalid("json_schema", "a dict or a JSON string", type(self.json_schema).__name__)
        if isinstance(self.json_schema, str):
            try:
                json.loads(self.json_schema)
            except ValueError as e:
                _invalid("json_schema", "a JSON string", f"text that does not parse ({e})")
        if not isinstance(self.json_object, bool):
            _invalid("json_object", "a bool", repr(self.json_object))
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                _invalid(name, "a non-empty str or None", repr(v))
        chosen = [f for f in _FIELDS if getattr(self, f) not in (None, False)]
        if len(chosen) != 1:
            raise ForwardArgumentError(
                ErrorCode.INVALID_STRUCTURED_OUTPUT, "structured",
                f"expected exactly one of {', '.join(_FIELDS)} set, got {chosen or 'none'}")

    @classmethod
    def from_dict(cls, d: dict) -> "StructuredOutput":
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise ForwardArgumentError(ErrorCode.INVALID_STRUCTURED_OUTPUT, "structured",
                                       f"expected keys among {', '.join(_FIELDS)}, got {', '.join(map(str, unknown))}")
        return cls(**d)

    @property
    def kind(self) -> str:
        """The field that is set: 'json_schema', 'json_object', 'regex' or 'grammar'."""
        return next(f for f in _FIELDS if getattr(self, f) not in (None, False))


def _invalid(name: str, expected: str, got: str) -> None:
    raise ForwardArgumentError(ErrorCode.INVALID_STRUCTURED_OUTPUT, f"structured.{name}",
                               f"expected {expected}, got {got}")


def _xgrammar():
    try:
        import xgrammar
    except ImportError as e:
        raise GeneratorStateError(
            ErrorCode.STRUCTURED_OUTPUT_UNAVAILABLE, "structured",
            f"expected xgrammar to be installed (pip install 'text-generator[structured]'), got {e}") from None
    return xgrammar


class RequestGrammar:
    """One request's grammar state: an xgrammar GrammarMatcher that has accepted every output
    token of the request so far (and nothing else, between engine calls)."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size

    def accept(self, token: int) -> bool:
        """Advance over one emitted token; False (state unchanged) if the grammar forbids it."""
        return bool(self.matcher.accept_token(int(token)))

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens."""
        if n:
            self.matcher.rollback(n)

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into row `row` of an int32 bitmask [*, ceil(V / 32)]."""
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def next_greedy(self, logits: torch.Tensor) -> int:
        """argmax of one row of logits [V] over the tokens the grammar allows next."""
        row = logits.detach().float().reshape(1, -1).clone()
        mask_logits_(row, [self])
        return int(row.argmax(dim=-1))


def mask_logits_(logits: torch.Tensor, grammars: Sequence[RequestGrammar | None]) -> torch.Tensor:
    """Set logits [B, V] (float32, contiguous) to -inf where row b's grammar forbids the token,
    in place, for the rows whose grammars[b] is not None; returns logits. One bitmask
    [B, ceil(V / 32)] is filled on the host (a row per structured request) and applied with
    xgrammar's kernel for the logits' device."""
    rows = [b for b, g in enumerate(grammars) if g is not None]
    if not rows:
        return logits
    xgr = _xgrammar()
    B, V = logits.shape
    bitmask = xgr.allocate_token_bitmask(B, V)
    for b in rows:
        grammars[b].fill(bitmask, b)
    if bitmask.device != logits.device:
        bitmask = bitmask.to(logits.device, non_blocking=True)
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=V, indices=rows)
    return logits


class GrammarCompiler:
    """Compiles StructuredOutputs into per-request grammars for one engine.

    Owns xgrammar's TokenizerInfo (from the engine's tokenizer, sized to the model's vocabulary
    vocab_size, with stop_token_ids ending a complete structure) and its GrammarCompiler, which
    caches compiled grammars, so requests with the same schema compile once.

    tokenizer: a Hugging Face tokenizer (transformers) or text_generator's ByteTokenizer.
    """

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: list[int] | None = None, max_threads: int = 8):
        xgr = _xgrammar()
        self.vocab_size = vocab_size
        self.info = _tokenizer_info(xgr, tokenizer, vocab_size, stop_token_ids)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=max_threads)

    def compile(self, spec: StructuredOutput) -> RequestGrammar:
        """A fresh RequestGrammar for one request; a spec xgrammar rejects raises
        ForwardArgumentError INVALID_STRUCTURED_OUTPUT naming the field."""
        xgr = _xgrammar()
        kind = spec.kind
        try:
            if kind == "json_schema":
                schema = spec.json_schema if isinstance(spec.json_schema, str) else json.dumps(spec.json_schema)
                compiled = self.compiler.compile_json_schema(schema, any_whitespace=False)
            elif kind == "json_object":
                compiled = self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            elif kind == "regex":
                compiled = self.compiler.compile_regex(spec.regex)
            else:
                compiled = self.compiler.compile_grammar(spec.grammar)
        except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError / ValueError / TypeError
            what = {"json_schema": "a JSON schema", "regex": "a regular expression",
                    "grammar": "an EBNF grammar with a root rule", "json_object": "a JSON object grammar"}[kind]
            raise ForwardArgumentError(ErrorCode.INVALID_STRUCTURED_OUTPUT, f"structured.{kind}",
                                       f"expected {what} that xgrammar compiles, got: {_clean(e)}") from None
        return RequestGrammar(xgr.GrammarMatcher(compiled), self.vocab_size)


def _tokenizer_info(xgr, tokenizer, vocab_size: int, stop_token_ids: list[int] | None):
    from text_generator.tokenizer import ByteTokenizer

    if isinstance(tokenizer, ByteTokenizer):
        # bytes 0..255 are themselves; BOS and EOS decode to nothing (xgrammar: special tokens)
        vocab = [bytes([i]) for i in range(256)] + [b"", b""]
        stops = stop_token_ids or [tokenizer.eos_token_id]
        return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stops)
    try:
        from transformers import PreTrainedTokenizerBase
    except ImportError:
        PreTrainedTokenizerBase = ()
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise GeneratorStateError(
            ErrorCode.STRUCTURED_OUTPUT_UNAVAILABLE, "tokenizer",
            f"expected a Hugging Face tokenizer or a ByteTokenizer, got {type(tokenizer).__name__}")
    if len(tokenizer) > vocab_size:
        raise GeneratorStateError(
            ErrorCode.STRUCTURED_OUTPUT_UNAVAILABLE, "tokenizer",
            f"expected at most the model's vocab_size={vocab_size} tokens, got {len(tokenizer)}")
    return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)


def _clean(e: Exception) -> str:
    """xgrammar's C++ message without its '[hh:mm:ss] file.cc:line: ' prefix, on one line."""
    text = re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip())
    return " ".join(text.split())
