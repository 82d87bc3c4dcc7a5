"""Token emission for LLMEngine: append a request's new tokens, check its stop rules, detokenize.

The engine hands each sampled token (or a speculative step's accepted run) to `append_tokens`,
which updates the Request (output_ids, metrics, text, held_text, logprobs) and says whether it
finished and why; the engine then finishes the request or tells its drafter, and reports
`req.output(...)`. Nothing here touches the scheduler, the block manager or the drafter.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from text_generator.engine.detokenizer import make_detokenizer
from text_generator.engine.request import Request

GRAMMAR_REJECTED = "token {} is outside the request's structured-output grammar"


class Appended(NamedTuple):
    """What append_tokens did to one request."""

    new: list[int]  # the tokens taken (those after a finishing one are dropped)
    delta: str | None  # their new text (None without a tokenizer, or after a detokenizer error)
    reason: str | None  # finish reason, None while the request runs on
    error: str | None  # the message of finish reason "error"


def append_tokens(req: Request, toks: list[int], at: int | None, *, eos_token_id: int | None,
                  max_seq_len: int, tokenizer) -> Appended:
    """Append new tokens with their stop checks; tokens after the one that finishes the request
    are dropped. at: the token is already in output_ids at index `at` (a run-ahead placeholder
    just replaced; later placeholders are dropped if it finishes the request). A failing
    detokenizer or stop check finishes this request alone, with reason "error"."""
    now = time.perf_counter()
    if req.metrics.first_token_time is None:
        req.metrics.first_token_time = now
    new: list[int] = []
    delta = "" if tokenizer is not None else None
    reason = error = None
    try:
        for tok in toks:
            if at is None:
                req.output_ids.append(tok)
            req.metrics.token_times.append(now)
            new.append(tok)
            reason, d = check_token(req, tok, eos_token_id, max_seq_len, tokenizer)
            if d:
                delta += d
            if reason is not None:
                break
    except Exception as e:
        reason, error, delta = "error", f"detokenizing its output failed: {describe(e)}", None
    if reason is not None:
        if req.pending:
            del req.output_ids[len(req.output_ids) - req.pending:]
            req.pending = 0
        if error is None and reason == "error":  # the grammar refused the token
            error = GRAMMAR_REJECTED.format(new[-1])
    return Appended(new, delta, reason, error)


def check_token(req: Request, tok: int, eos_token_id: int | None, max_seq_len: int, tokenizer
                ) -> tuple[str | None, str | None]:
    """Stop checks and detokenization after one new token (vLLM's order: EOS, stop tokens,
    stop strings, then the length limits) -> (finish reason or None, new text or None).

    The token's text comes from the request's incremental detokenizer (EOS and stop tokens
    add none). Text that might begin a stop string is held back (req.held_text) until the
    next tokens decide; a stop string found across any token boundary cuts the text right
    before it. When the request finishes, the held text and the detokenizer's tail go out."""
    p = req.params
    reason = "stop" if (tok == eos_token_id and not p.ignore_eos) or tok in p.stop_token_ids else None
    if req.grammar is not None:
        if not req.grammar.accept(tok):  # the mask forbade it: only a broken row of logits gets here
            return "error", None
        if req.grammar.terminated:  # it took the stop token that completes the structure
            reason = "stop"
    n_out = len(req.output_ids) - req.pending  # placeholders of run-ahead steps do not count
    at_limit = n_out >= p.max_new_tokens or len(req.prompt_ids) + n_out >= max_seq_len
    if reason is None and at_limit:
        reason = "length"
    if tokenizer is None:
        return reason, None
    if req.detokenizer is None:
        req.detokenizer = make_detokenizer(tokenizer)
    new = req.detokenizer.step(tok) if reason != "stop" else ""  # EOS / stop tokens: no text
    if reason is not None:
        new += req.detokenizer.flush()
    text = req.text + req.held_text + new
    if p.stop:
        cut = find_stop(text, p.stop, len(req.text))
        if cut is not None:
            text, reason = text[:cut], "stop"
    end = len(text)
    if reason is None and p.stop:  # hold back what may be the start of a stop string
        end = max(len(req.text), end - (max(map(len, p.stop)) - 1))
    delta, req.text, req.held_text = text[len(req.text):end], text[:end], text[end:]
    return reason, delta


def find_stop(text: str, stops: list[str], old_len: int) -> int | None:
    """Index of the earliest stop string that ends in the new part of text, or None."""
    best = None
    for s in stops:
        k = text.find(s, max(0, old_len - len(s) + 1))
        if k != -1 and (best is None or k < best):
            best = k
    return best


def record_logprobs(req: Request, i: int, lps, top_ids, top_lps) -> None:
    """Append row i of a step's sampled logprobs [S] and top-n ids / logprobs [S, k] (host lists)
    to the request's, keeping the top params.logprobs of them."""
    if req.logprobs is None:
        req.logprobs, req.top_logprobs = [], []
    req.logprobs.append(lps[i])
    n = req.params.logprobs
    req.top_logprobs.append(dict(zip(top_ids[i][:n], top_lps[i][:n])) if n else {})


def describe(e: Exception) -> str:
    """An error message for a request's output: coded errors carry their own message."""
    coded = type(e) is ValueError or hasattr(e, "code")
    return str(e) if coded and str(e) else f"{type(e).__name__}: {e}"
