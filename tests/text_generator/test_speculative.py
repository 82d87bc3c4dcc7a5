"""Speculative decoding: tree layout, drafters, lossless verification, KV compaction, the driver.

Oracles: transformers' own model on the same random checkpoint (plain greedy decoding, and the
logits of a root-to-node path run as a plain sequence); for sampling, the target distribution
itself (chi-square goodness of fit on many seeded trials).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings, strategies as st
from peft import LoraConfig, get_peft_model
from scipy.stats import chi2

from conftest import MOE_FAMILIES, hf_model, rel_err
from kv_manager import BlockManager
from text_generator import TextGenerator
from text_generator.speculative import (
    DraftModelDrafter, DraftTree, NgramDrafter, TreeSampling, SpeculativeDecoder, Verdict,
    build_tree_batch, commit_accepted, compact_accepted_kv, target_probs, verify,
)
from text_generator.speculative.verify import verify_greedy, verify_sampling, verify_sampling_batch

VOCAB = 96
FAMS = ["llama", "qwen3"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models(checkpoint_dir):
    """family -> (TextGenerator, transformers model), fp32 on the CPU."""
    cache = {}

    def get(family: str, **overrides):
        key = (family, tuple(sorted(overrides.items())))
        if key not in cache:
            path = checkpoint_dir(family, **overrides)
            cache[key] = (TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32, attention_backend="torch"),
                          hf_model(path))
        return cache[key]

    return get


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding with transformers' own model and cache: the oracle."""
    out = model(torch.tensor([prompt]), use_cache=True)
    toks = []
    for _ in range(n):
        toks.append(int(out.logits[0, -1].argmax()))
        out = model(torch.tensor([toks[-1:]]), past_key_values=out.past_key_values, use_cache=True)
    return toks


@torch.no_grad()
def hf_last_logits(model, seq: list[int]) -> torch.Tensor:
    return model(torch.tensor([seq])).logits[0, -1].float()


def random_prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def copy_prompt(rng: random.Random, n: int) -> list[int]:
    seg = random_prompt(rng, rng.randint(4, 9))
    return (seg * (n // len(seg) + 1))[:n]


def prefill(gen, kv, bm: BlockManager, seq_id, prompt: list[int], max_seq_len: int = 512) -> int:
    """Admit and prefill one prompt; -> its greedy next token (appended, uncommitted: the root)."""
    c = bm.admit(seq_id, prompt)
    logits = gen.forward_tensor(
        torch.tensor(prompt[c:]), torch.arange(c, len(prompt)), True, kv, bm.block_tables([seq_id]),
        bm.slots(seq_id, c, len(prompt)), torch.tensor([len(prompt)], dtype=torch.int32), max_seq_len,
        torch.tensor([len(prompt) - c - 1]), q_lens=[len(prompt) - c])
    bm.commit(seq_id, len(prompt))
    root = int(logits[0].argmax())
    bm.append(seq_id, [root])
    return root


def tree_step(gen, kv, bm: BlockManager, seq_ids, trees, max_seq_len: int = 512):
    """Append every tree's drafts and run ONE forward over the batch of trees."""
    cached = [bm.num_computed_tokens(s) for s in seq_ids]
    for s, t in zip(seq_ids, trees):
        bm.append(s, t.tokens[1:])
    batch = build_tree_batch(trees, cached, [bm.slots(s, c, c + t.size) for s, c, t in zip(seq_ids, cached, trees)],
                             bm.block_tables(seq_ids))
    kw = {"spec_mask": batch.spec_mask} if batch.spec_mask is not None else {}
    logits = gen.forward_tensor(batch.input_ids, batch.position_ids, False, kv, batch.block_tables, batch.slots,
                                batch.input_lengths, max_seq_len, q_lens=batch.q_lens, **kw)
    return batch, cached, logits


def random_tree(rng: random.Random, root: int, n: int) -> DraftTree:
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    return DraftTree([root] + random_prompt(rng, n - 1), parents)


class TracksContext:
    """The drafter protocol's bookkeeping for test drafters: each request's context (prompt + emitted)."""

    ctx: dict

    def start(self, s, prompt):
        self.ctx[s] = list(prompt)

    def update(self, s, emitted):
        self.ctx[s] += emitted

    def finish(self, s):
        self.ctx.pop(s, None)


class OracleDrafter(TracksContext):
    """Test drafter that knows the true greedy continuation and hides it in a random tree:
    wrong branches (with subtrees) come first, then a correct prefix of random length, so the
    accepted path is rarely contiguous in the cache."""

    def __init__(self, truth: dict, seed: int = 0, max_nodes: int = 12):
        self.truth, self.rng, self.max_nodes = truth, random.Random(seed), max_nodes
        self.ctx: dict = {}

    def propose(self, seq_ids, budgets):
        out = []
        for s, b in zip(seq_ids, budgets):
            ctx, full = self.ctx[s], self.truth[s]
            true = full[len(ctx):len(ctx) + self.rng.randint(0, 5)]
            tokens, parents, node = [ctx[-1]], [-1], 0
            for t in true:
                for _ in range(self.rng.randint(0, 2)):  # wrong siblings, each with a child
                    tokens += [(t + self.rng.randint(1, VOCAB - 1)) % VOCAB, self.rng.randrange(VOCAB)]
                    parents += [node, len(tokens) - 2]
                tokens.append(t)
                parents.append(node)
                node = len(tokens) - 1
            out.append(DraftTree(tokens, parents).pruned(min(b, self.max_nodes), 10**9))
        return out


# -- tree layout ------------------------------------------------------------------------------

def test_tree_layout_mask_depths_positions():
    t = DraftTree([5, 1, 2, 3, 4], [-1, 0, 1, 0, 3])
    assert t.depths() == [0, 1, 2, 1, 2]
    assert t.path(4) == [0, 3, 4] and t.children() == [[1, 3], [2], [], [4], []]
    expect = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 1, 1]]).bool()
    assert torch.equal(t.mask(), expect)
    chain = DraftTree.chain([7, 8, 9])
    batch = build_tree_batch([t, chain], [10, 3], [torch.arange(100, 105), torch.arange(200, 203)],
                             torch.zeros(2, 1, dtype=torch.int32))
    assert batch.input_ids.tolist() == [5, 1, 2, 3, 4, 7, 8, 9]
    assert batch.position_ids.tolist() == [10, 11, 12, 11, 12, 3, 4, 5]
    assert batch.q_lens.tolist() == [5, 3] and batch.input_lengths.tolist() == [15, 6]
    assert batch.offsets == [0, 5, 8] and batch.spec_mask.shape == (8, 5)
    assert torch.equal(batch.spec_mask[:5], expect)
    assert torch.equal(batch.spec_mask[5:, :3], torch.ones(3, 3).tril().bool()) and not batch.spec_mask[5:, 3:].any()
    lone = build_tree_batch([DraftTree([3], [-1])], [4], [torch.tensor([9])], torch.zeros(1, 1, dtype=torch.int32))
    assert lone.spec_mask is None  # a plain decode step


def test_tree_pruned_and_invalid():
    t = DraftTree([5, 1, 2, 3, 4], [-1, 0, 1, 0, 3])
    p = t.pruned(10, 1)
    assert p.tokens == [5, 1, 3] and p.parents == [-1, 0, 0]
    p = t.pruned(3, 10)
    assert p.tokens == [5, 1, 2] and p.parents == [-1, 0, 1]
    assert t.pruned(0, 0).tokens == [5]
    with pytest.raises(ValueError):
        DraftTree([1, 2], [-1, 1])
    with pytest.raises(ValueError):
        DraftTree([1, 2], [0, -1])


# -- tree attention ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMS + ["mistral"] + MOE_FAMILIES)  # mistral: window 6 counts tree positions
def test_tree_node_logits_match_transformers_on_each_path(models, family):
    gen, hf = models(family)
    rng = random.Random(1)
    kv = gen.allocate_kv_cache(32, 4)
    bm = BlockManager(32, 4)
    prompts = [random_prompt(rng, 13), random_prompt(rng, 6)]
    roots = [prefill(gen, kv, bm, i, p) for i, p in enumerate(prompts)]
    trees = [random_tree(rng, roots[0], 9), random_tree(rng, roots[1], 4)]
    batch, _, logits = tree_step(gen, kv, bm, [0, 1], trees)
    for b, (p, t) in enumerate(zip(prompts, trees)):
        for i in range(t.size):
            ref = hf_last_logits(hf, p + [t.tokens[j] for j in t.path(i)])
            assert rel_err(logits[batch.offsets[b] + i], ref) < 1e-4, (b, i)


# -- verification -----------------------------------------------------------------------------

def test_verify_greedy_picks_the_deepest_argmax_path():
    t = DraftTree([0, 1, 2, 3, 4, 5], [-1, 0, 0, 2, 3, 2])
    logits = torch.full((6, 8), -1.0)
    for node, arg in enumerate([2, 0, 3, 4, 7, 1]):  # argmax of each node's row
        logits[node, arg] = 1.0
    v = verify_greedy(t, logits)
    assert v.path == [0, 2, 3, 4] and v.tokens == [2, 3, 4, 7]
    logits[0] = 0.0
    logits[0, 6] = 1.0  # no child matches: only the root's own token
    v = verify_greedy(t, logits)
    assert v.path == [0] and v.tokens == [6]


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square of observed counts against probs (cells with expected < 5 pooled)."""
    n = counts.sum()
    exp = probs.double() * n
    small = exp < 5
    obs, exp = counts.double(), exp
    if small.any():
        obs = torch.cat([obs[~small], obs[small].sum().view(1)])
        exp = torch.cat([exp[~small], exp[small].sum().view(1)])
    assert obs[exp == 0].sum() == 0, "a token of probability 0 was emitted"
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


@pytest.mark.parametrize("params", [TreeSampling(1.0), TreeSampling(0.7, top_k=5), TreeSampling(1.3, top_p=0.8)])
def test_rejection_sampling_emits_the_target_distribution(params):
    V, trials = 8, 6000
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, V, generator=g) * 1.5
    probs = target_probs(logits, params)
    x, y = torch.topk(probs[0], 2).indices.tolist()  # drafts with mass under every setting
    z = int(probs[1].argmax())
    # root -+- x - z        children tried in order: x (node 1), y (node 3), x again (node 4: a
    #       +- y            duplicate, must be rejected since p(x) is zeroed after node 1 fails)
    #       +- x
    tree = DraftTree([0, x, z, y, x], [-1, 0, 1, 0, 0])
    first = torch.zeros(V)
    second = torch.zeros(V)  # the token after x, when x was emitted first
    rng = torch.Generator().manual_seed(1234)
    for _ in range(trials):
        v = verify_sampling(tree, probs, rng)
        first[v.tokens[0]] += 1
        if v.tokens[0] == x:
            assert v.path[1] == 1  # only node 1 can emit x
            second[v.tokens[1]] += 1
    assert _chi2_pvalue(first, probs[0]) > 1e-3
    assert _chi2_pvalue(second, probs[1]) > 1e-3
    # the test has power: the draft order alone (a biased sampler) is rejected
    biased = torch.zeros(V)
    biased[x] = trials
    assert _chi2_pvalue(biased, probs[0]) < 1e-6


def test_batched_rejection_sampling_emits_the_target_distribution_in_every_row():
    """verify_sampling_batch over a batch of thousands of requests (the tree above, a chain and a
    lone root, each with its own probs): the first token of each kind of request, and the second
    token after an accepted first draft, follow that request's target distribution."""
    V, reps = 8, 3000
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(8, V, generator=g) * 1.5
    probs = target_probs(logits, TreeSampling(0.9, top_k=6))
    x, y = torch.topk(probs[0], 2).indices.tolist()
    tree = DraftTree([0, x, int(probs[1].argmax()), y, x], [-1, 0, 1, 0, 0])  # rows 0..4
    a = int(probs[5].argmax())
    chain = DraftTree.chain([1, a, 3])  # rows 5..7 (its root row is 5, its first draft a)
    lone = DraftTree([2], [-1])  # a row of its own: probs[7] doubles as the lone root's row
    trees, rows = [], []
    for _ in range(reps):
        trees += [tree, chain, lone]
        rows += [0, 1, 2, 3, 4, 5, 6, 7, 7]
    verdicts = verify_sampling_batch(trees, probs[rows], torch.Generator().manual_seed(3))
    first = [torch.zeros(V) for _ in range(3)]
    second = torch.zeros(V)
    for i, v in enumerate(verdicts):
        first[i % 3][v.tokens[0]] += 1
        if i % 3 == 1 and v.tokens[0] == a:
            assert v.path[:2] == [0, 1]
            second[v.tokens[1]] += 1
    for counts, p in zip(first, (probs[0], probs[5], probs[7])):
        assert _chi2_pvalue(counts, p) > 1e-3
    assert _chi2_pvalue(second, probs[6]) > 1e-3
    # the test has power: rows are not interchangeable (total variation to the wrong row's p)
    tv = lambda counts, p: float((counts / counts.sum() - p.double()).abs().sum() / 2)  # noqa: E731
    assert tv(first[1], probs[5]) < 0.05 < 0.1 < tv(first[1], probs[0])


def test_target_probs_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    p = target_probs(logits, TreeSampling(1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and torch.allclose(p.sum(), torch.tensor(1.0))
    full = torch.softmax(logits, -1)[0]  # ~[.64, .24, .09, .03, .01]
    p = target_probs(logits, TreeSampling(1.0, top_p=0.8))
    assert (p[0, :2] > 0).all() and (p[0, 2:] == 0).all()
    assert torch.allclose(p[0, :2], full[:2] / full[:2].sum())
    with pytest.raises(ValueError):
        verify(DraftTree([0], [-1]), logits, TreeSampling(1.0))  # no generator


# -- KV compaction ----------------------------------------------------------------------------

def test_compact_accepted_kv_copies_every_layer_and_handles_overlap():
    kv = [(torch.arange(40.0).view(10, 2, 2, 1).clone(), -torch.arange(40.0).view(10, 2, 2, 1).clone())
          for _ in range(2)]
    # a shift by one with overlapping src/dst: 5 -> 4, 6 -> 5, 7 -> 6 (reads see the old values)
    compact_accepted_kv(kv, torch.tensor([3, 5, 6, 7]), torch.tensor([3, 4, 5, 6]))
    for k, v in kv:
        flat = k.view(20, 2)
        assert flat[4:7].tolist() == [[10, 11], [12, 13], [14, 15]] and flat[3].tolist() == [6, 7]
        assert torch.equal(v.view(20, 2)[4:7], -flat[4:7])


@pytest.mark.parametrize("family", FAMS)
def test_next_step_after_non_contiguous_accept_equals_cold_prefill(models, family):
    gen, hf = models(family)
    rng = random.Random(2)
    prompt = random_prompt(rng, 9)
    truth = hf_greedy(hf, prompt, 4)
    kv = gen.allocate_kv_cache(16, 4)
    bm = BlockManager(16, 4)
    root = prefill(gen, kv, bm, "s", prompt)
    assert root == truth[0]
    g1, g2 = truth[1], truth[2]
    w = (g1 + 1) % VOCAB
    #   root -+- w - x - y        kv index c .. c+6; the accepted path root, g1, g2 sits at
    #         +- g1 - g2          c, c+4, c+5 and must move to c, c+1, c+2 (crossing a block)
    #               +- z
    tree = DraftTree([root, w, 5, 6, g1, g2, (truth[3] + 1) % VOCAB], [-1, 0, 1, 2, 0, 4, 4])
    batch, cached, logits = tree_step(gen, kv, bm, ["s"], [tree])
    v = verify_greedy(tree, logits)
    assert v.path == [0, 4, 5] and v.tokens == [g1, g2, truth[3]]
    commit_accepted(kv, bm, "s", cached[0], tree, v, batch.slots)
    seq = prompt + [root, g1, g2, truth[3]]
    assert bm.token_ids("s") == seq and bm.num_computed_tokens("s") == len(seq) - 1
    _, _, nxt = tree_step(gen, kv, bm, ["s"], [DraftTree([truth[3]], [-1])])
    assert rel_err(nxt[0], hf_last_logits(hf, seq)) < 1e-4
    # our own cold prefill of the same sequence, in a fresh cache, agrees too
    kv2, bm2 = gen.allocate_kv_cache(16, 4), BlockManager(16, 4)
    bm2.admit("c", seq)
    cold = gen.forward_tensor(torch.tensor(seq), torch.arange(len(seq)), True, kv2, bm2.block_tables(["c"]),
                              bm2.slots("c", 0, len(seq)), torch.tensor([len(seq)], dtype=torch.int32), 512,
                              torch.tensor([len(seq) - 1]))
    assert rel_err(nxt[0], cold[0]) < 1e-4


def test_without_compaction_the_next_step_is_wrong(models):
    """The compaction test has teeth: skipping the copy leaves stale K/V at c+1, c+2."""
    gen, hf = models("llama")
    rng = random.Random(2)
    prompt = random_prompt(rng, 9)
    truth = hf_greedy(hf, prompt, 4)
    kv, bm = gen.allocate_kv_cache(16, 4), BlockManager(16, 4)
    root = prefill(gen, kv, bm, "s", prompt)
    tree = DraftTree([root, (truth[1] + 1) % VOCAB, 5, 6, truth[1], truth[2]], [-1, 0, 1, 2, 0, 4])
    _, cached, logits = tree_step(gen, kv, bm, ["s"], [tree])
    v = verify_greedy(tree, logits)
    bm.truncate("s", cached[0])
    bm.append("s", [tree.tokens[i] for i in v.path])
    bm.commit("s", cached[0] + len(v.path))
    bm.append("s", v.tokens[-1:])
    _, _, nxt = tree_step(gen, kv, bm, ["s"], [DraftTree([truth[3]], [-1])])
    assert rel_err(nxt[0], hf_last_logits(hf, prompt + [root] + v.tokens)) > 1e-3


# -- drafters ---------------------------------------------------------------------------------

def _brute_force_continuations(toks, max_n, min_n, depth, branches):
    out = []
    for n in range(max_n, min_n - 1, -1):
        if len(toks) < n:
            continue
        suffix = toks[len(toks) - n:]
        for e in range(len(toks) - 1, n - 1, -1):
            cont = toks[e:e + depth]
            if toks[e - n:e] == suffix and cont not in out:
                out.append(cont)
                if len(out) == branches:
                    return out
    return out


def test_ngram_drafter_matches_a_brute_force_search_as_tokens_arrive():
    rng = random.Random(3)
    d = NgramDrafter(max_ngram=3, min_ngram=1, depth=3, branches=3, max_scan=10**6)
    toks = [rng.randrange(5) for _ in range(8)]
    d.start("a", toks)
    for _ in range(60):
        assert d.continuations("a") == _brute_force_continuations(toks, 3, 1, 3, 3)
        new = [rng.randrange(5) for _ in range(rng.randint(1, 3))]
        toks += new
        d.update("a", new)


def test_ngram_drafter_tree_chain_and_budget():
    d = NgramDrafter(max_ngram=2, min_ngram=1, depth=3, branches=3)
    d.start("a", [1, 2, 3, 4, 1, 2, 5, 6, 9, 2])
    # suffix "2": continuations after the 2s at indexes 5 and 1 (most recent first): 5 6 9, 3 4 1
    t = d.propose(["a"], [64])[0]
    assert t.tokens == [2, 5, 6, 9, 3, 4, 1] and t.parents == [-1, 0, 1, 2, 0, 4, 5]
    assert d.propose(["a"], [3])[0].tokens == [2, 5, 6]
    d.update("a", [5])  # suffix "2 5" -> "6 9 2" (2-gram first), then "5" -> same, so one branch
    t = d.propose(["a"], [64])[0]
    assert t.tokens == [5, 6, 9, 2] and t.parents == [-1, 0, 1, 2]
    d.start("b", [7, 8])
    assert d.propose(["b"], [64])[0].tokens == [8]  # nothing to copy: the lone root
    chain = NgramDrafter(max_ngram=2, depth=2, branches=1)
    chain.start("c", [1, 2, 3, 1, 2, 4, 1, 2])
    assert chain.propose(["c"], [64])[0].tokens == [2, 4, 1]


def _oracle_decode(gen, hf, prompts, n, drafter_factory, block_size=4, **kw):
    truth = {("spec", i): list(p) + hf_greedy(hf, p, n) for i, p in enumerate(prompts)}
    kv = gen.allocate_kv_cache(256, block_size)
    bm = BlockManager(256, block_size)
    dec = SpeculativeDecoder(gen, kv, bm, drafter_factory(truth), **kw)
    out = dec.generate(prompts, n)
    assert bm.num_used_blocks == 0  # every sequence freed
    return out, [truth[("spec", i)][len(p):] for i, p in enumerate(prompts)], dec.stats


# -- lossless greedy generation ---------------------------------------------------------------

@pytest.mark.parametrize("family", FAMS)
def test_greedy_speculation_equals_plain_greedy_decoding(models, family):
    gen, hf = models(family)
    rng = random.Random(4)
    prompts = [random_prompt(rng, rng.randint(1, 30)) for _ in range(10)] + [copy_prompt(rng, rng.randint(12, 60)) for _ in range(6)]
    n = 32
    ref = [hf_greedy(hf, p, n) for p in prompts]
    for drafter in (NgramDrafter(depth=4, branches=3), NgramDrafter(max_ngram=4, depth=6, branches=1)):
        kv, bm = gen.allocate_kv_cache(128, 8), BlockManager(128, 8)
        dec = SpeculativeDecoder(gen, kv, bm, drafter, adaptive_speculation=False)  # every step drafts
        out = [dec.generate([p], n)[0] for p in prompts]  # batch 1
        assert out == ref
        assert dec.stats.accepted > 0 and dec.stats.tokens_per_forward > 1.3  # the drafts did hit
    kv, bm = gen.allocate_kv_cache(128, 8), BlockManager(128, 8)
    dec = SpeculativeDecoder(gen, kv, bm, NgramDrafter(depth=3, branches=2))
    assert dec.generate(prompts, n) == ref  # one batch: different tree sizes each step


@pytest.mark.parametrize("family", FAMS)
def test_oracle_trees_non_contiguous_accepts_batched(models, family):
    gen, hf = models(family)
    rng = random.Random(5)
    prompts = [random_prompt(rng, rng.randint(1, 25)) for _ in range(6)]
    out, ref, stats = _oracle_decode(gen, hf, prompts, 40, lambda truth: OracleDrafter(truth, seed=6),
                                     adaptive_speculation=False)
    assert out == ref
    assert stats.accepted > 30  # deep accepts happened, most through non-contiguous paths
    assert len(set(stats.steps)) > 3  # requests emitted different counts per step


class ChainDrafter(TracksContext):
    """Test drafter of chains of `depth` tokens: the true greedy continuation once a request's context
    holds right_from tokens (then every draft is accepted), before that the true tokens plus one
    (every draft rejected)."""

    def __init__(self, truth: dict, right_from: dict, depth: int = 4):
        self.truth, self.right_from, self.depth = truth, right_from, depth
        self.ctx: dict = {}

    def propose(self, seq_ids, budgets):
        out = []
        for s, b in zip(seq_ids, budgets):
            ctx = self.ctx[s]
            true = self.truth[s][len(ctx):len(ctx) + self.depth]
            draft = true if len(ctx) >= self.right_from[s] else [(t + 1) % VOCAB for t in true]
            out.append(DraftTree.chain([ctx[-1]] + draft[: b - 1]))
        return out


def test_decoder_adapts_its_draft_lengths_and_stays_plain_greedy(models):
    """adaptive_speculation (the default): the output is plain greedy's whatever the drafts; a request
    whose drafts fail drafts accepted + 1 = 1 token in its next step, stops after 2 such steps
    (patience) and probes one token at the steps that are multiples of its backoff (4, doubling
    after each failed probe); a probe that hits brings its drafting back. Drafted tokens are counted
    from that schedule by hand; adaptive_speculation=False drafts a full chain in every step."""
    gen, hf = models("llama")
    rng = random.Random(11)
    prompts = [random_prompt(rng, rng.randint(5, 20)) for _ in range(3)]
    n = 40  # the prefill's token, then 39 verify steps (0 .. 38)
    ref = [hf_greedy(hf, p, n) for p in prompts]
    truth = {("spec", i): list(p) + r for i, (p, r) in enumerate(zip(prompts, ref))}
    never = {s: 10 ** 9 for s in truth}

    def run(right_from, **kw):
        kv, bm = gen.allocate_kv_cache(128, 4), BlockManager(128, 4)
        dec = SpeculativeDecoder(gen, kv, bm, ChainDrafter(truth, right_from), **kw)
        assert dec.generate(prompts, n) == ref
        assert bm.num_used_blocks == 0
        return dec.stats

    # every draft wrong: step 0 drafts 4 tokens, step 1 one, then probes of 1 at steps 4, 8, 16, 32
    stats = run(never)
    assert stats.accepted == 0 and stats.drafted == 3 * (4 + 1 + 1 + 1 + 1 + 1)
    assert stats.forwards == 1 + 39  # each step emitted its one target token
    fixed = run(never, adaptive_speculation=False)
    # (step k has 39 - k tokens left to emit: its chain is cut to 38 - k drafts)
    assert fixed.accepted == 0 and fixed.drafted == 3 * sum(min(4, 38 - k) for k in range(39))
    # right once the context holds prompt + 12 tokens: the probes at steps 4 and 8 (contexts of
    # prompt + 5 and + 9) fail, the one at step 16 hits and every draft from then on is accepted
    stats = run({s: len(p) + 12 for s, p in zip(truth, prompts)})
    assert stats.drafted - stats.accepted == 3 * (4 + 1 + 1 + 1)
    assert stats.accepted > 3 * 12 and stats.forwards < 1 + 39
    # drafts always right: the adaptive and fixed drivers run the same steps
    always = {s: 0 for s in truth}
    assert run(always).forwards == run(always, adaptive_speculation=False).forwards < 1 + 39 // 2


def test_decoder_refuses_a_bad_adaptive_speculation_setting(models):
    gen, _ = models("llama")
    kv, bm = gen.allocate_kv_cache(16, 4), BlockManager(16, 4)
    with pytest.raises(ValueError, match="adaptive_speculation: expected a bool or an AdaptiveSpeculation, got str"):
        SpeculativeDecoder(gen, kv, bm, None, adaptive_speculation="yes")


def test_plain_decoding_through_the_driver_and_prefix_cache(models):
    gen, hf = models("llama")
    rng = random.Random(7)
    prompt = random_prompt(rng, 21)
    kv, bm = gen.allocate_kv_cache(64, 4), BlockManager(64, 4)
    ref = hf_greedy(hf, prompt, 12)
    dec = SpeculativeDecoder(gen, kv, bm, None)
    assert dec.generate([prompt], 12) == [ref]
    assert dec.stats.forwards == 12 and dec.stats.tokens_per_forward == 1.0
    # the second run reuses the committed blocks of the first (prompt + accepted tokens only)
    dec2 = SpeculativeDecoder(gen, kv, bm, NgramDrafter(branches=2))
    assert dec2.generate([prompt + ref[:8]], 4) == [ref[8:12]]
    assert bm.num_cached_blocks >= (len(prompt) + 8) // 4


def test_generation_up_to_max_seq_len_and_eos(models):
    gen, hf = models("llama")
    rng = random.Random(8)
    prompt = copy_prompt(rng, 30)
    ref = hf_greedy(hf, prompt, 10)
    kv, bm = gen.allocate_kv_cache(64, 4), BlockManager(64, 4)
    dec = SpeculativeDecoder(gen, kv, bm, NgramDrafter(depth=8, branches=4), max_seq_len=40)
    assert dec.generate([prompt], 10) == [ref]  # trees pruned so that no step passes 40 tokens
    eos = ref[4]
    out = SpeculativeDecoder(gen, kv, bm, NgramDrafter(depth=8), max_seq_len=40).generate([prompt], 10, eos_token_id=eos)
    assert out == [ref[: ref.index(eos) + 1]]
    with pytest.raises(ValueError):
        dec.generate([prompt], 11)


@pytest.mark.parametrize("same", [True, False])
def test_draft_model_drafter_is_lossless(models, same):
    gen, hf = models("llama")
    draft_gen = gen if same else models("llama", num_hidden_layers=1)[0]
    rng = random.Random(9)
    prompts = [random_prompt(rng, rng.randint(3, 15)) for _ in range(3)]
    ref = [hf_greedy(hf, p, 20) for p in prompts]
    dkv, dbm = draft_gen.allocate_kv_cache(64, 4), BlockManager(64, 4)
    drafter = DraftModelDrafter(draft_gen, dkv, dbm, k=3)
    kv, bm = gen.allocate_kv_cache(64, 4), BlockManager(64, 4)
    dec = SpeculativeDecoder(gen, kv, bm, drafter)
    assert dec.generate(prompts, 20) == ref
    if same:  # the target drafting for itself: every draft is accepted
        assert dec.stats.accepted == dec.stats.drafted > 0
    assert dbm.num_used_blocks == 0


def test_sampled_generation_is_reproducible_and_seed_dependent(models):
    gen, _ = models("qwen3")
    prompt = copy_prompt(random.Random(10), 20)

    def run(seed):
        kv, bm = gen.allocate_kv_cache(64, 4), BlockManager(64, 4)
        dec = SpeculativeDecoder(gen, kv, bm, NgramDrafter(branches=3), sampling=TreeSampling(0.8, top_p=0.9), seed=seed)
        return dec.generate([prompt, prompt[:9]], 16)

    a = run(0)
    assert a == run(0) and a != run(1)
    assert all(len(o) == 16 and all(0 <= t < VOCAB for t in o) for o in a)


@pytest.mark.skipif(not hasattr(TextGenerator, "enable_lora"), reason="LoRA (TextGenerator.enable_lora) not built yet")
def test_lora_applies_to_every_tree_token(checkpoint_dir, tmp_path):
    """A request with a peft adapter and one without, speculating in one batch: each equals
    plain greedy decoding of its own oracle (peft's model / transformers' model)."""
    path = checkpoint_dir("llama")
    peft_model = get_peft_model(hf_model(path), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"))
    torch.manual_seed(11)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    peft_model.save_pretrained(str(tmp_path / "ad"))
    peft_model.eval()
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32, attention_backend="torch")
    gen.enable_lora(max_loras=2, max_rank=8)
    gen.load_adapter("ad", str(tmp_path / "ad"))
    rng = random.Random(12)
    prompts = [copy_prompt(rng, 24), random_prompt(rng, 11)]
    ref = [hf_greedy(peft_model, prompts[0], 16), hf_greedy(hf_model(path), prompts[1], 16)]
    assert ref[0] != hf_greedy(hf_model(path), prompts[0], 16)  # the adapter matters
    kv, bm = gen.allocate_kv_cache(64, 4), BlockManager(64, 4)
    dec = SpeculativeDecoder(gen, kv, bm, NgramDrafter(branches=3), adaptive_speculation=False)  # trees each step
    assert dec.generate(prompts, 16, adapter_ids=["ad", None]) == ref
    assert dec.stats.accepted > 0
    # reloaded under the same name with other weights: the prompt's K/V cached under the first
    # load must not be reused (the prefix-cache key is the adapter's load, not its name)
    other = get_peft_model(hf_model(path), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear"))
    torch.manual_seed(13)
    with torch.no_grad():
        for name, p in other.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    other.save_pretrained(str(tmp_path / "ad2"))
    gen.unload_adapter("ad")
    gen.load_adapter("ad", str(tmp_path / "ad2"))
    assert dec.generate(prompts[:1], 16, adapter_ids=["ad"]) == [hf_greedy(other.eval(), prompts[0], 16)]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_commit_accepted_moves_any_path_into_place(data):
    """Property: for any tree, cache position and accepted path, the block manager ends with
    committed prefix + path and every path node's K/V sits at its depth's slot."""
    bs = data.draw(st.integers(1, 5), label="block_size")
    n = data.draw(st.integers(1, 12), label="tree size")
    parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, n)]
    tree = DraftTree(list(range(100, 100 + n)), parents)
    path = tree.path(data.draw(st.integers(0, n - 1), label="accepted node"))
    prompt = list(range(data.draw(st.integers(1, 11), label="prompt")))
    bm = BlockManager(64, bs)
    bm.admit("s", prompt + [tree.tokens[0]])
    bm.commit("s", len(prompt))
    bm.append("s", tree.tokens[1:])
    c = len(prompt)
    slots = bm.slots("s", c, c + n)
    kv = [(torch.zeros(64, bs, 1, 2), torch.zeros(64, bs, 1, 2))]
    for k, v in kv:  # node i's K/V = (i, -i)
        k.view(-1, 1, 2)[slots] = torch.arange(n, dtype=torch.float32).view(n, 1, 1).expand(n, 1, 2)
        v.view(-1, 1, 2)[slots] = -k.view(-1, 1, 2)[slots]
    verdict = Verdict(path, [tree.tokens[i] for i in path[1:]] + [7])
    commit_accepted(kv, bm, "s", c, tree, verdict, slots)
    assert bm.token_ids("s") == prompt + [tree.tokens[i] for i in path] + [7]
    assert bm.num_computed_tokens("s") == c + len(path)
    dst = bm.slots("s", c, c + len(path))
    k, v = kv[0]
    assert k.view(-1, 1, 2)[dst][:, 0, 0].tolist() == [float(i) for i in path]
    assert torch.equal(v.view(-1, 1, 2)[dst], -k.view(-1, 1, 2)[dst])


def test_commit_accepted_refuses_before_changing_anything_when_the_bonus_token_has_no_block():
    """A fully accepted chain needs one more slot for the bonus token: with no free block,
    commit_accepted raises OUT_OF_BLOCKS and leaves the sequence exactly as it was."""
    from kv_manager import BlockManager
    from kv_manager.errors import KVCacheError, KVErrorCode

    bm = BlockManager(2, 4, enable_prefix_caching=False)
    bm.admit("s", [1, 2, 3, 4])  # block 0 full
    bm.commit("s", 4)
    tree = DraftTree([5, 6, 7, 8], [-1, 0, 1, 2])
    slots = bm.append("s", tree.tokens)  # block 1 full: the pool is exhausted
    verdict = Verdict(path=[0, 1, 2, 3], tokens=[6, 7, 8, 9])
    before = (bm.num_tokens("s"), bm.num_computed_tokens("s"), bm.block_table("s"), bm.token_ids("s"))
    with pytest.raises(KVCacheError) as info:
        commit_accepted([], bm, "s", 4, tree, verdict, slots)
    assert info.value.code == KVErrorCode.OUT_OF_BLOCKS
    assert (bm.num_tokens("s"), bm.num_computed_tokens("s"), bm.block_table("s"), bm.token_ids("s")) == before
