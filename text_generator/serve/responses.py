"""OpenAI response bodies and stream chunks, built from the engine's RequestOutputs.

Completions:       {"object": "text_completion", "choices": [{"index", "text", "logprobs", "finish_reason"}]}
Chat completions:  {"object": "chat.completion", "choices": [{"index", "message", "logprobs", "finish_reason"}]}
Streams send the same shapes with deltas ("text_completion" chunks / "chat.completion.chunk"),
one Server-Sent Event each, then `data: [DONE]`.

Logprobs come from the engine per output token (RequestOutput.logprobs / top_logprobs);
`token_str` turns a token id into its text for the "tokens" / "token" fields.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from text_generator.engine import RequestOutput

TokenStr = Callable[[int], str]


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
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
    rows = []
    for k in range(max(start, 0), min(end, len(lps))):
        rows.append((out.token_ids[k], lps[k], tops[k] if k < len(tops) else {}))
    return rows


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


# -- completions ---------------------------------------------------------------------------
def completion_logprobs(rows, token_str: TokenStr, offset: int = 0) -> dict:
    """OpenAI's legacy logprobs object: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens = [token_str(t) for t, _, _ in rows]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in rows],
            "top_logprobs": [{token_str(i): v for i, v in top.items()} for _, _, top in rows],
            "text_offset": offsets}


def completion_body(rid: str, model: str, finals: list[RequestOutput], want_logprobs: bool,
                    token_str: TokenStr, prompt_tokens: int) -> dict:
    choices = [{"index": i, "text": o.text or "", "finish_reason": finish_reason(o),
                "logprobs": completion_logprobs(all_logprobs(o), token_str) if want_logprobs else None}
               for i, o in enumerate(finals)]
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage(prompt_tokens, sum(len(o.token_ids) for o in finals))}


def completion_chunk(rid: str, model: str, index: int, text: str, fin: str | None, logprobs: dict | None) -> dict:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": fin}]}


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


def chat_chunk(rid: str, model: str, index: int, delta: dict, fin: str | None, logprobs: dict | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": fin}]}


def usage_chunk(rid: str, model: str, obj: str, prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}
