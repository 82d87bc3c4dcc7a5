"""text_generator/chat.py: generation_config.json defaults and chat-template rendering, against
transformers' own reading of the same files."""

from __future__ import annotations

import json

import pytest

from serve_fixtures import make_tokenizer
from text_generator.chat import ChatTemplateError, load_generation_defaults, render_chat


def write_config(path, cfg: dict) -> str:
    (path / "generation_config.json").write_text(json.dumps(cfg))
    return str(path)


def test_generation_defaults_read_sampling_fields_and_eos_as_stop_ids(tmp_path):
    d = load_generation_defaults(write_config(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.9,
                                                         "top_k": 20, "max_new_tokens": 99,
                                                         "eos_token_id": [2, 7]}))
    assert (d.temperature, d.top_p, d.top_k, d.max_new_tokens, d.stop_token_ids) == (0.6, 0.9, 20, 99, [2, 7])
    assert load_generation_defaults(write_config(tmp_path, {"eos_token_id": 5})).stop_token_ids == [5]


def test_generation_defaults_without_a_file_or_with_do_sample_false(tmp_path):
    d = load_generation_defaults(str(tmp_path))
    assert (d.temperature, d.top_p, d.max_new_tokens, d.stop_token_ids) == (None, None, None, [])
    assert load_generation_defaults(write_config(tmp_path, {"do_sample": False})).temperature == 0.0


def test_transformers_writes_what_load_generation_defaults_reads(tmp_path):
    from transformers import GenerationConfig

    GenerationConfig(do_sample=True, temperature=0.7, top_k=11, eos_token_id=[3, 4]).save_pretrained(str(tmp_path))
    d = load_generation_defaults(str(tmp_path))
    assert (d.temperature, d.top_k, d.stop_token_ids) == (0.7, 11, [3, 4])


def test_render_chat_is_the_tokenizers_template_and_refuses_a_tokenizer_without_one():
    tok = make_tokenizer()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    assert render_chat(tok, messages) == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_chat(tok, messages, add_generation_prompt=False).endswith("</s>")
    with pytest.raises(ChatTemplateError, match="messages: expected a model whose tokenizer has a chat_template"):
        render_chat(make_tokenizer(chat_template=None), messages)
