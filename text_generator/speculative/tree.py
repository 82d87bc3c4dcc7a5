"""Draft trees and the flat tensors that carry them through one forward_tensor call.

A drafter proposes a DraftTree per request; `build_tree_batch` lays the trees of a batch out as
forward_tensor's decode-step arguments; the verifier (verify.py) reads back one logits row per
node. Node 0 is the root: the last accepted token, whose K/V is not in the cache yet, so the
root and the drafts go through the model together.

    parents   [-1, 0, 1, 0, 3]          node i's parent; parents[i] < i (parents before children)
    tokens    [r,  a, b, c, d]          tree:   r -+- a - b
    depth     [0,  1, 2, 1, 2]                     +- c - d
    mask row i: node i sees its ancestors and itself (cached tokens are always visible)
        r a b c d
    r   1 . . . .
    a   1 1 . . .
    b   1 1 1 . .
    c   1 . . 1 .
    d   1 . . 1 1

In the cache, node i is written at kv index cached_len + i (the contract's slot rule for new
token i); its rotary position is cached_len + depth(i), which the contract allows whenever a
spec_mask is given (input_length - q_len <= position < input_length).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class DraftTree:
    """A request's proposal: tokens[0] is the root (the last accepted token); parents[0] = -1 and
    parents[i] < i for i > 0. Children are tried in the order of their node index (the sampling
    verifier's order), so a drafter lists its best guesses first."""

    tokens: list[int]
    parents: list[int]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents) or not self.tokens:
            raise ValueError(f"DraftTree: expected equal, non-empty tokens and parents, got "
                             f"{len(self.tokens)} tokens and {len(self.parents)} parents")
        if self.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(self.parents) if i):
            raise ValueError(f"DraftTree: expected parents[0] = -1 and 0 <= parents[i] < i, got {self.parents}")

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> "DraftTree":
        """root, d1, d2, ...: each node the child of the one before."""
        return cls(list(tokens), list(range(-1, len(tokens) - 1)))

    @property
    def size(self) -> int:
        return len(self.tokens)

    def depths(self) -> list[int]:
        d = [0] * self.size
        for i in range(1, self.size):
            d[i] = d[self.parents[i]] + 1
        return d

    def children(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.size)]
        for i in range(1, self.size):
            out[self.parents[i]].append(i)
        return out

    def path(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        out = [node]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return out[::-1]

    def mask(self) -> torch.Tensor:
        """[n, n] bool: row i is True at i's ancestors and at i itself."""
        n = self.size
        m = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            if i:
                m[i] = m[self.parents[i]]
            m[i, i] = True
        return m

    def pruned(self, max_nodes: int, max_depth: int) -> "DraftTree":
        """The subtree of nodes with depth <= max_depth, then its first max_nodes nodes (a prefix
        of a parents-first list is itself a tree). max_nodes >= 1 keeps at least the root."""
        depth = self.depths()
        keep = [i for i in range(self.size) if depth[i] <= max_depth][: max(1, max_nodes)]
        new_index = {old: new for new, old in enumerate(keep)}
        return DraftTree([self.tokens[i] for i in keep],
                         [-1] + [new_index[self.parents[i]] for i in keep[1:]])


@dataclass
class TreeBatch:
    """forward_tensor's arguments for one speculative decode step (is_prefill=False), plus what
    the verifier needs to read each request's node logits back. T = total nodes, B = requests.

    input_ids      [T] int64: the trees' tokens, request after request, nodes in index order
    position_ids   [T] int64: cached_len + depth
    slots          [T] int64: slot of kv index cached_len + i for node i
    input_lengths  [B] int32: cached_len + tree size
    q_lens         [B] int32: tree sizes
    block_tables   [B, W] int32
    spec_mask      [T, max(q_lens)] bool, padded with False; None when every tree is a lone root
                   (a plain decode step)
    offsets        [B + 1] python ints: request b's nodes are rows offsets[b] : offsets[b+1]
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    slots: torch.Tensor
    input_lengths: torch.Tensor
    q_lens: torch.Tensor
    block_tables: torch.Tensor
    spec_mask: torch.Tensor | None
    offsets: list[int]


MAX_BIT_NODES = 63  # ancestor sets travel as int64 bit masks (bit j = node j) up to this tree size


def _ancestor_bits(tree: DraftTree) -> tuple[list[int], list[int]]:
    """-> (depth, ancestor bit mask incl. the node itself) per node. A chain, the common case, is
    closed-form; a branching tree takes one pass over its parents."""
    n = tree.size
    if tree.parents == list(range(-1, n - 1)):
        return list(range(n)), [(1 << (i + 1)) - 1 for i in range(n)]
    depth, bits = [0] * n, [1] + [0] * (n - 1)
    for i in range(1, n):
        p = tree.parents[i]
        depth[i], bits[i] = depth[p] + 1, bits[p] | (1 << i)
    return depth, bits


def build_tree_batch(
    trees: Sequence[DraftTree],
    cached_lens: Sequence[int],
    slots: Sequence[torch.Tensor] | torch.Tensor,
    block_tables: torch.Tensor,
) -> TreeBatch:
    """Flatten the trees of a batch. slots: per request an int tensor [trees[b].size], the slots
    of kv indices cached_lens[b] .. cached_lens[b] + size - 1 (e.g. BlockManager.slots), or all
    of them as one tensor [T]; block_tables [B, W].

    Tensors are built from flat int lists in one go (no tensor op per node or per tree): the
    tree masks come from each node's ancestor set as an int64 bit mask, unpacked for the whole
    batch at once,

        bits[t] = 0b..1011  ->  spec_mask[t] = [1, 1, 0, 1, 0, ..]   (bit j = node j of its tree)
    """
    sizes = [t.size for t in trees]
    max_q = max(sizes)
    pos, bits = [], []
    for tree, cached in zip(trees, cached_lens):
        d, b = _ancestor_bits(tree)
        pos += [cached + x for x in d]
        bits += b
    spec_mask = None
    if max_q > MAX_BIT_NODES:
        spec_mask = torch.cat([torch.nn.functional.pad(t.mask(), (0, max_q - t.size)) for t in trees])
    elif max_q > 1:
        # bit 63 is int64's sign bit: an arithmetic shift keeps it set, & 1 reads it right
        spec_mask = (torch.tensor(bits, dtype=torch.int64)[:, None] >> torch.arange(max_q)) & 1 != 0
    if not isinstance(slots, torch.Tensor):
        slots = torch.cat([torch.as_tensor(s, dtype=torch.int64) for s in slots])
    return TreeBatch(
        input_ids=torch.tensor(list(itertools.chain.from_iterable(t.tokens for t in trees)), dtype=torch.int64),
        position_ids=torch.tensor(pos, dtype=torch.int64),
        slots=slots if slots.dtype == torch.int64 else slots.to(torch.int64),
        input_lengths=torch.tensor([c + s for c, s in zip(cached_lens, sizes)], dtype=torch.int32),
        q_lens=torch.tensor(sizes, dtype=torch.int32),
        block_tables=block_tables,
        spec_mask=spec_mask,
        offsets=list(itertools.accumulate(sizes, initial=0)),
    )
