"""The FastAPI app: OpenAI's /v1/models, /v1/completions, /v1/chat/completions, vLLM's LoRA admin
endpoints, /health and /metrics, over an EngineClient (the engine runs in its own process).

A request is parsed (protocol.py), checked and tokenized here (the HTTP process's own
tokenizer), turned into
SamplingParams (params.py) and submitted as one engine request per choice; the outputs come back
through the request's RequestGroup and leave as one JSON body or as Server-Sent Events
(responses.py). The text is the engine's: its delta_text per step, with stop strings cut.
A client that goes away (its disconnect, or a cancelled stream) aborts its engine requests.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from text_generator.chat import ChatTemplateError, GenerationDefaults, render_chat
from text_generator.errors import ErrorCode
from text_generator.serve import responses as R
from text_generator.serve.engine_client import ENGINE_DEAD, EngineClient, RequestGroup
from text_generator.serve.engine_worker import ENGINE_FAILURE
from text_generator.serve.errors import APIError, bad_request
from text_generator.serve.metrics import ServerMetrics
from text_generator.serve.profiling import request_trace
from text_generator.serve.params import for_choices, max_new_tokens, sampling_params
from text_generator.serve.protocol import (ChatCompletionRequest, CompletionRequest, LoadLoraRequest,
                                           UnloadLoraRequest)


@dataclass
class ServerState:
    """What the routes share. loras: served adapter name -> its folder (the engine's adapter name
    is the same). tokenizer: the HTTP process's own (the engine process has another)."""

    engine: EngineClient
    tokenizer: object
    model_name: str
    max_model_len: int
    vocab_size: int
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    metrics: ServerMetrics | None = None
    loras: dict[str, str] = field(default_factory=dict)
    created: int = field(default_factory=lambda: int(time.time()))
    token_strs: dict[int, str] = field(default_factory=dict, repr=False)
    trace: object = field(default_factory=request_trace, repr=False)  # TG_SERVE_TRACE's FILE.http, or None

    def adapter_for(self, model: str) -> str | None:
        """The engine adapter a request's "model" names (None: the base model); 404 otherwise."""
        if model == self.model_name:
            return None
        if model in self.loras:
            return model
        raise APIError(404, ErrorCode.MODEL_NOT_FOUND, f"model: expected one of {self.model_names()}, got {model!r}",
                       "model")

    def model_names(self) -> list[str]:
        return [self.model_name, *self.loras]

    def token_str(self, token_id: int) -> str:
        """A token's own text (logprobs' "tokens"), decoded once per id: every streamed token needs it."""
        s = self.token_strs.get(token_id)
        if s is None:
            s = self.token_strs[token_id] = self.tokenizer.decode([token_id])
        return s

    def check_ids(self, ids: list[int], param: str) -> list[int]:
        if not ids:
            raise bad_request(f"{param}: expected at least one token, got none", param)
        if min(ids) < 0 or max(ids) >= self.vocab_size:  # (C-speed scans: this runs for every request of a burst)
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            raise bad_request(f"{param}: expected token ids in [0, {self.vocab_size}), got {bad}", param)
        return ids


def build_app(state: ServerState) -> FastAPI:
    """The app over a started EngineClient; the engine process stops with the app."""

    @asynccontextmanager
    async def lifespan(_app):
        state.engine.attach(asyncio.get_running_loop())
        yield
        state.engine.stop()

    app = FastAPI(title="text-generator", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def _api_error(_req, e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {}
        param = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or None
        got = repr(err.get("input"))
        got = got if len(got) <= 200 else got[:200] + "..."
        msg = f"{param}: {err.get('msg', 'invalid request')}, got {got}" if param else str(e)
        return JSONResponse(bad_request(msg, param).body(), status_code=400)

    @app.get("/health")
    async def health():
        if not state.engine.alive:
            e = APIError(503, ErrorCode.ENGINE_FAILED, f"the engine is not running ({state.engine.error})")
            return JSONResponse(e.body(), status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        body = state.metrics.render() if state.metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        data = [{"id": name, "object": "model", "created": state.created, "owned_by": "text-generator",
                 "root": state.model_name if name == state.model_name else state.loras[name],
                 "parent": None if name == state.model_name else state.model_name,
                 "max_model_len": state.max_model_len} for name in state.model_names()]
        return {"object": "list", "data": data}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        request.state.t_handler = time.perf_counter()
        adapter = state.adapter_for(body.model)
        if body.echo or body.suffix is not None or body.best_of not in (None, body.n):
            field_ = "echo" if body.echo else "suffix" if body.suffix is not None else "best_of"
            raise bad_request(f"{field_}: not supported by this server", field_)
        _check_n(body.n)
        prompts = _completion_prompts(body.prompt)
        ids = [state.check_ids(list(state.tokenizer.encode(p)) if isinstance(p, str) else p, "prompt")
               for p in prompts]
        return await _run(state, request, body, adapter, ids, body.logprobs, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        request.state.t_handler = time.perf_counter()
        adapter = state.adapter_for(body.model)
        _check_n(body.n)
        if body.tools:
            raise bad_request("tools: not supported by this server (no tool calling)", "tools")
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request(f"top_logprobs: expected logprobs=true with it, got logprobs={body.logprobs}",
                              "top_logprobs")
        messages = [{"role": m.role, "content": _content_text(m.content, i)} for i, m in enumerate(body.messages)]
        try:
            text = render_chat(state.tokenizer, messages, add_generation_prompt=body.add_generation_prompt)
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages", ErrorCode.NO_CHAT_TEMPLATE) from None
        ids = state.check_ids(list(state.tokenizer.encode(text, add_special_tokens=False)), "messages")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        return await _run(state, request, body, adapter, [ids], logprobs, chat=True)

    @app.post("/v1/load_lora_adapter")
    async def load_lora(body: LoadLoraRequest):
        name = body.lora_name
        if name in state.model_names():
            raise bad_request(f"lora_name: expected a new name, got {name!r}, which is already served", "lora_name",
                              ErrorCode.ADAPTER_REFUSED)
        try:
            await state.engine.call("load_adapter", name, body.lora_path)
        except (ValueError, RuntimeError, OSError) as e:
            raise bad_request(f"lora_path: adapter {name!r} refused: {e}", "lora_path", ErrorCode.ADAPTER_REFUSED) from None
        state.loras[name] = body.lora_path
        return {"status": "ok", "lora_name": name}

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(body: UnloadLoraRequest):
        name = body.lora_name
        if name not in state.loras:
            raise APIError(404, ErrorCode.MODEL_NOT_FOUND, f"lora_name: expected a loaded adapter "
                           f"({sorted(state.loras)}), got {name!r}", "lora_name")
        path = state.loras.pop(name)  # new requests are refused from now on; running ones fail at the next step
        try:
            await state.engine.call("unload_adapter", name)
        except (ValueError, RuntimeError) as e:
            state.loras[name] = path
            raise bad_request(f"lora_name: unloading {name!r} failed: {e}", "lora_name", ErrorCode.ADAPTER_REFUSED) from None
        return {"status": "ok", "lora_name": name}

    return app


def _check_n(n: int) -> None:
    if not 1 <= n <= 128:
        raise bad_request(f"n: expected an int in [1, 128], got {n}", "n")


def _completion_prompts(prompt) -> list:
    """str | [int] | [str] | [[int]] -> a list of prompts (str or token ids)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("prompt: expected a string, token ids or a non-empty list of them, got []", "prompt")
    if isinstance(prompt[0], int):  # (pydantic has made the list one kind: ids, strings or lists of ids)
        return [list(prompt)]
    return list(prompt)


def _content_text(content, i: int) -> str:
    """A message's content: a string, or OpenAI's list of parts (text parts only)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(f"messages[{i}].content: expected text parts, got a {part.get('type')!r} part",
                              f"messages[{i}].content")
        texts.append(part["text"])
    return "".join(texts)


async def _run(state: ServerState, request: Request, body, adapter: str | None, prompts: list[list[int]],
               logprobs: int | None, *, chat: bool):
    """Submit n choices per prompt (choice index = prompt * n + j) and answer, streamed or not."""
    field_ = "messages" if chat else "prompt"
    if body.logit_bias:
        raise bad_request("logit_bias: not supported by this server", "logit_bias")
    params = []
    for ids in prompts:
        budget = max_new_tokens(body.max_tokens, len(ids), state.max_model_len, state.defaults, field_)
        params += for_choices(sampling_params(body, max_tokens=budget, logprobs=logprobs, defaults=state.defaults),
                              body.n)
    engine_prompts = [ids for ids in prompts for _ in range(body.n)]
    t_submit = time.perf_counter()
    group = state.engine.submit(engine_prompts, params, adapter)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    # TG_SERVE_TRACE: the request's line (profiling.RequestTrace) is written when it ends
    times = None if state.trace is None else (request.state.t_handler, t_submit, len(engine_prompts))
    prompt_tokens = sum(map(len, prompts))
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(_stream(state, group, rid, body.model, chat, logprobs is not None, include_usage,
                                         prompt_tokens, times), media_type="text/event-stream")
    finals = await _collect(group, request)
    if times is not None:
        now = time.perf_counter()
        state.trace.record(*times, group.t_put, now, now, now, rid)
    if finals is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    _raise_errors(finals)
    make = R.chat_body if chat else R.completion_body
    return JSONResponse(make(rid, body.model, finals, logprobs is not None, state.token_str, prompt_tokens))


async def _collect(group: RequestGroup, request: Request):
    """Every choice's final output, in choice order; None when the client disconnected first
    (its requests are aborted)."""
    finals = {}
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        while not group.done:
            nxt = asyncio.ensure_future(group.next())
            await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                nxt.cancel()
                return None
            out = nxt.result()
            if out.finished:
                finals[group.index[out.request_id]] = out
    finally:
        gone.cancel()
        group.abort()
    return [finals[i] for i in range(len(group.request_ids))]


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body is read already, so receive() waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(o) -> APIError:
    """A request that ended with finish_reason "error" -> 503 (the engine process died), 500 (its
    step failed) or 400 (the request itself was refused)."""
    message = o.error or "the request failed"
    if message.startswith(ENGINE_DEAD):
        return APIError(503, ErrorCode.ENGINE_FAILED, message)
    if message.startswith(ENGINE_FAILURE):
        return APIError(500, ErrorCode.ENGINE_FAILED, message)
    return bad_request(message)


def _raise_errors(finals) -> None:
    for o in finals:
        if o.finish_reason == "error":
            raise _error(o)


async def _stream(state: ServerState, group: RequestGroup, rid: str, model: str, chat: bool, want_logprobs: bool,
                  include_usage: bool, prompt_tokens: int, times: tuple | None = None):
    """SSE: one chunk per choice per step that brings text (or ends it), then usage, then [DONE].
    A stream that is behind its engine requests (the HTTP process or the client slower than the
    engine's steps) sends everything that has queued up for a choice as one chunk: its text and
    logprob rows concatenated (R.merge_outputs), so that the cost per chunk is paid per catch-up,
    not per token. Cancelled when the client disconnects: `finally` aborts what is still running.
    times: (handler start, submission, engine requests) when TG_SERVE_TRACE is on: the request's
    trace line is written at the end (the last take and write times, profiling.RequestTrace)."""
    completion_tokens = [0] * len(group.request_ids)
    offsets = [0] * len(group.request_ids)
    chunks = R.ChunkWriter(rid, model, chat)
    t_taken = t_written = t_done = float("nan")
    try:
        if chat:  # the role comes first, once per choice
            for i in range(len(group.request_ids)):
                yield chunks.chat(i, {"role": "assistant", "content": ""}, None, None)
        while not group.done:
            outs = await group.take()
            if times is not None:
                t_taken = time.perf_counter()
            for m in R.merge_outputs(outs, want_logprobs):
                i = group.index[m.request_id]
                if m.failed:
                    yield R.sse(_error(m).body())
                    continue
                if m.finish is not None:  # (a running request's outputs count this step's tokens only)
                    completion_tokens[i] = m.num_tokens
                if not m.text and m.finish is None and not m.rows:
                    continue
                if chat:
                    lp = R.chat_logprobs(m.rows, state.token_str) if want_logprobs else None
                    yield chunks.chat(i, {"content": m.text} if m.text or m.finish is None else {}, m.finish, lp)
                else:
                    lp = R.completion_logprobs(m.rows, state.token_str, offsets[i]) if want_logprobs else None
                    yield chunks.completion(i, m.text, m.finish, lp)
                offsets[i] += len(m.text)
            if times is not None:  # (resumed: the server has taken this take's chunks)
                t_written = time.perf_counter()
        if include_usage:
            yield chunks.usage(prompt_tokens, sum(completion_tokens))
        yield R.sse("[DONE]")
        if times is not None:
            t_done = time.perf_counter()
    finally:
        group.abort()
        if times is not None:
            state.trace.record(*times, group.t_put, t_taken, t_written, t_done, rid)
