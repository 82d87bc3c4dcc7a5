"""OpenAI request fields -> SamplingParams, with the checkpoint's generation defaults underneath.

Precedence per field: the request, then generation_config.json (chat.load_generation_defaults),
then SamplingParams' own default. Every refusal is an APIError 400 naming the request field.
"""

from __future__ import annotations

import dataclasses
import json
import re

from text_generator.chat import GenerationDefaults
from text_generator.errors import ErrorCode
from text_generator.sampling import SamplingParams
from text_generator.serve.errors import APIError, bad_request
from text_generator.serve.protocol import _Sampling

# SamplingParams' names for the request fields that differ
_FIELD_NAMES = {"max_new_tokens": "max_tokens"}


def _pick(*values):
    return next((v for v in values if v is not None), None)


def max_new_tokens(requested: int | None, prompt_len: int, max_model_len: int, defaults: GenerationDefaults,
                   prompt_field: str) -> int:
    """The output budget of one prompt; refuses a prompt (or prompt + max_tokens) over max_model_len."""
    room = max_model_len - prompt_len
    if room < 1:
        raise APIError(400, ErrorCode.PROMPT_TOO_LONG,
                       f"{prompt_field}: expected at most {max_model_len - 1} tokens (max_model_len {max_model_len} "
                       f"minus one output token), got {prompt_len}", prompt_field)
    if requested is None:
        return min(room, defaults.max_new_tokens or room)
    if requested < 1:
        raise bad_request(f"max_tokens: expected an int >= 1, got {requested}", "max_tokens")
    if requested > room:
        raise APIError(400, ErrorCode.PROMPT_TOO_LONG,
                       f"max_tokens: expected at most {room} (max_model_len {max_model_len} - {prompt_len} prompt "
                       f"tokens), got {requested}", "max_tokens")
    return requested


def sampling_params(req: _Sampling, *, max_tokens: int, logprobs: int | None,
                    defaults: GenerationDefaults) -> SamplingParams:
    """One SamplingParams for the request (before per-choice seeds: see for_choices)."""
    stop_ids = list(req.stop_token_ids or [])
    if not req.ignore_eos:
        stop_ids += [t for t in defaults.stop_token_ids if t not in stop_ids]
    kw = dict(
        temperature=_pick(req.temperature, defaults.temperature, 1.0),
        top_p=_pick(req.top_p, defaults.top_p, 1.0),
        top_k=_pick(req.top_k, defaults.top_k, -1),
        min_p=_pick(req.min_p, 0.0),
        repetition_penalty=_pick(req.repetition_penalty, defaults.repetition_penalty, 1.0),
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        seed=req.seed, logprobs=logprobs, max_new_tokens=max_tokens, stop_token_ids=stop_ids,
        stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []), ignore_eos=req.ignore_eos)
    structured = structured_output(req)
    if structured is not None:
        kw["structured"] = structured
    try:
        return SamplingParams(**kw)
    except (ValueError, TypeError) as e:
        m = re.match(r"SamplingParams\.(\w+)", str(e))
        field = _FIELD_NAMES.get(m.group(1), m.group(1)) if m else None
        raise bad_request(str(e).replace("SamplingParams.", "", 1), field) from None


def for_choices(params: SamplingParams, n: int) -> list[SamplingParams]:
    """n independent choices: a seeded request gives choice j the seed + j (the same seed would
    make every choice the same)."""
    if params.seed is None:
        return [params] * n
    return [dataclasses.replace(params, seed=(params.seed + j) % 2**63) for j in range(n)]


def structured_output(req: _Sampling):
    """response_format / guided_json / guided_regex / guided_grammar -> a StructuredOutput, or None.
    400 when more than one is given, or when this build has no text_generator.structured."""
    spec, fields = {}, []
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        spec["json_object"], fields = True, fields + ["response_format"]
    elif rf is not None and rf.type == "json_schema":
        schema = (rf.json_schema or {}).get("schema")
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema: expected a JSON schema object, got "
                              f"{type(schema).__name__}", "response_format")
        spec["json_schema"], fields = schema, fields + ["response_format"]
    if req.guided_json is not None:
        schema = req.guided_json
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as e:
                raise bad_request(f"guided_json: expected a JSON schema, got invalid JSON ({e})", "guided_json") from None
        spec["json_schema"], fields = schema, fields + ["guided_json"]
    if req.guided_regex is not None:
        spec["regex"], fields = req.guided_regex, fields + ["guided_regex"]
    if req.guided_grammar is not None:
        spec["grammar"], fields = req.guided_grammar, fields + ["guided_grammar"]
    if not fields:
        return None
    if len(fields) > 1:
        raise bad_request(f"{fields[1]}: expected one structured-output constraint, got {' and '.join(fields)}",
                          fields[1])
    try:
        from text_generator.structured import StructuredOutput
    except ImportError:
        StructuredOutput = None
    if StructuredOutput is None or "structured" not in SamplingParams.__dataclass_fields__:
        raise APIError(400, ErrorCode.STRUCTURED_OUTPUT_UNAVAILABLE, f"{fields[0]}: structured output not available "
                       "in this build (no text_generator.structured, or SamplingParams has no structured field)",
                       fields[0])
    try:
        return StructuredOutput(**spec)
    except (ValueError, TypeError) as e:
        raise bad_request(f"{fields[0]}: {e}", fields[0]) from None
