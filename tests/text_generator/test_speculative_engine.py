"""Speculation inside LLMEngine at batch > 1: per-request draft lengths, penalties, seeded
sampling, and both scheduling orders (plain and running ahead).

Oracles: transformers' greedy generate (conftest.hf_generate) for greedy requests; for penalised
greedy requests a plain engine run without a drafter (its penalties are checked against a
direct computation in test_sampling.py); for seeded sampled requests the same engine without a
drafter; for the batch builder and the per-node targets, a per-node computation from the tree
(DraftTree.mask, sampling.apply_penalties on the node's own history)."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import hf_generate, hf_model, make_checkpoint
from test_engine import SpyGenerator
from text_generator import TextGenerator
from text_generator.engine import LLMEngine
from text_generator.sampling import SamplingParams, apply_penalties
from text_generator.speculative import DraftTree, NgramDrafter, build_tree_batch
from text_generator.speculative.verify import accept_greedy, tree_targets

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 96  # conftest.TINY


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("spec_engine"), "llama")


@pytest.fixture(scope="module")
def gen(ckpt):
    return TextGenerator.from_pretrained(ckpt, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def hf(ckpt):
    return hf_model(ckpt)


class ScriptedDrafter:
    """Proposes, per request, drafts taken from a known continuation of its prompt (`truth`:
    prompt tuple -> tokens), shaped per request by `shape(i)` = (k, right, branch) for the
    request of prompt index i: k drafts (0: a lone root), the first `right` of them true and
    the rest wrong; branch: a wrong sibling (with a child) before the true first draft, so the
    accepted path is not a prefix of the node list and its K/V must move."""

    def __init__(self, truth: dict, shape):
        self.truth, self.shape = truth, shape
        self.ctx, self.which = {}, {}
        self.budgets: dict[str, list[int]] = {}

    def start(self, s, context):
        for i, prompt in enumerate(self.truth):
            if tuple(context[:len(prompt)]) == prompt:
                self.which[s], self.ctx[s] = i, list(context)
                return
        raise KeyError(s)

    def update(self, s, emitted):
        self.ctx[s] += emitted

    def finish(self, s):
        self.ctx.pop(s, None)

    def propose(self, seq_ids, budgets):
        out = []
        for s, b in zip(seq_ids, budgets):
            self.budgets.setdefault(s, []).append(b)
            i = self.which[s]
            prompt = list(self.truth)[i]
            k, right, branch = self.shape(i)
            ctx = self.ctx[s]
            true = list(self.truth[prompt])[len(ctx) - len(prompt):][:k]
            drafts = [t if j < right else (t + 1 + j) % VOCAB for j, t in enumerate(true)]
            if not drafts:
                out.append(DraftTree([ctx[-1]], [-1]))
            elif branch:
                wrong = (drafts[0] + 7) % VOCAB
                out.append(DraftTree([ctx[-1], wrong, 5] + drafts, [-1, 0, 1, 0] + list(range(3, 3 + len(drafts) - 1))))
            else:
                out.append(DraftTree.chain([ctx[-1]] + drafts))
        return out


def make_prompts(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    motif = [rng.randrange(VOCAB) for _ in range(4)]
    return [[rng.randrange(VOCAB) for _ in range(3 + 2 * i)] + motif * (i % 3) for i in range(n)]


def shape(i: int) -> tuple[int, int, bool]:
    """Per-request draft lengths: none, one right, three right, seven with two right, a branch."""
    return [(0, 0, False), (1, 1, False), (3, 3, False), (7, 2, False), (4, 4, True), (2, 0, False)][i % 6]


def serve(engine, prompts, params, arrivals) -> list:
    """Add prompt i at step arrivals[i]; -> the final output of each."""
    ids, finals, step = {}, {}, 0
    while len(finals) < len(prompts):
        for i, a in enumerate(arrivals):
            if a == step:
                ids[engine.add_request(prompts[i], params[i])] = i
        finals.update({ids[o.request_id]: o for o in engine.step() if o.finished})
        step += 1
        assert step < 1000
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()
    return [finals[i] for i in range(len(prompts))]


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
def test_per_request_draft_lengths_give_transformers_greedy_output(gen, hf, run_ahead):
    prompts = make_prompts(0, 7)
    n = 14
    truth = {tuple(p): hf_generate(hf, p, n) for p in prompts}
    drafter = ScriptedDrafter(truth, shape)
    spy = SpyGenerator(gen)
    engine = LLMEngine(spy, num_blocks=128, block_size=4, speculative=drafter, async_scheduling=run_ahead)
    outs = serve(engine, prompts, [SamplingParams(temperature=0.0, max_new_tokens=n)] * len(prompts),
                 [0, 0, 0, 1, 1, 3, 6])
    for p, o in zip(prompts, outs):
        assert o.token_ids == truth[tuple(p)], o.error
    # every shape ran: lone roots next to chains of 2..8 and a branching tree in one forward
    tree_steps = [c["q_lens"] for c in spy.calls if not c["is_prefill"] and max(c["q_lens"]) > 1]
    assert any(1 in q and len(set(q)) >= 4 for q in tree_steps), tree_steps
    assert engine.num_accepted_tokens > 0 and engine.num_draft_tokens > engine.num_accepted_tokens


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
def test_ngram_speculation_under_continuous_batching_and_preemption(gen, hf, run_ahead):
    """Staggered arrivals, a small token budget (drafts trimmed to it) and a pool small enough
    to preempt: outputs are transformers' greedy ones, and every block comes back."""
    prompts = make_prompts(1, 6)
    n = [10, 16, 7, 12, 16, 9]
    spy = SpyGenerator(gen)
    engine = LLMEngine(spy, num_blocks=20, block_size=4, watermark=0.0, max_num_batched_tokens=12,
                       speculative=NgramDrafter(max_ngram=2, depth=4, branches=2), async_scheduling=run_ahead)
    outs = serve(engine, prompts, [SamplingParams(temperature=0.0, max_new_tokens=k) for k in n], [0, 0, 1, 2, 2, 4])
    for p, k, o in zip(prompts, n, outs):
        assert o.token_ids == hf_generate(hf, p, k), o.error
    assert engine.num_preemptions > 0 and engine.num_accepted_tokens > 0


PENALTIES = [dict(repetition_penalty=1.8), dict(frequency_penalty=1.2, presence_penalty=0.5),
             dict(repetition_penalty=0.7, frequency_penalty=-0.6)]


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
def test_penalised_greedy_requests_draft_and_keep_the_plain_output(gen, run_ahead):
    """Greedy requests with repetition / frequency / presence penalties draft; every node's
    target is taken with the drafts on its path in the history, so the accepted tokens are the
    plain (no drafter) engine's, token for token. The drafter proposes that plain output (and
    wrong tails), so most drafts are accepted and the history really grows inside a step."""
    prompts = make_prompts(2, 6)
    params = [SamplingParams(temperature=0.0, max_new_tokens=16, **PENALTIES[i % 3]) for i in range(5)]
    params.append(SamplingParams(temperature=0.0, max_new_tokens=16))
    want = serve(LLMEngine(gen, num_blocks=128, block_size=4, async_scheduling=False), prompts, params, [0] * 6)
    truth = {tuple(p): w.token_ids for p, w in zip(prompts, want)}
    drafter = ScriptedDrafter(truth, lambda i: [(5, 5, False), (3, 3, True), (6, 3, False)][i % 3])
    engine = LLMEngine(gen, num_blocks=128, block_size=4, speculative=drafter, async_scheduling=run_ahead)
    got = serve(engine, prompts, params, [0, 0, 1, 1, 2, 2])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert engine.num_accepted_tokens >= 20


def test_penalised_targets_follow_each_nodes_path():
    """tree_targets against a per-node computation: the Sampler's apply_penalties on the node's
    own history (the output so far plus the drafts on its path), then argmax."""
    g = torch.Generator().manual_seed(0)
    V = 12
    trees = [DraftTree([3, 4, 4, 7, 4], [-1, 0, 1, 0, 3]), DraftTree.chain([1, 2]), DraftTree.chain([5, 5, 5, 6])]
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.9),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, presence_penalty=1.5)]
    prompts, outputs = [[1, 2, 3], [4], [9, 5]], [[3], [1], [6, 5]]
    batch = build_tree_batch(trees, [4, 2, 4], [torch.arange(t.size) for t in trees], torch.zeros(3, 4, dtype=torch.int32))
    logits = torch.randn(batch.offsets[-1], V, generator=g) * 0.05
    logits[:, [4, 5, 7, 6]] += torch.tensor([2.0, 1.95, 1.9, 1.8])  # drafted tokens lead: their counts decide
    got = tree_targets(logits, batch, params, prompts, outputs).tolist()
    want, without_path = [], []
    for b, t in enumerate(trees):
        for i in range(t.size):
            row = logits[batch.offsets[b] + i][None]
            for history, out in ((outputs[b] + [t.tokens[j] for j in t.path(i)[1:]], want), (outputs[b], without_path)):
                out.append(int(apply_penalties(row, [params[b]], [prompts[b]], [history]).argmax()))
    assert got == want
    assert got != without_path and got != logits.argmax(-1).tolist()  # the path and the penalties matter


def test_tree_batch_masks_and_positions_match_each_tree():
    """The flat batch (ancestor sets as bit masks, a per-tree fallback past 63 nodes) against
    DraftTree.mask and depths, for random trees of 1..70 nodes."""
    rng = random.Random(0)
    for sizes in ([1, 1], [5, 1, 17], [63, 2], [64, 3], [70, 9, 1]):
        trees = [DraftTree([rng.randrange(VOCAB) for _ in range(n)], [-1] + [rng.randrange(i) for i in range(1, n)])
                 for n in sizes]
        trees[-1] = DraftTree.chain(trees[-1].tokens)
        cached = [rng.randrange(50) for _ in trees]
        b = build_tree_batch(trees, cached, [torch.arange(t.size) for t in trees], torch.zeros(len(trees), 1))
        Q = max(sizes)
        for k, t in enumerate(trees):
            rows = slice(b.offsets[k], b.offsets[k + 1])
            assert b.input_ids[rows].tolist() == t.tokens
            assert b.position_ids[rows].tolist() == [cached[k] + d for d in t.depths()]
            if Q > 1:
                assert torch.equal(b.spec_mask[rows, :t.size], t.mask()) and not b.spec_mask[rows, t.size:].any()
        assert b.q_lens.tolist() == sizes and b.input_lengths.tolist() == [c + n for c, n in zip(cached, sizes)]


def test_accept_greedy_on_chains_and_trees_matches_a_brute_force_walk():
    """accept_greedy (a chain's early exit, a tree's pass) against the definition: the deepest
    node whose every path node drafts its parent's target, first in index order among equals."""
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randint(1, 9)
        chain = rng.random() < 0.5
        parents = list(range(-1, n - 1)) if chain else [-1] + [rng.randrange(i) for i in range(1, n)]
        tree = DraftTree([rng.randrange(3) for _ in range(n)], parents)
        target = [rng.randrange(3) for _ in range(n)]
        ok = [all(tree.tokens[j] == target[tree.parents[j]] for j in tree.path(i)[1:]) for i in range(n)]
        depth = tree.depths()
        best = max((i for i in range(n) if ok[i]), key=lambda i: (depth[i], -i))
        v = accept_greedy(tree, target)
        assert v.path == tree.path(best)
        assert v.tokens == [tree.tokens[i] for i in v.path[1:]] + [target[best]]


@pytest.mark.parametrize("run_ahead", [False, True], ids=["plain", "run_ahead"])
def test_seeded_sampled_requests_are_untouched_by_drafting_batch_mates(gen, hf, run_ahead):
    """Seeded sampled requests never draft: next to drafting greedy requests their tokens are
    exactly those of the engine without a drafter (their generators draw the same numbers)."""
    prompts = make_prompts(3, 6)
    params = [SamplingParams(temperature=0.0, max_new_tokens=12) if i % 2 else
              SamplingParams(temperature=0.9, top_k=20, seed=11 + i, max_new_tokens=12) for i in range(6)]
    want = serve(LLMEngine(gen, num_blocks=128, block_size=4, async_scheduling=False), prompts, params, [0] * 6)
    truth = {tuple(p): hf_generate(hf, p, 12) for p in prompts}
    engine = LLMEngine(gen, num_blocks=128, block_size=4, speculative=ScriptedDrafter(truth, lambda i: (4, 4, False)),
                       async_scheduling=run_ahead)
    got = serve(engine, prompts, params, [0, 0, 0, 1, 1, 2])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert engine.num_accepted_tokens > 0


def test_with_a_drafter_the_engine_runs_ahead_while_no_request_drafts(gen, hf):
    """Running ahead stops only for steps in which a request drafts: sampled requests alone run
    ahead with a drafter set (device rows), and their outputs are the plain order's; a greedy
    request that joins drafts in steps that wait for the host (no device rows), and its output
    is transformers' greedy one."""
    prompts = make_prompts(4, 4)
    sampled = [SamplingParams(temperature=0.8, seed=i, max_new_tokens=10) for i in range(4)]
    want = serve(LLMEngine(gen, num_blocks=128, block_size=4, async_scheduling=False), prompts, sampled, [0] * 4)
    spy = SpyGenerator(gen)
    truth = {tuple(prompts[0]): hf_generate(hf, prompts[0], 8)}
    engine = LLMEngine(spy, num_blocks=128, block_size=4, speculative=ScriptedDrafter(truth, lambda i: (2, 2, False)),
                       async_scheduling=True)
    got = serve(engine, prompts, sampled, [0] * 4)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert sum(c["device_rows"] for c in spy.calls) >= 4 * 10 - 2 * 4
    # a greedy request joins next to a sampled one
    spy.calls.clear()
    gid = engine.add_request(prompts[0], SamplingParams(temperature=0.0, max_new_tokens=8))
    engine.add_request(prompts[1], sampled[1])
    finals = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals[gid].token_ids == truth[tuple(prompts[0])]
    verify = [c for c in spy.calls if not c["is_prefill"] and max(c["q_lens"]) > 1]
    assert verify and all(c["device_rows"] == 0 for c in verify)
