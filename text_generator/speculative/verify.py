"""Lossless verification of a draft tree from the target model's logits over its nodes.

Input: one request's DraftTree and logits [tree.size, vocab] from ONE forward pass over the tree
(row i = the target's next-token logits after the root-to-i path). Output: a Verdict: the
accepted root-to-node path and the tokens to emit (the accepted drafts, then one token the
target chooses itself: the "bonus", or the correction after a rejection).

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

from dataclasses import dataclass

import torch

from text_generator.speculative.tree import DraftTree


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
    target = logits.argmax(dim=-1).tolist()  # [n]
    ok = [True] + [False] * (tree.size - 1)
    depth = tree.depths()
    best = 0
    for i in range(1, tree.size):
        p = tree.parents[i]
        ok[i] = ok[p] and tree.tokens[i] == target[p]
        if ok[i] and depth[i] > depth[best]:
            best = i
    path = tree.path(best)
    return Verdict(path, [tree.tokens[i] for i in path[1:]] + [target[best]])


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
    probs = probs.detach().to("cpu", torch.float64)
    children = tree.children()
    node, path, out = 0, [0], []
    while True:
        p = probs[node].clone()
        nxt = None
        for c in children[node]:
            x = tree.tokens[c]
            if torch.rand((), dtype=torch.float64, generator=generator).item() < p[x].item():
                nxt = c
                break
            p[x] = 0.0
            total = p.sum()
            if total <= 0:  # cannot happen in exact arithmetic: p(x) = 1 is always accepted
                p = probs[node].clone()
                break
            p /= total
        if nxt is None:
            out.append(int(torch.multinomial(p, 1, generator=generator).item()))
            return Verdict(path, out)
        path.append(nxt)
        out.append(tree.tokens[nxt])
        node = nxt


def verify(tree: DraftTree, logits: torch.Tensor, params: TreeSampling,
           generator: torch.Generator | None = None) -> Verdict:
    """Greedy or rejection-sampling verification of one request's tree (see the module doc)."""
    if params.greedy:
        return verify_greedy(tree, logits)
    if generator is None:
        raise ValueError("verify: sampling (temperature > 0) needs a torch.Generator")
    return verify_sampling(tree, target_probs(logits, params), generator)
