"""LLM (text_generator/llm.py): generate and chat over a local checkpoint equal transformers'
greedy generate on the same tiny random checkpoint and its locally trained tokenizer."""

from __future__ import annotations

import pytest
import torch

from conftest import hf_generate, hf_model
from text_generator import LLM, ErrorCode, ForwardArgumentError, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def llm(bpe_checkpoint):
    return LLM(bpe_checkpoint, device="cpu", dtype=torch.float32, block_size=4, max_num_seqs=4, freeze_gc=False)


@pytest.fixture(scope="module")
def hf_greedy(bpe_checkpoint):
    model = hf_model(bpe_checkpoint)
    return lambda ids, n: hf_generate(model, ids, n)


def test_generate_greedy_equals_transformers(llm, bpe_tokenizer, hf_greedy):
    tok = bpe_tokenizer
    prompts = ["Grüße aus Köln", "the quick brown fox", "日本語", "a"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True))
    assert [o.prompt_token_ids for o in outs] == [tok.encode(p) for p in prompts]
    for p, o in zip(prompts, outs):
        ref = hf_greedy(tok.encode(p), 12)
        assert o.token_ids == ref and o.finish_reason == "length"
        assert o.text == tok.decode(ref, skip_special_tokens=True)


def test_generate_takes_one_prompt_token_ids_and_per_prompt_params(llm, hf_greedy):
    (one,) = llm.generate([5, 6, 7], SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True))
    assert one.token_ids == hf_greedy([5, 6, 7], 4)
    a, b = llm.generate(["x", "y"], [SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True) for n in (2, 5)])
    assert len(a.token_ids) == 2 and len(b.token_ids) == 5


def test_chat_renders_the_template_and_matches_transformers(bpe_checkpoint, bpe_tokenizer, hf_greedy):
    tok = bpe_tokenizer
    llm = LLM(bpe_checkpoint, device="cpu", dtype=torch.float32, block_size=4, max_num_seqs=2, freeze_gc=False,
              tokenizer=_with_template(tok))
    convs = [[{"role": "user", "content": "Grüße!"}],
             [{"role": "system", "content": "be brief"}, {"role": "user", "content": "naïve café?"}]]
    outs = llm.chat(convs, SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))
    for conv, o in zip(convs, outs):
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in conv) + "<|assistant|>"
        ids = tok.encode(text)
        assert o.prompt_token_ids == ids
        assert o.token_ids == hf_greedy(ids, 6)
    (single,) = llm.chat(convs[0], SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True))
    assert single.token_ids == outs[0].token_ids


def _with_template(tok):
    import copy

    t = copy.deepcopy(tok)
    t.chat_template = CHAT_TEMPLATE
    return t


def test_chat_without_a_template_is_refused_with_a_code(llm):
    with pytest.raises(ForwardArgumentError) as err:
        llm.chat([{"role": "user", "content": "hi"}])
    assert err.value.code is ErrorCode.NO_CHAT_TEMPLATE and "chat template" in str(err.value)
    assert not llm.engine.has_unfinished() and not llm.engine.requests  # nothing was queued
