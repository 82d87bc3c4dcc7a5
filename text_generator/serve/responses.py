"""OpenAI response bodies and stream chunks, built from the engine's RequestOutputs.

Completions:       {"object": "text_completion", "choices": [{"index", "text", "logprobs", "finish_reason"}]}
Chat completions:  {"object": "chat.completion", "choices": [{"index", "message", "logprobs", "finish_reason"}]}
Streams send the same shapes with deltas ("text_completion" chunks / "chat.completion.chunk"),
one Server-Sent Event each, then `data: [DONE]`. A stream's chunks are written by its ChunkWriter
(the fields every chunk repeats are serialized once per stream) from merge_outputs: the outputs
that queued up for a stream since its last chunk, one entry per choice.

Logprobs come from the engine per output token (RequestOutput.logprobs / top_logprobs);
`token_str` turns a token id into its text for the "tokens" / "token" fields.
"""

from __future__ import annotations

import json
import time
from typing import Callable, NamedTuple

from text_generator.engine import RequestOutput

TokenStr = Callable[[int], str]
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # built once: dumps(**kw) builds one per call
_C_ENCODE = json.encoder.c_make_encoder  # None without the C accelerator


def _json(obj) -> str:
    """obj as compact JSON (UTF-8 text kept as is), byte for byte what _ENCODER.encode(obj) writes. Its
    encode() builds a new C encoder per call for a dict, a list or None (~1.4 us of a streamed chunk's
    ~4); this reuses one, built without circular-reference markers (the bodies here are our own trees)."""
    if isinstance(obj, str):
        return json.encoder.encode_basestring(obj)
    if obj is None:
        return "null"
    if _REUSED is None:
        return _ENCODER.encode(obj)
    return "".join(_REUSED(obj, 0))


_REUSED = None if _C_ENCODE is None else _C_ENCODE(
    None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, True)


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else _json(payload)
    return f"data: {data}\n\n"


def finish_reason(out: RequestOutput) -> str | None:
    if not out.finished:
        return None
    return out.finish_reason if out.finish_reason in ("stop", "length") else "stop"


def new_logprobs(out: RequestOutput) -> list[tuple[int, float, dict[int, float]]]:
    """(token, logprob, {top id: logprob}) of the tokens this output adds."""
    n_new = len(out.new_token_ids)
    return _logprob_rows(out, len(out.token_ids) - n_new, len(out.token_ids))


def all_logprobs(out: RequestOutput) -> list[tuple[int, float, dict[int, float]]]:
    """The same rows for every output token so far."""
    return _logprob_rows(out, 0, len(out.token_ids))


def _logprob_rows(out: RequestOutput, start: int, end: int):
    lps, tops = out.logprobs or [], out.top_logprobs or []
    start, end = max(start, 0), min(end, len(lps))
    if end <= start:
        return []
    ids = out.token_ids[start:end]
    if len(tops) >= end:  # (every row has its top logprobs: the usual case, sliced at C speed)
        return list(zip(ids, lps[start:end], tops[start:end]))
    return [(ids[k - start], lps[k], tops[k] if k < len(tops) else {}) for k in range(start, end)]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


# -- completions ---------------------------------------------------------------------------
def completion_logprobs(rows, token_str: TokenStr, offset: int = 0) -> dict:
    """OpenAI's legacy logprobs object: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, lps, tops, offsets = [], [], [], []
    for t, lp, top in rows:  # (one pass: this runs for every streamed chunk)
        s = token_str(t)
        tokens.append(s)
        lps.append(lp)
        tops.append({token_str(i): v for i, v in top.items()})
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def completion_body(rid: str, model: str, finals: list[RequestOutput], want_logprobs: bool,
                    token_str: TokenStr, prompt_tokens: int) -> dict:
    choices = [{"index": i, "text": o.text or "", "finish_reason": finish_reason(o),
                "logprobs": completion_logprobs(all_logprobs(o), token_str) if want_logprobs else None}
               for i, o in enumerate(finals)]
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(prompt_tokens, sum(len(o.token_ids) for o in finals))}


# -- chat ----------------------------------------------------------------------------------
def chat_logprobs(rows, token_str: TokenStr) -> dict:
    def entry(t: int, lp: float) -> dict:
        s = token_str(t)
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    return {"content": [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top.items()]}
                        for t, lp, top in rows]}


def chat_body(rid: str, model: str, finals: list[RequestOutput], want_logprobs: bool,
              token_str: TokenStr, prompt_tokens: int) -> dict:
    choices = [{"index": i, "message": {"role": "assistant", "content": o.text or ""},
                "finish_reason": finish_reason(o),
                "logprobs": chat_logprobs(all_logprobs(o), token_str) if want_logprobs else None}
               for i, o in enumerate(finals)]
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(prompt_tokens, sum(len(o.token_ids) for o in finals))}


# -- streams -------------------------------------------------------------------------------
class Merged(NamedTuple):
    """What one chunk of a stream says of one choice: the text and logprob rows of the outputs merged
    into it, the OpenAI finish reason and output token count of the latest (the whole output's once it
    finished), and whether it failed (finish_reason "error"; error: its message)."""

    request_id: str
    text: str
    rows: list
    finish: str | None
    num_tokens: int
    failed: bool = False
    error: str | None = None


def merge_outputs(outs: list[RequestOutput], want_logprobs: bool) -> list[Merged]:
    """Consecutive outputs of a stream's requests (arrival order) -> one Merged per request, in order
    of first appearance: delta texts and new logprob rows concatenated, so that the chunks still add
    up to the same text and rows. A failed output gets its own entry after its request's merged text."""
    if len(outs) == 1 and outs[0].finish_reason != "error":  # (the usual case: a stream that keeps up)
        o = outs[0]
        return [Merged(o.request_id, o.delta_text or "", new_logprobs(o) if want_logprobs else [], finish_reason(o),
                       len(o.token_ids))]
    merged: list[Merged] = []
    open_: dict[str, list] = {}  # request id -> [text pieces, rows, latest output] not yet in `merged`
    order: list[str] = []
    for o in outs:
        if o.finish_reason == "error":
            _close(open_.pop(o.request_id, None), merged)
            merged.append(Merged(o.request_id, "", [], None, len(o.token_ids), True, o.error))
            continue
        rows = new_logprobs(o) if want_logprobs else []
        acc = open_.get(o.request_id)
        if acc is None:
            open_[o.request_id] = [[o.delta_text or ""], rows, o]
            order.append(o.request_id)
        else:
            acc[0].append(o.delta_text or "")
            acc[1] += rows
            acc[2] = o
    for rid in order:
        _close(open_.pop(rid, None), merged)
    return merged


def _close(acc, merged: list[Merged]) -> None:
    if acc is not None:
        pieces, rows, last = acc
        merged.append(Merged(last.request_id, "".join(pieces), rows, finish_reason(last), len(last.token_ids)))


class ChunkWriter:
    """The SSE events of one stream. Every chunk repeats id, object, created and model, serialized
    here once; each chunk then encodes only its own fields (per-token cost at saturation)."""

    def __init__(self, rid: str, model: str, chat: bool):
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self._meta = f'"id":{_json(rid)},"object":"{self.object}","created":{int(time.time())},"model":{_json(model)}'
        self._head = 'data: {' + self._meta + ',"choices":[{"index":'

    def completion(self, index: int, text: str, fin: str | None, logprobs: dict | None) -> str:
        return (f'{self._head}{index},"text":{_json(text)},"logprobs":{_json(logprobs)},'
                f'"finish_reason":{_json(fin)}}}]}}\n\n')

    def chat(self, index: int, delta: dict, fin: str | None, logprobs: dict | None) -> str:
        return (f'{self._head}{index},"delta":{_json(delta)},"logprobs":{_json(logprobs)},'
                f'"finish_reason":{_json(fin)}}}]}}\n\n')

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        return f'data: {{{self._meta},"choices":[],"usage":{_json(usage(prompt_tokens, completion_tokens))}}}\n\n'
