"""Speculative decoding over forward_tensor: draft a tree, verify it in ONE pass, keep the rest.

Per step and request:  drafter.propose -> DraftTree  -> BlockManager.append (slots of the nodes)
-> one forward_tensor(q_lens = tree sizes, spec_mask = tree masks) for the whole batch
-> verification of the whole batch (greedy, or batched rejection sampling) -> compact_accepted_kv -> truncate / append /
commit (only verified tokens are committed, style rule 12) -> drafter.update.

KV after verification. The tree's node i was written at kv index c + i (c = cached length);
the accepted path root = n0, n1, .., nm (node indices i_0 = 0 < i_1 < .. < i_m, depth k at i_k)
must end up at kv indices c + k. We compact: copy K/V of every layer from the slot of c + i_k to
the slot of c + k, rather than have the caller re-run the accepted tokens (one more forward) or
leave holes (the contract and every paged kernel assume a sequence's K/V is dense in kv order).
The copy is tiny (m tokens x layers) and a chain, the common case, needs none (i_k = k).

    kv index:  c   c+1  c+2  c+3  c+4          tree r -+- a - b      accepted path r, c, d
    before:    r    a    b    c    d                  +- c - d
    after:     r    c    d    .    .           (a, b, and the stale tail are truncated)
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Sequence

import torch

from kv_manager import BlockManager
from kv_manager.errors import KVCacheError, KVErrorCode
from text_generator.speculative.adaptive import AdaptiveSpeculation, DraftLengths
from text_generator.speculative.drafters import Drafter
from text_generator.speculative.tree import DraftTree, build_tree_batch
from text_generator.speculative.verify import (TreeSampling, Verdict, accept_greedy, target_probs,
                                              verify_sampling_batch)



def compact_accepted_kv(kv_cache, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """Copy K and V of every layer from src_slots [m] to dst_slots [m] (flat slots, int).

    All sources are read before any destination is written (a gather, then a scatter), so the
    result is right for any overlap; pairs with src == dst are skipped.
    """
    src = torch.as_tensor(src_slots, dtype=torch.int64)
    dst = torch.as_tensor(dst_slots, dtype=torch.int64)
    move = src != dst
    if not bool(move.any()):
        return
    src, dst = src[move], dst[move]
    for k_cache, v_cache in kv_cache:
        for cache in (k_cache, v_cache):
            flat = cache.view(-1, *cache.shape[2:])  # [num_blocks * block_size, kv_heads, head_dim]
            idx_src, idx_dst = src.to(cache.device), dst.to(cache.device)
            flat.index_copy_(0, idx_dst, flat.index_select(0, idx_src))


def commit_accepted(kv_cache, block_manager: BlockManager, seq_id: Hashable, cached: int,
                    tree: DraftTree, verdict: Verdict, tree_slots: torch.Tensor) -> None:
    """After a tree step: move the accepted path's K/V to kv indices cached .. cached + m,
    commit exactly those tokens, and append the target's own token as the next root.

    Before: the block manager holds cached committed tokens + the tree's nodes (uncommitted),
    tree_slots [tree.size] the slots the nodes were written at. After: cached + m + 1 committed
    (root and accepted drafts) + 1 uncommitted (verdict.tokens[-1]); rejected nodes are gone.
    """
    grow = len(verdict.path) + 1 - tree.size  # tokens beyond what the tree already holds
    if grow > 0 and not block_manager.can_append(seq_id, grow):
        # refuse before touching anything: the caller can preempt and retry
        raise KVCacheError(KVErrorCode.OUT_OF_BLOCKS,
                           f"commit_accepted: need {grow} more token slot(s) for the bonus token of "
                           f"{seq_id!r}, no free block")
    m = len(verdict.path)
    if verdict.path[-1] == m - 1:  # a prefix of the node list (any accepted chain): in place
        block_manager.truncate(seq_id, cached + m)
    else:
        src = tree_slots[verdict.path]
        # ids only: the nodes' K/V stays in place until the copy below, even in blocks this frees
        block_manager.truncate(seq_id, cached)
        dst = block_manager.append(seq_id, [tree.tokens[i] for i in verdict.path])
        compact_accepted_kv(kv_cache, src, dst)
    block_manager.commit(seq_id, cached + m)
    block_manager.append(seq_id, verdict.tokens[-1:])


@dataclass
class SpecStats:
    """forwards: target forward passes (the prefill included); emitted: generated tokens;
    accepted: draft tokens accepted; drafted: draft tokens proposed."""

    forwards: int = 0
    emitted: int = 0
    accepted: int = 0
    drafted: int = 0
    steps: list[int] = field(default_factory=list)  # tokens emitted per request-step

    @property
    def tokens_per_forward(self) -> float:
        return self.emitted / max(1, self.forwards)


class _NoDraft:
    """Plain decoding through the same driver: every tree is the lone root."""

    def __init__(self) -> None:
        self._last: dict[Hashable, int] = {}

    def start(self, seq_id: Hashable, prompt: Sequence[int]) -> None:
        self._last[seq_id] = prompt[-1]

    def update(self, seq_id: Hashable, emitted: Sequence[int]) -> None:
        self._last[seq_id] = emitted[-1]

    def finish(self, seq_id: Hashable) -> None:
        self._last.pop(seq_id, None)

    def propose(self, seq_ids: Sequence[Hashable], budgets: Sequence[int]) -> list[DraftTree]:
        return [DraftTree([self._last[s]], [-1]) for s in seq_ids]


class SpeculativeDecoder:
    """Drives generation for a batch of prompts on a TextGenerator with a drafter.

    Owns nothing but references: the target generator, its kv_cache and BlockManager (which it
    fills with sequences for the duration of `generate`, freeing them at the end), the drafter
    (None: plain decoding, one token per forward), the sampling parameters and a CPU
    torch.Generator seeded with `seed`; and the per-request draft lengths (adaptive_speculation:
    True, the default thresholds, as LLMEngine; an AdaptiveSpeculation, its thresholds; False:
    every request drafts up to max_tree_nodes - 1 nodes in every step): a request whose drafts
    keep failing stops drafting (its trees are the lone root: a decode step) and probes again
    now and then. Invariant between steps, per request: the block manager holds the accepted
    tokens, all committed but the last (the next tree's root).
    """

    def __init__(self, generator, kv_cache, block_manager: BlockManager, drafter: Drafter | None,
                 *, sampling: TreeSampling = TreeSampling(), seed: int = 0,
                 max_seq_len: int | None = None, max_tree_nodes: int = 64,
                 adaptive_speculation: "bool | AdaptiveSpeculation" = True):
        self.gen, self.kv_cache, self.bm = generator, kv_cache, block_manager
        self.drafter = drafter if drafter is not None else _NoDraft()
        self.sampling = sampling
        self.rng = torch.Generator().manual_seed(seed)
        self.max_seq_len = max_seq_len or generator.max_position_embeddings
        self.max_tree_nodes = max_tree_nodes
        # per request: draft nodes wanted per step, as in LLMEngine (adaptive.py; False: every step drafts)
        self.draft_lengths = DraftLengths.of(adaptive_speculation, max_tree_nodes - 1, "SpeculativeDecoder")
        self.num_steps = 0  # verify steps run: the step numbers of the draft lengths' probes
        self.stats = SpecStats()
        self._next_id = 0

    def _pick(self, logits: torch.Tensor) -> list[int]:
        """[n, V] -> the first token of each row (argmax, or a plain sample)."""
        if self.sampling.greedy:
            return logits.argmax(-1).tolist()
        return torch.multinomial(target_probs(logits, self.sampling).cpu(), 1, generator=self.rng)[:, 0].tolist()

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], *,
                 adapter_ids: Sequence[str | None] | None = None,
                 eos_token_id: int | None = None) -> list[list[int]]:
        """-> the generated tokens of each prompt (at most max_new_tokens; stops after eos).
        adapter_ids: one LoRA adapter per prompt (or None); it applies to every token of the
        request's prefill and trees, and its load (TextGenerator.adapter_cache_key) is the
        request's prefix-cache extra_key: K/V of an earlier load of the name is never reused."""
        B = len(prompts)
        budget = [max_new_tokens] * B if isinstance(max_new_tokens, int) else list(max_new_tokens)
        adapters = list(adapter_ids) if adapter_ids is not None else [None] * B
        if any(len(p) + n > self.max_seq_len for p, n in zip(prompts, budget)):
            raise ValueError(f"generate: expected len(prompt) + max_new_tokens <= max_seq_len={self.max_seq_len}")
        ids = [("spec", self._next_id + i) for i in range(B)]
        self._next_id += B
        out: list[list[int]] = [[] for _ in range(B)]
        try:
            for s in ids:
                self.draft_lengths.add(s)
            self._prefill(ids, prompts, adapters, out)
            live = [b for b in range(B) if not self._done(out[b], budget[b], eos_token_id)]
            while live:
                self._step([ids[b] for b in live], [adapters[b] for b in live],
                           [budget[b] - len(out[b]) for b in live], [out[b] for b in live])
                live = [b for b in live if not self._done(out[b], budget[b], eos_token_id)]
        finally:
            for s in ids:
                if s in self.bm:
                    self.bm.free(s)
                self.drafter.finish(s)
                self.draft_lengths.remove(s)
        if eos_token_id is not None:
            out = [o[: o.index(eos_token_id) + 1] if eos_token_id in o else o for o in out]
        return [o[:n] for o, n in zip(out, budget)]

    @staticmethod
    def _done(out: list[int], budget: int, eos: int | None) -> bool:
        return len(out) >= budget or (eos is not None and eos in out)

    def _prefill(self, ids, prompts, adapters, out) -> None:
        keys = [None if a in (None, "base") else self.gen.adapter_cache_key(a) for a in adapters]
        cached = [self.bm.admit(s, list(p), extra_key=k) for s, p, k in zip(ids, prompts, keys)]
        q = [len(p) - c for p, c in zip(prompts, cached)]
        toks = torch.cat([torch.as_tensor(list(p[c:])) for p, c in zip(prompts, cached)])
        pos = torch.cat([torch.arange(c, len(p)) for p, c in zip(prompts, cached)])
        slots = torch.cat([self.bm.slots(s, c, len(p)) for s, p, c in zip(ids, prompts, cached)])
        last = torch.tensor(q).cumsum(0) - 1
        layers = getattr(self.drafter, "hidden_layers", None)  # a drafter reading the target's states
        # such a drafter wants the states of every prompt token: all rows (logits too, by the contract)
        res = self.gen.forward_tensor(
            toks, pos, True, self.kv_cache, self.bm.block_tables(ids), slots,
            torch.tensor([len(p) for p in prompts], dtype=torch.int32), self.max_seq_len,
            last if layers is None else None, q_lens=q, adapter_ids=self._adapters_arg(adapters),
            **self._hidden_arg(layers))
        logits, hidden = (res, None) if layers is None else (res[0][last.to(res[0].device)], res[1])
        self.stats.forwards += 1
        for b, (s, p, t, o) in enumerate(zip(ids, prompts, self._pick(logits), out)):
            self.bm.commit(s, len(p))
            self.bm.append(s, [t])
            if hidden is None:
                self.drafter.start(s, list(p))
            else:
                self.drafter.start(s, list(p), hidden=hidden[int(last[b]) + 1 - q[b]: int(last[b]) + 1])
            self.drafter.update(s, [t])
            o.append(t)
            self.stats.emitted += 1

    @staticmethod
    def _hidden_arg(layers) -> dict:
        return {} if layers is None else {"output_hidden_states": list(layers)}

    @staticmethod
    def _adapters_arg(adapters):
        return None if all(a is None for a in adapters) else list(adapters)

    def _propose(self, ids, cached, remaining, outs) -> list[DraftTree]:
        """Each request's tree of this step: the drafter's, for the requests whose draft length
        (draft_lengths) and room want one, else the lone root (its last token: a decode step)."""
        step, lengths = self.num_steps, self.draft_lengths
        # a tree writes size tokens of K/V and emits at most depth + 1 <= size tokens
        budgets = [max(1, min(self.max_tree_nodes, lengths.wanted(s, step) + 1, self.max_seq_len - c, r))
                   for s, c, r in zip(ids, cached, remaining)]
        drafting = [b for b, n in enumerate(budgets) if n > 1]
        proposed = self.drafter.propose([ids[b] for b in drafting], [budgets[b] for b in drafting]) \
            if drafting else []
        trees = [DraftTree([o[-1]], [-1]) for o in outs]
        for b, t in zip(drafting, proposed):
            trees[b] = t.pruned(budgets[b], remaining[b] - 1)
            if trees[b].size == 1:
                lengths.record(ids[b], step, 0, 0)  # the drafter had nothing: nothing accepted
        return trees

    def _step(self, ids, adapters, remaining, outs) -> None:
        cached = [self.bm.num_computed_tokens(s) for s in ids]
        trees = self._propose(ids, cached, remaining, outs)
        for s, t in zip(ids, trees):
            self.bm.append(s, t.tokens[1:])
        batch = build_tree_batch(trees, cached, [self.bm.slots(s, c, c + t.size) for s, c, t in zip(ids, cached, trees)],
                                 self.bm.block_tables(ids))
        kwargs = dict(q_lens=batch.q_lens, adapter_ids=self._adapters_arg(adapters))
        if batch.spec_mask is not None:
            kwargs["spec_mask"] = batch.spec_mask
        layers = getattr(self.drafter, "hidden_layers", None)
        out = self.gen.forward_tensor(
            batch.input_ids, batch.position_ids, False, self.kv_cache, batch.block_tables,
            batch.slots, batch.input_lengths, self.max_seq_len, None, **kwargs, **self._hidden_arg(layers))
        logits, hidden = (out, None) if layers is None else out
        self.stats.forwards += 1
        off = batch.offsets
        if self.sampling.greedy:  # every node's target read back at once, accepted on the host
            target = logits.argmax(dim=-1).tolist()
            verdicts = [accept_greedy(t, target[off[b]:off[b + 1]]) for b, t in enumerate(trees)]
        else:
            verdicts = verify_sampling_batch(trees, target_probs(logits, self.sampling), self.rng)
        for b, (s, c, t, v) in enumerate(zip(ids, cached, trees, verdicts)):
            commit_accepted(self.kv_cache, self.bm, s, c, t, v, batch.slots[batch.offsets[b]:batch.offsets[b + 1]])
            if hidden is None:
                self.drafter.update(s, v.tokens)
            else:  # the target's states at the accepted path: the drafter's next entries
                rows = torch.tensor([batch.offsets[b] + i for i in v.path], device=hidden.device)
                self.drafter.update(s, v.tokens, hidden=hidden.index_select(0, rows))
            if t.size > 1:
                self.draft_lengths.record(s, self.num_steps, max(t.depths()), len(v.path) - 1)
            outs[b].extend(v.tokens)
            self.stats.emitted += len(v.tokens)
            self.stats.accepted += len(v.path) - 1
            self.stats.drafted += t.size - 1
            self.stats.steps.append(len(v.tokens))
        self.num_steps += 1

