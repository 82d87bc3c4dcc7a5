"""EAGLE-3 inside LLMEngine: the engine hands the target's hidden states to the drafter
(speculative/hidden_feed.py) and greedy output stays plain greedy.

Oracles: transformers' greedy generate for every output; for every chain the head proposes, the
plain-torch head of test_eagle3 (oracle_chain) run on transformers' output_hidden_states of the
request's verified context, which is what the engine must have fed it. Random heads (no trained
one can be had here): their drafts are mostly rejected, so adaptive speculation is switched off
in some runs to keep every step drafting."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import hf_generate, hf_model
from test_eagle3 import VOCAB, RecordingDrafter, make_head, oracle_chain
from test_engine import SpyGenerator
from test_speculative_engine import serve
from text_generator import TextGenerator
from text_generator.engine import LLMEngine
from text_generator.sampling import SamplingParams
from text_generator.speculative.eagle3 import Eagle3Drafter

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target8(checkpoint_dir):
    path = checkpoint_dir("llama", num_hidden_layers=8)
    return TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32, attention_backend="torch"), \
        hf_model(path)


def hf_states(hf, tokens: list[int]) -> torch.Tensor:
    """transformers' hidden states 2, 4, 5 (the head's default) of tokens -> [len, 3, H]."""
    with torch.no_grad():
        hs = hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    return torch.stack([hs[i][0] for i in (2, 4, 5)], dim=1)


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_eagle3_in_the_engine_is_plain_greedy_and_drafts_from_the_true_states(target8, tmp_path, run_ahead,
                                                                                adaptive):
    """Staggered arrivals, a token budget that chunks the prompts, a sampled request alongside:
    outputs are transformers' greedy ones, and every chain is the head's from the true states
    (also when steps run ahead of their tokens, the states of a launched step waiting for them)."""
    gen, hf = target8
    t = make_head(tmp_path / "head", seed=3)
    drafter = RecordingDrafter(gen, str(tmp_path / "head"), k=3, num_blocks=64, block_size=4)
    drafter.log = []
    rng = random.Random(8)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 17))] for _ in range(5)]
    n = 12
    params = [SamplingParams(temperature=0.0, max_new_tokens=n)] * 4 + \
        [SamplingParams(temperature=0.8, seed=3, max_new_tokens=n)]
    spy = SpyGenerator(gen)
    engine = LLMEngine(spy, num_blocks=96, block_size=4, max_num_batched_tokens=10, speculative=drafter,
                       adaptive_speculation=adaptive, async_scheduling=run_ahead, enable_prefix_caching=False)
    outs = serve(engine, prompts, params, [0, 0, 1, 2, 2])
    for p, o in zip(prompts[:4], outs):
        assert o.token_ids == hf_generate(hf, p, n), o.error
    assert engine.num_draft_tokens >= (30 if not adaptive else 4) and drafter.log
    assert drafter.bm.num_used_blocks == 0 and not drafter._seqs
    if run_ahead and adaptive:  # drafting stopped: steps ran ahead, the states waiting for their tokens
        assert sum(c["device_rows"] > 0 for c in spy.calls) >= 5
    embed = gen.model_wrapper.model.model.embed_tokens.weight.float()
    for context, tokens in drafter.log:
        want = oracle_chain(t, embed, hf_states(hf, context[:-1]), context, len(tokens) - 1)
        assert tokens == [context[-1]] + want


def test_eagle3_trees_with_prefix_cache_hits_and_preemption_stay_plain_greedy(target8, tmp_path):
    """Trees of 3 branches; the second round's prompts are held by the prefix cache (the head
    drafts from the suffix's states); a pool small enough to preempt (the request is computed
    again and its drafting starts afresh)."""
    gen, hf = target8
    make_head(tmp_path / "head", seed=5)
    drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=2, branches=3, num_blocks=96, block_size=4)
    rng = random.Random(9)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(5, 13))] for _ in range(4)]
    n = [10, 14, 8, 12]
    want = [hf_generate(hf, p, k) for p, k in zip(prompts, n)]
    engine = LLMEngine(gen, num_blocks=18, block_size=4, watermark=0.0, speculative=drafter,
                       adaptive_speculation=False, async_scheduling=False)
    params = [SamplingParams(temperature=0.0, max_new_tokens=k) for k in n]
    assert [o.token_ids for o in serve(engine, prompts, params, [0, 0, 1, 1])] == want
    assert engine.num_preemptions > 0
    assert [o.token_ids for o in serve(engine, prompts, params, [0, 1, 2, 3])] == want
    assert engine.num_draft_tokens > 40 and drafter.bm.num_used_blocks == 0
