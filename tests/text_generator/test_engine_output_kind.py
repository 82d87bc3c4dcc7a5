"""LLMEngine(output_kind=...): "cumulative" outputs are snapshots of everything so far, "delta" ones
carry a running request's new tokens and logprob rows only; both end with the whole output, which is
transformers' greedy generate with log_softmax logprobs (the tiny random Llama and BPE tokenizer of
conftest). Run ahead (the CUDA default) as well as in the plain order."""

from __future__ import annotations

import pytest
import torch

from conftest import hf_generate, hf_model

pytestmark = pytest.mark.usefixtures("one_thread")

N_NEW = 7


@pytest.fixture(scope="module")
def setup(bpe_checkpoint, bpe_tokenizer):
    model = hf_model(bpe_checkpoint)
    prompts = [bpe_tokenizer.encode(t) for t in ("a short prompt", "another, somewhat longer prompt here")]
    truth = []
    for ids in prompts:
        new = hf_generate(model, ids, N_NEW)
        with torch.no_grad():
            logits = model(torch.tensor([ids + new])).logits[0, len(ids) - 1:len(ids) + N_NEW - 1].float()
        rows = torch.log_softmax(logits, -1)
        truth.append((new, [float(rows[i, t]) for i, t in enumerate(new)], rows))
    return bpe_checkpoint, bpe_tokenizer, prompts, truth


def run(setup, output_kind: str, async_scheduling: bool):
    from text_generator import LLMEngine, SamplingParams, TextGenerator

    path, tok, prompts, _ = setup
    engine = LLMEngine(TextGenerator.from_pretrained(path, device="cpu"), num_blocks=64, block_size=4,
                       tokenizer=tok, freeze_gc=False, output_kind=output_kind, async_scheduling=async_scheduling)
    params = SamplingParams(temperature=0, max_new_tokens=N_NEW, ignore_eos=True, logprobs=2)
    ids = [engine.add_request(p, params) for p in prompts]
    steps = []
    while engine.has_unfinished():
        steps.append(engine.step())
    return ids, steps


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["plain", "run_ahead"])
def test_delta_outputs_carry_each_steps_tokens_and_rows_and_the_final_one_all(setup, async_scheduling):
    _, tok, prompts, truth = setup
    ids, steps = run(setup, "delta", async_scheduling)
    for rid, ids_, (new, lps, rows) in zip(ids, prompts, truth):
        outs = [o for step in steps for o in step if o.request_id == rid]
        *running, final = outs
        assert final.finished and not any(o.finished for o in running)
        for o in running:
            assert o.token_ids == o.new_token_ids and len(o.logprobs) == len(o.top_logprobs) == len(o.new_token_ids)
        assert [t for o in outs for t in o.new_token_ids] == new == final.token_ids
        assert [lp for o in running for lp in o.logprobs] + final.logprobs[-len(final.new_token_ids):] \
            == pytest.approx(lps, abs=1e-4)
        assert final.logprobs == pytest.approx(lps, abs=1e-4)
        for top, row in zip(final.top_logprobs, rows):
            assert sorted(top.values(), reverse=True) == pytest.approx(row.topk(2).values.tolist(), abs=1e-4)
        assert "".join(o.delta_text for o in outs) == final.text == tok.decode(new)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["plain", "run_ahead"])
def test_cumulative_outputs_are_snapshots_that_later_steps_leave_alone(setup, async_scheduling):
    _, tok, prompts, truth = setup
    ids, steps = run(setup, "cumulative", async_scheduling)
    for rid, (new, lps, _) in zip(ids, truth):
        outs = [o for step in steps for o in step if o.request_id == rid]
        for k, o in enumerate(outs):  # each held output still shows exactly the tokens of its step
            assert o.token_ids == new[:k + 1] and o.logprobs == pytest.approx(lps[:k + 1], abs=1e-4)
            assert len(o.top_logprobs) == k + 1
        assert outs[-1].finished and outs[-1].text == tok.decode(new)


def test_an_unknown_output_kind_is_refused_naming_it(setup):
    from text_generator import LLMEngine, TextGenerator

    gen = TextGenerator.from_pretrained(setup[0], device="cpu")
    with pytest.raises(ValueError, match=r"output_kind: expected 'cumulative' or 'delta', got 'final'"):
        LLMEngine(gen, num_blocks=8, block_size=4, freeze_gc=False, output_kind="final")
