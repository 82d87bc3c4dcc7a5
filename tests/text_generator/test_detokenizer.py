"""Incremental detokenization (text_generator/engine/detokenizer.py) and the engine's text: the
deltas of a token stream add up to the tokenizer's own decode of all its ids, text once reported
never changes, and stop strings cut exactly, across token boundaries."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import hf_generate, hf_model
from text_generator import TextGenerator
from text_generator.engine import LLMEngine
from text_generator.engine.detokenizer import ByteDetokenizer, WindowDetokenizer, make_detokenizer
from text_generator.sampling import SamplingParams
from text_generator.tokenizer import ByteTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _stream(detok, ids: list[int]) -> list[str]:
    """Each step's text, then the flush."""
    return [detok.step(t) for t in ids] + [detok.flush()]


def test_window_deltas_add_up_to_the_full_decode_of_random_streams(bpe_tokenizer):
    tok = bpe_tokenizer
    rng = random.Random(0)
    vocab = len(tok)
    n_incomplete = 0
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        pieces = _stream(WindowDetokenizer(tok), ids)
        full = tok.decode(ids, skip_special_tokens=True)
        assert "".join(pieces) == full, ids
        n_incomplete += "\ufffd" in full
    assert n_incomplete > 0  # the streams did split multi-byte characters


def test_window_deltas_of_real_text_never_show_half_characters(bpe_tokenizer):
    tok = bpe_tokenizer
    text = "Grüße 🙂 日本語のテキスト, naïve café 🚀!"
    ids = tok.encode(text)
    assert len(ids) > len(text) // 3  # several tokens per multi-byte word
    pieces = _stream(WindowDetokenizer(tok), ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_byte_detokenizer_matches_the_byte_tokenizer():
    tok = ByteTokenizer()
    rng = random.Random(1)
    for _ in range(300):
        ids = [rng.randrange(258 + 4) for _ in range(rng.randint(1, 30))]  # bytes, BOS, EOS, padding ids
        assert "".join(_stream(ByteDetokenizer(), ids)) == tok.decode(ids)
    assert isinstance(make_detokenizer(tok), ByteDetokenizer)
    text = "héllo ✓ 🙂"
    pieces = _stream(make_detokenizer(tok), tok.encode(text))
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


# the engine's text over a model whose vocabulary is the BPE tokenizer's ---------------------------


@pytest.fixture(scope="module")
def bpe_ckpt(bpe_checkpoint):
    return bpe_checkpoint


@pytest.fixture(scope="module")
def greedy_ref(bpe_ckpt):
    """prompt ids -> transformers' greedy continuation of n tokens."""
    model = hf_model(bpe_ckpt)
    return lambda prompt, n: hf_generate(model, prompt, n)


def _run(engine, prompt, params):
    stream = []
    rid = engine.add_request(prompt, params, stream_callback=stream.append)
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished and o.request_id == rid:
                final = o
    return final, stream


@pytest.mark.parametrize("run_ahead", [False, True])
def test_engine_text_is_the_decode_of_its_tokens(bpe_ckpt, bpe_tokenizer, greedy_ref, run_ahead):
    tok = bpe_tokenizer
    gen = TextGenerator.from_pretrained(bpe_ckpt, device="cpu", dtype=torch.float32)
    engine = LLMEngine(gen, num_blocks=32, block_size=4, tokenizer=tok, async_scheduling=run_ahead)
    prompt = tok.encode("Grüße 🙂")
    ref = greedy_ref(prompt, 24)
    final, stream = _run(engine, prompt, SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True))
    assert final.token_ids == ref
    assert final.text == tok.decode(ref, skip_special_tokens=True)
    assert "".join(s.delta_text for s in stream) == final.text
    seen = ""
    for s in stream:  # the running text only grows
        assert s.text == seen + s.delta_text
        seen = s.text


@pytest.mark.parametrize("run_ahead", [False, True])
def test_stop_strings_spanning_tokens_cut_the_text_exactly(bpe_ckpt, bpe_tokenizer, greedy_ref, run_ahead):
    tok = bpe_tokenizer
    gen = TextGenerator.from_pretrained(bpe_ckpt, device="cpu", dtype=torch.float32)
    prompt = tok.encode("naïve café")
    ref = greedy_ref(prompt, 24)
    full = tok.decode(ref, skip_special_tokens=True)
    # a stop string made of the last character of one token's text and the first of the next
    ends = [len(tok.decode(ref[:j], skip_special_tokens=True)) for j in range(1, len(ref))]
    boundary = next(e for e in ends[len(ends) // 3:] if 0 < e < len(full) - 1 and "\ufffd" not in full[e - 1:e + 2])
    stops = [full[boundary - 1:boundary + 1], full[boundary - 1:boundary + 2] + "never"]  # the second never matches
    cut = full.index(stops[0])
    engine = LLMEngine(gen, num_blocks=32, block_size=4, tokenizer=tok, async_scheduling=run_ahead)
    final, stream = _run(engine, prompt, SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True,
                                                        stop=stops))
    assert final.finish_reason == "stop"
    assert final.text == full[:cut]
    assert "".join(s.delta_text for s in stream) == final.text
    assert final.token_ids == ref[:len(final.token_ids)]
    # the request ends on the token that completes the stop string, not later
    assert len(tok.decode(final.token_ids[:-1], skip_special_tokens=True)) < cut + len(stops[0])
    assert len(tok.decode(final.token_ids, skip_special_tokens=True)) >= cut + len(stops[0])
