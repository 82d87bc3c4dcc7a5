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
from text_generator.speculative import DraftTree
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


class FollowedDrafter(Eagle3Drafter):
    """An Eagle3Drafter beside a `shadow` one on the same head that drafts after every update
    (the head following every token: one new entry per step). Each proposal of this one (a lazy
    catch-up over every entry pending since its last proposal, in one multi-token step) is
    compared with the shadow's drafts after the same context: log holds (entries caught up,
    this chain, the shadow's chain cut to its length, the largest |K/V| difference of the
    entries both committed, the context)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shadow = Eagle3Drafter(*args, **kwargs)
        self.log, self.head_steps, self.latest = [], 0, {}
        self.runner.forward = self._counted(self.runner.forward)

    def _counted(self, fn):
        def forward(*a, **k):
            self.head_steps += 1
            return fn(*a, **k)
        return forward

    def start(self, seq_id, prompt, hidden=None):
        super().start(seq_id, prompt, hidden=hidden)
        self.shadow.start(seq_id, prompt, hidden=hidden)

    def update(self, seq_id, emitted, hidden=None):
        super().update(seq_id, emitted, hidden=hidden)
        self.shadow.update(seq_id, emitted, hidden=hidden)
        self.latest[seq_id] = self.shadow.propose([seq_id], [self.k + 1])[0].tokens  # (entry written now)

    def finish(self, seq_id):
        super().finish(seq_id)
        self.shadow.finish(seq_id)

    def propose(self, seq_ids, budgets):
        pending = [self._seqs[s].num_pending() for s in seq_ids]
        trees = super().propose(seq_ids, budgets)
        for s, n, mine in zip(seq_ids, pending, trees):
            self.log.append((n, mine.tokens, self.latest[s][:mine.size], self._kv_gap(s),
                             list(self._seqs[s].context)))
        return trees

    def _kv_gap(self, s) -> float:
        """max |K/V| difference of the entries both heads committed for request s."""
        st, sh = self._seqs[s], self.shadow._seqs[s]
        n = st.computed - st.offset
        assert sh.computed - sh.offset == n
        if n == 0:
            return 0.0
        a, b = self.bm.slots(s, 0, n), self.shadow.bm.slots(s, 0, n)
        gap = 0.0
        for (k1, v1), (k2, v2) in zip(self.kv_cache, self.shadow.kv_cache):
            for x, y in ((k1, k2), (v1, v2)):
                gap = max(gap, (x.flatten(0, 1)[a] - y.flatten(0, 1)[b]).abs().max().item())
        return gap


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
def test_a_backed_off_head_catches_up_to_one_that_followed_every_step(target8, tmp_path, run_ahead):
    """A random head (its drafts rejected): adaptive speculation stops drafting and probes again
    at steps 4, 8, 16, 32. Meanwhile the head does not run; each probe writes every pending entry
    in one step. Its drafts and committed K/V are those of a head that ran every step (the
    shadow), its drafts the plain-torch head's on transformers' states of the whole context
    (the oracle), and the output is transformers' greedy one."""
    gen, hf = target8
    t = make_head(tmp_path / "head", seed=3)
    drafter = FollowedDrafter(gen, str(tmp_path / "head"), k=3, num_blocks=64, block_size=4)
    rng = random.Random(11)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 12))] for _ in range(3)]
    n = 40
    spy = SpyGenerator(gen)
    engine = LLMEngine(spy, num_blocks=96, block_size=4, speculative=drafter, async_scheduling=run_ahead,
                       enable_prefix_caching=False)
    steps_with_head = []
    ids = [engine.add_request(p, SamplingParams(temperature=0.0, max_new_tokens=n)) for p in prompts]
    finals = {}
    while engine.has_unfinished():
        before = drafter.head_steps
        finals.update({o.request_id: o for o in engine.step() if o.finished})
        if drafter.head_steps > before:
            steps_with_head.append(engine.num_steps)
    assert [finals[i].token_ids for i in ids] == [hf_generate(hf, p, n) for p in prompts]
    assert engine.num_accepted_tokens < engine.num_draft_tokens  # (a random head)
    # the head ran in a few steps only (the first drafting steps and the probes), not per token
    assert 4 <= len(steps_with_head) <= 12 < engine.num_steps // 2, steps_with_head
    caught_up = [entry for entry in drafter.log if entry[0] >= 8]
    assert len(caught_up) >= 3, [e[0] for e in drafter.log]  # probes after 8 and 16 steps backed off
    embed = gen.model_wrapper.model.model.embed_tokens.weight.float()
    for pending, mine, theirs, gap, context in drafter.log:
        assert len(mine) > 1 and mine == theirs, pending
        assert gap < 1e-4, (pending, gap)  # fp32: one multi-token step against single-token ones
    for pending, mine, _, _, context in caught_up:
        assert mine == [context[-1]] + oracle_chain(t, embed, hf_states(hf, context[:-1]), context, len(mine) - 1)
    assert drafter.bm.num_used_blocks == 0 and drafter.shadow.bm.num_used_blocks == 0


def test_a_step_whose_drafter_proposes_nothing_is_a_plain_decode(target8, tmp_path):
    """Adaptive speculation off, every decode step asks for drafts; every other proposal is
    replaced by lone roots (as a drafter with nothing to say, or a full pool, gives). Those steps
    run the plain decode forward (one token per request, no tree mask: the decode graph's
    shape), the others a verify step; the output is transformers' greedy one."""
    gen, hf = target8
    make_head(tmp_path / "head", seed=4)

    class Silent(Eagle3Drafter):
        calls: list

        def propose(self, seq_ids, budgets):
            trees = super().propose(seq_ids, budgets)
            silent = len(self.calls) % 2 == 1
            self.calls.append((engine.num_steps, silent))
            return [DraftTree([tr.tokens[0]], [-1]) for tr in trees] if silent else trees

    drafter = Silent(gen, str(tmp_path / "head"), k=2, num_blocks=64, block_size=4)
    drafter.calls = []
    rng = random.Random(12)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 12))] for _ in range(3)]
    spy = StepSpy(gen)
    engine = LLMEngine(spy, num_blocks=96, block_size=4, speculative=drafter, adaptive_speculation=False,
                       async_scheduling=False, enable_prefix_caching=False)
    spy.engine = engine
    n = 12
    outs = serve(engine, prompts, [SamplingParams(temperature=0.0, max_new_tokens=n)] * 3, [0, 0, 0])
    assert [o.token_ids for o in outs] == [hf_generate(hf, p, n) for p in prompts]
    by_step = {}
    for c in spy.calls:
        by_step.setdefault(c["step"], []).append(c)
    silent = [s for s, quiet in drafter.calls if quiet]
    drafting = [s for s, quiet in drafter.calls if not quiet]
    assert len(silent) >= 3 and len(drafting) >= 3
    for s in silent:
        assert [(c["is_prefill"], set(c["q_lens"]), c["spec_mask"]) for c in by_step[s]] == [(False, {1}, False)]
    assert all(max(c["q_lens"]) > 1 for s in drafting for c in by_step[s])


class StepSpy(SpyGenerator):
    """SpyGenerator that also notes the engine step and whether a tree mask came."""

    engine = None

    def forward_tensor(self, *args, **kwargs):
        out = super().forward_tensor(*args, **kwargs)
        self.calls[-1].update(step=self.engine.num_steps, spec_mask=kwargs.get("spec_mask") is not None)
        return out


def test_hidden_feed_hands_rows_on_by_position():
    """Rows added per step come back in position order, split and joined wherever take's limit
    falls; a request computed again (rows that do not continue the held ones) starts over."""
    from text_generator.speculative.hidden_feed import HiddenFeed

    feed = HiddenFeed([1, 2])
    rows = torch.arange(5 * 2 * 3, dtype=torch.float32).view(5, 2, 3)  # positions 5 .. 9
    feed.add("a", 5, rows[:3])
    feed.add("a", 8, rows[3:4])
    feed.add("a", 9, rows[4:])
    assert feed.take("a", 5) is None
    assert torch.equal(feed.take("a", 7), rows[:2])
    assert torch.equal(feed.take("a", 9), rows[2:4])  # the end of one add and the next one
    assert torch.equal(feed.take("a", 20), rows[4:])
    assert feed.take("a", 20) is None
    feed.add("b", 3, rows[:2])
    feed.add("b", 0, rows[2:])  # computed again from position 0
    assert torch.equal(feed.take("b", 2), rows[2:4]) and torch.equal(feed.take("b", 3), rows[4:])
