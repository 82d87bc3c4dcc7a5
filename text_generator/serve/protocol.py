"""The OpenAI request schema the server accepts (pydantic), with vLLM's extension fields.

Requests are parsed here and turned into SamplingParams in params.py; responses are plain dicts
built in app.py (their shape is OpenAI's, and the official client parses them). Unknown fields
are ignored, as OpenAI's own server does for forward compatibility.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class ResponseFormat(_Request):
    """{"type": "text"} | {"type": "json_object"} | {"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}}"""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _Sampling(_Request):
    """Fields shared by completions and chat completions (OpenAI's, then vLLM's extensions)."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    response_format: ResponseFormat | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None  # refused when non-empty (not supported)
    # vLLM extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    guided_json: Union[str, dict[str, Any], None] = None
    guided_regex: str | None = None
    guided_grammar: str | None = None


class CompletionRequest(_Sampling):
    """POST /v1/completions. prompt: a string, token ids, or a list of either (a batch)."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(_Request):
    role: str
    content: Union[str, list[dict[str, Any]], None] = None
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None  # refused when non-empty (no tool calling)
    add_generation_prompt: bool = True


class LoadLoraRequest(_Request):
    """POST /v1/load_lora_adapter (vLLM's names)."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoraRequest(_Request):
    """POST /v1/unload_lora_adapter."""

    lora_name: str = Field(min_length=1)
