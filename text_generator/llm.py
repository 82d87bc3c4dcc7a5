"""LLM: offline generation in three lines, over the reference engine.

    llm = LLM("path/to/checkpoint", device="cpu")
    outs = llm.generate(["Hello", "The sky is"], SamplingParams(temperature=0, max_new_tokens=16))
    outs = llm.chat([{"role": "user", "content": "Hi!"}], SamplingParams(max_new_tokens=32))

It loads a local checkpoint (TextGenerator.from_pretrained) and its tokenizer
(text_generator.tokenizer.load_tokenizer), builds an LLMEngine that sizes its own KV cache,
and runs the prompts to completion with continuous batching; outputs are the engine's
RequestOutputs, in prompt order. chat renders conversations with the tokenizer's chat template
(transformers' apply_chat_template) first.
"""

from __future__ import annotations

from typing import Sequence

from text_generator.engine import LLMEngine, RequestOutput
from text_generator.errors import ErrorCode, ForwardArgumentError
from text_generator.sampling import SamplingParams

Message = dict  # {"role": ..., "content": ...}


class LLM:
    """Owns a TextGenerator, its tokenizer (or None) and one LLMEngine.

    model:     a local Hugging Face checkpoint folder
    device, dtype, attention_backend, progress, quantization: as TextGenerator.from_pretrained
    tokenizer: a tokenizer object to use instead of the checkpoint's own
    engine_kw: LLMEngine's keywords (num_blocks, block_size, max_num_seqs, max_seq_len,
               enable_prefix_caching, speculative, ...)
    """

    def __init__(self, model: str, *, device=None, dtype=None, attention_backend: str = "auto", tokenizer=None,
                 progress: bool = True, quantization: str | None = None, **engine_kw):
        from text_generator.generator import TextGenerator
        from text_generator.tokenizer import load_tokenizer

        self.generator = TextGenerator.from_pretrained(model, device=device, dtype=dtype,
                                                       attention_backend=attention_backend, progress=progress,
                                                       quantization=quantization)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        self.engine = LLMEngine(self.generator, tokenizer=self.tokenizer, **engine_kw)

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        adapters: str | Sequence[str | None] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Complete prompts: one str, one list of token ids, or a list of either. params: one
        SamplingParams for all, or one per prompt (None: SamplingParams()). A problem with one
        prompt finishes it with finish_reason "error"; the others run."""
        if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts
                                        and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        return self.engine.generate(list(prompts), params, adapters=adapters, use_tqdm=use_tqdm)

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        adapters: str | Sequence[str | None] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Answer conversations: one list of {"role", "content"} messages, or a list of them.
        Each is rendered with the tokenizer's chat template, ending in the assistant's turn."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [self.render_chat(c) for c in conversations]
        return self.engine.generate(prompts, params, adapters=adapters, use_tqdm=use_tqdm)

    def render_chat(self, messages: Sequence[Message]) -> list[int]:
        """One conversation -> prompt token ids, through the tokenizer's chat template (with the
        generation prompt). Raises ForwardArgumentError(NO_CHAT_TEMPLATE) if there is none."""
        return render_chat(self.tokenizer, messages)


def render_chat(tokenizer, messages: Sequence[Message]) -> list[int]:
    """messages -> prompt ids with tokenizer's chat template (transformers' apply_chat_template)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        what = "no tokenizer" if tokenizer is None else f"a {type(tokenizer).__name__} without a chat_template"
        raise ForwardArgumentError(ErrorCode.NO_CHAT_TEMPLATE, "messages",
                                   f"expected a tokenizer with a chat template, got {what}; pass plain prompts "
                                   f"to generate, or set tokenizer.chat_template")
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise ForwardArgumentError(ErrorCode.INVALID_TYPE, "messages",
                                   "expected a list of {'role': ..., 'content': ...} dicts")
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    # the template writes any BOS itself: encoding must not add a second
    return list(tokenizer.encode(text, add_special_tokens=False))
