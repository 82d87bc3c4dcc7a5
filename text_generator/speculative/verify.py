"""Lossless verification of a draft tree from the target model's logits over its nodes.

Input: one request's DraftTree and logits [tree.size, vocab] from ONE forward pass over the tree
(row i = the target's next-token logits after the root-to-i path). Output: a Verdict: the
accepted root-to-node path and the tokens to emit (the accepted drafts, then one token the
target chooses itself: the "bonus", or the correction after a rejection). A batch's drivers
read its logits back once: every node's greedy target (`tree_targets`, penalties included) for
`accept_greedy`, or the probabilities for `verify_sampling_batch`, which samples all trees at
once.

Greedy (temperature 0): node i is accepted iff every node on its path equals the argmax of its
parent's row; the deepest accepted node wins (first in index order among equals), and the bonus
is the argmax of its row. The output is therefore plain greedy decoding, token for token.

Greedy under a grammar (structured output, `verify_greedy_grammar`): a node's target is the
argmax of its row masked by the grammar's state after the root-to-node path, so the accepted
path is walked with the request's grammar, node by node (a draft the grammar forbids is never
the masked argmax, so it is rejected):

    node = root
    loop: target = masked argmax of node's row (grammar state = after the path so far)
          a child drafting target, and target does not end the grammar? accept it, descend
          otherwise: target is the bonus; stop
    then undo the walk's accepts (GrammarMatcher.rollback): the engine's emit advances the
    grammar over the emitted tokens, as for any step

which is plain structured greedy decoding, token for token.

Sampling (temperature > 0): recursive rejection sampling with deterministic drafts (a one-hot
draft distribution per child, as an n-gram or greedy draft model proposes). At the current node
with target distribution p, the children are tried in index order: child c (token x) is accepted
with probability p(x); on rejection p <- normalize(p with x set to 0) and the next child is
tried; if none is accepted the emitted token is sampled from the final p. Each emitted token
then has exactly the distribution of plain sampling from p (the standard speculative-sampling
argument with q = one-hot(x): accept min(1, p/q) = p(x), residual normalize(max(p - q, 0))).

p is the target's distribution after temperature, top-k and top-p (`target_probs`); plain
sampling with the same settings is the distribution that is preserved.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import torch

from text_generator.sampling import SamplingParams, penalize, token_counts
from text_generator.speculative.tree import DraftTree, TreeBatch


@dataclass(frozen=True)
class TreeSampling:
    """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"TreeSampling: expected temperature >= 0, top_k >= 0, 0 < top_p <= 1, got {self}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Verdict:
    """path: accepted node indices, root first (len >= 1); tokens: what to emit, the drafts of
    path[1:] then the target's own next token (len = len(path))."""

    path: list[int]
    tokens: list[int]


def target_probs(logits: torch.Tensor, params: TreeSampling) -> torch.Tensor:
    """[n, V] logits -> [n, V] float32 probabilities after temperature, top-k and top-p."""
    x = logits.float() / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_x, dim=-1)) >= params.top_p  # mass before it >= top_p
        x = x.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    return torch.softmax(x, dim=-1)


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    return accept_greedy(tree, logits.argmax(dim=-1).tolist())


def accept_greedy(tree: DraftTree, target: Sequence[int]) -> Verdict:
    """verify_greedy's rule on the nodes' greedy targets read back already (target[i]: the
    target model's next token after node i's path). A chain, the common case, stops at its first
    mismatch; a branching tree takes one pass over its nodes. Plain ints on the host: a batch's
    targets come back in one sync, and this walk costs well under a microsecond per node, less
    than the ~30 tensor ops that would do it on the device (benchmarks/RESULTS.md)."""
    n, toks = tree.size, tree.tokens
    if tree.parents == list(range(-1, n - 1)):
        m = 0
        while m + 1 < n and toks[m + 1] == target[m]:
            m += 1
        return Verdict(list(range(m + 1)), toks[1:m + 1] + [target[m]])
    ok = [True] + [False] * (n - 1)
    depth = tree.depths()
    best = 0
    for i in range(1, n):
        p = tree.parents[i]
        ok[i] = ok[p] and toks[i] == target[p]
        if ok[i] and depth[i] > depth[best]:
            best = i
    path = tree.path(best)
    return Verdict(path, [toks[i] for i in path[1:]] + [target[best]])


def tree_targets(logits: torch.Tensor, batch: TreeBatch, params: Sequence[SamplingParams],
                 prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Each node's greedy next token, [T] int64, for logits [T, V] of a tree batch: the argmax of
    its row, after the request's penalties where it has them (params, prompt_ids, output_ids: one
    per request). A node's history is the request's output so far plus the drafts on its path
    (the root, output_ids[-1], is in the output already), so its target is what plain greedy
    decoding with penalties would pick after that path:

        counts(node t) = counts(output) + one per drafted token on root..t (spec_mask row t)
    """
    pen = [b for b, p in enumerate(params) if p.has_penalties]
    if not pen:
        return logits.argmax(dim=-1)
    dev, V = logits.device, logits.shape[-1]
    off = batch.offsets
    rows = torch.cat([torch.arange(off[b], off[b + 1]) for b in pen])  # [R] nodes of penalised requests
    owner = torch.repeat_interleave(torch.arange(len(pen)), torch.tensor([off[b + 1] - off[b] for b in pen]))
    prompt_counts = token_counts([prompt_ids[b] for b in pen], V, dev)[owner.to(dev)]
    out_counts = token_counts([output_ids[b] for b in pen], V, dev)[owner.to(dev)]
    if batch.spec_mask is not None:
        # drafted ancestors: spec_mask columns j >= 1 of the node's row -> the token of node j
        on_path = batch.spec_mask[rows].clone()
        on_path[:, 0] = False
        r, j = on_path.nonzero(as_tuple=True)
        start = torch.tensor([off[b] for b in pen])[owner]
        toks = batch.input_ids[start[r] + j]
        out_counts.view(-1).index_put_(((r * V + toks).to(dev),), torch.ones(r.numel(), device=dev),
                                       accumulate=True)
    target = logits.argmax(dim=-1)
    pen_params = [params[b] for b in pen for _ in range(off[b + 1] - off[b])]
    rows_dev = rows.to(dev)
    target[rows_dev] = penalize(logits[rows_dev].float(), prompt_counts, out_counts, pen_params).argmax(dim=-1)
    return target


def verify_greedy_grammar(tree: DraftTree, logits: torch.Tensor, grammar) -> Verdict:
    """verify_greedy with each node's row masked by `grammar` (a structured.RequestGrammar at
    the root's state; left at that state on return)."""
    children = tree.children()
    node, path, out = 0, [0], []
    try:
        while True:
            target = grammar.next_greedy(logits[node])
            nxt = next((c for c in children[node] if tree.tokens[c] == target), None)
            if nxt is not None:
                if not grammar.accept(target):
                    nxt = None
                elif grammar.terminated:  # nothing follows the stop token: emit it as the bonus
                    grammar.rollback(1)
                    nxt = None
            out.append(target)
            if nxt is None:
                return Verdict(path, out)
            path.append(nxt)
            node = nxt
    finally:
        grammar.rollback(len(path) - 1)


def verify_sampling(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Verdict:
    """probs [n, V] from target_probs; draws from `generator` (CPU) for reproducibility."""
    return verify_sampling_batch([tree], probs, generator)[0]


def verify_sampling_batch(trees: Sequence[DraftTree], probs: torch.Tensor, generator: torch.Generator
                          ) -> list[Verdict]:
    """Rejection sampling of every tree of a batch at once. probs [T, V]: target_probs of the
    trees' nodes, request after request (TreeBatch order); draws from `generator` (CPU).

    One copy of probs to the host (float64), then a fixed number of tensor steps over the whole
    batch: for each depth, for each child rank (children in index order), every request still
    walking tries its current node's next child at once:

        child[t, c]  row of node t's c-th child (-1: none), from the trees, once
        try:    u ~ U(0, 1) per request; accept iff u < p[b, token of the child]
        reject: p[b, x] <- 0, renormalise (the residual of a one-hot draft)
        after the ranks: accepted -> descend (p <- probs of the child); else stop, and the
                emitted token is sampled from the final p (one multinomial for the batch)
    """
    probs = probs.detach().to("cpu", torch.float64)
    B = len(trees)
    offs = list(itertools.accumulate((t.size for t in trees), initial=0))
    kids = [[] for _ in range(offs[-1])]
    for o, t in zip(offs, trees):
        for i, par in enumerate(t.parents[1:], 1):
            kids[o + par].append(o + i)
    C = max(1, max(map(len, kids)))
    child = torch.tensor([k + [-1] * (C - len(k)) for k in kids], dtype=torch.int64).view(-1, C)
    tokens = torch.tensor(list(itertools.chain.from_iterable(t.tokens for t in trees)), dtype=torch.int64)
    rows = torch.arange(B)
    cur = torch.tensor(offs[:-1], dtype=torch.int64)  # each request's current node (a row)
    walking = torch.ones(B, dtype=torch.bool)
    p = probs[cur].clone()
    final = torch.zeros_like(p)  # the distribution each request's last token is drawn from
    path = [cur.clone()]
    for _ in range(max(max(t.depths()) for t in trees) + 1):
        nxt = torch.full((B,), -1, dtype=torch.int64)
        for c in range(C):
            cand = child[cur, c]
            trying = walking & (nxt < 0) & (cand >= 0)
            x = tokens[cand.clamp_min(0)]
            u = torch.rand(B, dtype=torch.float64, generator=generator)
            px = p[rows, x]
            take = trying & (u < px)
            nxt = torch.where(take, cand, nxt)
            drop = trying & ~take
            if bool(drop.any()):
                q = p.clone()
                q[rows[drop], x[drop]] = 0.0
                total = q.sum(-1, keepdim=True)
                # total 0 cannot happen in exact arithmetic (p(x) = 1 is always accepted)
                q = torch.where(total > 0, q / total.clamp_min(1e-300), probs[cur])
                p = torch.where(drop[:, None], q, p)
        stop = walking & (nxt < 0)
        final[stop] = p[stop]
        walking &= ~stop
        cur = torch.where(walking, nxt, cur)
        p = torch.where(walking[:, None], probs[cur], p)
        path.append(torch.where(walking, nxt, -1))
        if not bool(walking.any()):
            break
    last = torch.multinomial(final, 1, generator=generator)[:, 0].tolist()
    nodes = torch.stack(path, 1).tolist()
    out = []
    for b, (o, t) in enumerate(zip(offs, trees)):
        walk = [n - o for n in nodes[b] if n >= 0]
        out.append(Verdict(walk, [t.tokens[i] for i in walk[1:]] + [last[b]]))
    return out


def verify(tree: DraftTree, logits: torch.Tensor, params: TreeSampling,
           generator: torch.Generator | None = None) -> Verdict:
    """Greedy or rejection-sampling verification of one request's tree (see the module doc)."""
    if params.greedy:
        return verify_greedy(tree, logits)
    if generator is None:
        raise ValueError("verify: sampling (temperature > 0) needs a torch.Generator")
    return verify_sampling(tree, target_probs(logits, params), generator)
