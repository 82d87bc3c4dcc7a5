"""Chat prompts and a checkpoint's generation defaults.

`render_chat` turns OpenAI-style messages into the prompt text the model was trained on, through
the tokenizer's own `chat_template` (transformers' apply_chat_template); `load_generation_defaults`
reads a checkpoint's generation_config.json (sampling defaults and extra stop ids). The server
(text_generator/serve) uses both; neither needs the server.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field


class ChatTemplateError(ValueError):
    """The tokenizer cannot render these messages (no chat_template, or the template refused them)."""


@dataclass
class GenerationDefaults:
    """What a checkpoint's generation_config.json says about sampling (None: not set).

    stop_token_ids: its eos_token_id (an int or a list), as extra stop tokens
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] = field(default_factory=list)


def load_generation_defaults(model_dir: str) -> GenerationDefaults:
    """generation_config.json of model_dir -> GenerationDefaults (all None when the file is absent).

    transformers writes do_sample=False with sampling fields left at their library defaults, so a
    checkpoint that does not sample is read as temperature 0 (greedy)."""
    path = os.path.join(model_dir, "generation_config.json")
    if not os.path.isfile(path):
        return GenerationDefaults()
    with open(path) as f:
        cfg = json.load(f)
    eos = cfg.get("eos_token_id")
    stop = [eos] if isinstance(eos, int) else [int(t) for t in eos or []]
    temperature = cfg.get("temperature")
    if cfg.get("do_sample") is False and "temperature" not in cfg:
        temperature = 0.0
    return GenerationDefaults(
        temperature=temperature, top_p=cfg.get("top_p"), top_k=cfg.get("top_k"),
        max_new_tokens=cfg.get("max_new_tokens"), repetition_penalty=cfg.get("repetition_penalty"),
        stop_token_ids=stop)


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """messages [{"role", "content"}, ...] -> the prompt text, by the tokenizer's chat_template.

    Raises ChatTemplateError when the tokenizer has no chat_template (or no apply_chat_template)
    or the template rejects the messages. The text already holds the template's special tokens:
    encode it without adding BOS again (add_special_tokens=False)."""
    if not getattr(tokenizer, "chat_template", None) or not hasattr(tokenizer, "apply_chat_template"):
        raise ChatTemplateError("messages: expected a model whose tokenizer has a chat_template, got a "
                                "tokenizer without one (use /v1/completions with a plain prompt)")
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - jinja raises its own exceptions (raise_exception in templates)
        raise ChatTemplateError(f"messages: the chat template refused them: {e}") from None
    if not isinstance(text, str):
        raise ChatTemplateError(f"messages: expected the chat template to give text, got {type(text).__name__}")
    return text
