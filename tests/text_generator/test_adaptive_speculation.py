"""Adaptive speculation (text_generator/speculative/adaptive.py) inside LLMEngine.

Oracles: transformers' greedy generate (conftest.hf_generate) for every output, whatever the
drafts were (always wrong, always right, mixed, wrong then right), at batch > 1 in both
scheduling orders; for the draft-length state machine, the rules its docstring states, replayed
by hand step by step."""

from __future__ import annotations

import pytest

from conftest import hf_generate
from test_engine import SpyGenerator
from test_speculative_engine import VOCAB, ScriptedDrafter, make_prompts, serve
from test_speculative_engine import ckpt, gen, hf  # noqa: F401 - the fixtures (tiny llama, TextGenerator, transformers)
from text_generator.engine import LLMEngine
from text_generator.sampling import SamplingParams
from text_generator.speculative import AdaptiveSpeculation, DraftTree
from text_generator.speculative.adaptive import DraftLengths

pytestmark = pytest.mark.usefixtures("one_thread")
N_NEW = 24


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(7, 6)


@pytest.fixture(scope="module")
def truth(hf, prompts):
    return {tuple(p): hf_generate(hf, p, N_NEW) for p in prompts}


class PhasedDrafter(ScriptedDrafter):
    """Drafts from the known greedy continuation (`truth`: prompt tuple -> tokens) as a chain of
    as many tokens as the budget allows, the first `right(i, n)` of them true and the rest wrong,
    for the request of prompt i with n output tokens so far. Records every budget it was given
    (one list for all requests). Keeps ScriptedDrafter's start, update and finish."""

    def __init__(self, truth: dict, right):
        self.truth, self.right = truth, right
        self.ctx, self.which, self.budgets = {}, {}, []

    def propose(self, seq_ids, budgets):
        out = []
        for s, b in zip(seq_ids, budgets):
            self.budgets.append(b)
            i, ctx = self.which[s], self.ctx[s]
            prompt = list(self.truth)[i]
            n = len(ctx) - len(prompt)
            true = list(self.truth[prompt])[n:n + b - 1]
            right = self.right(i, n)
            out.append(DraftTree.chain([ctx[-1]] + [t if j < right else (t + 1 + j) % VOCAB for j, t in enumerate(true)]))
        return out


DRAFTS = {
    "wrong": lambda i, n: 0,
    "right": lambda i, n: 99,
    "mixed": lambda i, n: [0, 99, 1, 2, 0, 99][i],  # per request: none, all, one, two right
    "wrong_then_right": lambda i, n: 0 if n < 10 else 99,
}


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
@pytest.mark.parametrize("drafts", list(DRAFTS))
def test_adaptive_speculation_keeps_transformers_greedy_output(gen, prompts, truth, drafts, run_ahead):
    spy = SpyGenerator(gen)
    drafter = PhasedDrafter(truth, DRAFTS[drafts])
    engine = LLMEngine(spy, num_blocks=128, block_size=4, speculative=drafter, async_scheduling=run_ahead)
    outs = serve(engine, prompts, [SamplingParams(temperature=0.0, max_new_tokens=N_NEW)] * len(prompts),
                 [0, 0, 0, 1, 1, 3])
    for p, o in zip(prompts, outs):
        assert o.token_ids == truth[tuple(p)], o.error
    decode = [c for c in spy.calls if not c["is_prefill"]]
    verify = [c for c in decode if max(c["q_lens"]) > 1]
    assert all(c["device_rows"] == 0 for c in verify)  # a drafting step waits for its tokens
    if drafts == "right":
        # drafting never stops, and the lengths grow to the tree cap: few steps for 24 tokens each
        assert engine.num_accepted_tokens == engine.num_draft_tokens > 3 * len(prompts) * N_NEW // 4
        assert max(drafter.budgets) == 16
    if drafts == "wrong":
        assert engine.num_accepted_tokens == 0
        # each request drafts a full chain, then one token (patience 2), then one-token probes
        # at steps 4, 8, 16, 32 at most
        assert engine.num_draft_tokens <= len(prompts) * (15 + 1 + 4)
    if drafts == "wrong_then_right":
        assert engine.num_accepted_tokens > 0  # a probe found the right drafts: drafting resumed
    if run_ahead and drafts == "wrong":
        # the steps in which nobody drafts run ahead of their tokens
        assert sum(c["device_rows"] > 0 for c in decode) >= len(decode) // 2


def test_without_adaptation_every_step_drafts_the_full_length(gen, prompts, truth):
    drafter = PhasedDrafter(truth, DRAFTS["wrong"])
    engine = LLMEngine(gen, num_blocks=128, block_size=4, speculative=drafter, adaptive_speculation=False,
                       async_scheduling=True)
    outs = serve(engine, prompts[:3], [SamplingParams(temperature=0.0, max_new_tokens=N_NEW)] * 3, [0, 0, 0])
    assert [o.token_ids for o in outs] == [truth[tuple(p)] for p in prompts[:3]]
    # every decode step drafts at full length but the last (one token left)
    assert engine.num_accepted_tokens == 0 and len(drafter.budgets) == 3 * (N_NEW - 2)
    assert drafter.budgets[0] == 16


def test_draft_lengths_follow_the_documented_rules():
    p = AdaptiveSpeculation(alpha=0.5, min_acceptance=0.2, patience=2, min_backoff=4, max_backoff=16, probe_length=1)
    d = DraftLengths(p, 15)
    d.add("a")
    assert d.wanted("a", 1) == 15
    d.record("a", 1, 4, 4)  # all accepted, shorter than the length: unchanged
    assert d.wanted("a", 2) == 15
    d.record("a", 2, 15, 6)  # some rejected: accepted + 1
    assert d.wanted("a", 3) == 7
    d.record("a", 3, 7, 7)  # all accepted at the full length: doubles, capped
    assert d.wanted("a", 4) == 14
    d.record("a", 4, 14, 14)
    assert d.wanted("a", 5) == 15
    d.record("a", 5, 15, 0)  # one miss: length 1 (acceptance 0.46)
    assert d.wanted("a", 6) == 1
    d.record("a", 6, 1, 0)  # the second miss in a row: stopped at step 6
    assert [s for s in range(6, 40) if d.wanted("a", s)] == [8, 12, 16, 20, 24, 28, 32, 36]
    d.record("a", 8, 1, 0)  # failed probe: backoff 8, from step 8
    assert [s for s in range(8, 40) if d.wanted("a", s)] == [16, 24, 32]
    d.record("a", 16, 1, 0)  # 16
    d.record("a", 32, 1, 0)  # capped at max_backoff 16
    assert [s for s in range(32, 70) if d.wanted("a", s)] == [48, 64]
    d.record("a", 48, 1, 1)  # a probe accepted: drafting at 2 * probe_length, backoff back to 4
    assert d.wanted("a", 49) == 2
    d.record("a", 49, 2, 0)
    d.record("a", 50, 1, 0)
    assert [s for s in range(50, 60) if d.wanted("a", s)] == [52, 56]
    # low acceptance alone stops too (patience 10): the average falls below min_acceptance
    d = DraftLengths(AdaptiveSpeculation(patience=10), 15)
    d.add("b")
    d.record("b", 1, 15, 1)  # acceptance 0.5 * 1 + 0.5 / 15 = 0.53: length 2
    assert d.wanted("b", 2) == 2
    d.record("b", 2, 2, 0)  # 0.27: length 1
    assert d.wanted("b", 3) == 1
    d.record("b", 3, 1, 0)  # 0.13 < 0.2 after two misses of ten: stopped
    assert d.wanted("b", 4) == 1 and [s for s in range(4, 12) if d.wanted("b", s)] == [4, 8]
    d.remove("b")
    assert d.wanted("b", 8) == 0
    # no policy: always the full length
    n = DraftLengths(None, 15)
    n.add("c")
    n.record("c", 1, 15, 0)
    assert n.wanted("c", 2) == 15


@pytest.mark.parametrize("kw,name", [(dict(alpha=0.0), "alpha"), (dict(min_acceptance=1.0), "min_acceptance"),
                                     (dict(patience=0), "patience"), (dict(min_backoff=3), "min_backoff"),
                                     (dict(min_backoff=8, max_backoff=4), "max_backoff"),
                                     (dict(probe_length=0), "probe_length")])
def test_bad_thresholds_are_refused_by_name(kw, name):
    with pytest.raises(ValueError, match=name):
        AdaptiveSpeculation(**kw)


def test_engine_refuses_a_bad_adaptive_speculation(gen):
    with pytest.raises(ValueError, match="adaptive_speculation"):
        LLMEngine(gen, num_blocks=16, block_size=4, adaptive_speculation="yes")


class NothingDrafter(PhasedDrafter):
    """Never has drafts (a lone root), like an n-gram lookup that finds nothing."""

    def propose(self, seq_ids, budgets):
        return [DraftTree.chain([self.ctx[s][-1]]) for s in seq_ids]


def test_a_request_that_stops_on_a_token_read_back_before_a_drafting_step(gen, prompts, truth):
    """Probing in every step (backoff 1) with a drafter that has nothing: every step is launched
    ahead, and the next, which wants drafts, reads it back first; requests whose stop token comes
    in that read-back leave the scheduled step before it runs. Outputs are transformers' greedy
    ones up to the stop token, and every block comes back."""
    policy = AdaptiveSpeculation(patience=1, min_backoff=1, max_backoff=1)
    spy = SpyGenerator(gen)
    engine = LLMEngine(spy, num_blocks=128, block_size=4, speculative=NothingDrafter(truth, DRAFTS["wrong"]),
                       adaptive_speculation=policy, async_scheduling=True)
    stops = [truth[tuple(p)][3 + 2 * i] for i, p in enumerate(prompts)]
    params = [SamplingParams(temperature=0.0, max_new_tokens=N_NEW, stop_token_ids=[s]) for s in stops]
    outs = serve(engine, prompts, params, [0, 0, 0, 1, 1, 3])
    for p, s, o in zip(prompts, stops, outs):
        want = truth[tuple(p)]
        assert o.token_ids == want[:want.index(s) + 1] and o.finish_reason == "stop"
    assert all(c["device_rows"] == 0 for c in spy.calls if not c["is_prefill"])  # every decode step read back first
