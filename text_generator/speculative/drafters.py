"""Drafters: cheap guesses of a request's next tokens, as a DraftTree rooted at its last token.

The speculative driver calls, per request: `start(seq_id, prompt)` once; then per step
`propose(seq_ids, budgets)` -> one DraftTree per request (root = the last token of its context),
and after verification `update(seq_id, emitted)` with the tokens the target emitted (accepted
drafts + its own next token); `finish(seq_id)` at the end. A drafter never sees logits of the
target; whatever it proposes, verification keeps the output exact.

A drafter that reads the target's hidden states (EAGLE-3, speculative/eagle3.py) has a
`hidden_layers` attribute (output_hidden_states indices); the driver (SpeculativeDecoder, or
LLMEngine through hidden_feed.py) then asks forward_tensor for
those states and passes them as `start(seq_id, prompt, hidden=[prompt rows, n, H])` and
`update(seq_id, emitted, hidden=[len(emitted), n, H])` (the states at the accepted path).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from kv_manager import BlockManager
from text_generator.speculative.tree import DraftTree


class Drafter(Protocol):
    def start(self, seq_id: Hashable, prompt: Sequence[int]) -> None: ...
    def propose(self, seq_ids: Sequence[Hashable], budgets: Sequence[int]) -> list[DraftTree]: ...
    def update(self, seq_id: Hashable, emitted: Sequence[int]) -> None: ...
    def finish(self, seq_id: Hashable) -> None: ...


@dataclass
class _NgramState:
    tokens: list[int]
    # (n-gram tuple) -> end positions e (tokens[e-n:e] is the n-gram, tokens[e] its continuation),
    # ascending; only n-grams that end before the last token are indexed, so every entry has a
    # continuation in the context.
    index: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    indexed_upto: int = 0  # end positions < indexed_upto are in the index


class NgramDrafter:
    """Prompt lookup: continue the context the way it continued after earlier occurrences of its
    last n tokens (n from max_ngram down to min_ngram).

    Owns, per request, its tokens and an index n-gram -> end positions, extended incrementally as
    tokens arrive (O(max_ngram - min_ngram + 1) dict appends per token), so a proposal costs a few
    dict lookups and a scan of at most `max_scan` recent occurrences, never a pass over the
    context. Up to `branches` distinct continuations (most recent occurrence first, longer n
    first) of up to `depth` tokens are merged into a trie: branches = 1 gives a chain. `budgets`
    caps the nodes of each tree, the root included.
    """

    def __init__(self, *, max_ngram: int = 3, min_ngram: int = 1, depth: int = 4, branches: int = 1,
                 max_scan: int = 64):
        if not 1 <= min_ngram <= max_ngram or depth < 1 or branches < 1 or max_scan < 1:
            raise ValueError("NgramDrafter: expected 1 <= min_ngram <= max_ngram, depth >= 1, branches >= 1, max_scan >= 1")
        self.max_ngram, self.min_ngram, self.depth = max_ngram, min_ngram, depth
        self.branches, self.max_scan = branches, max_scan
        self._seqs: dict[Hashable, _NgramState] = {}

    def start(self, seq_id: Hashable, prompt: Sequence[int]) -> None:
        self._seqs[seq_id] = _NgramState(list(prompt))

    def update(self, seq_id: Hashable, emitted: Sequence[int]) -> None:
        self._seqs[seq_id].tokens.extend(emitted)

    def finish(self, seq_id: Hashable) -> None:
        self._seqs.pop(seq_id, None)

    def _index(self, s: _NgramState) -> None:
        toks = s.tokens
        for e in range(s.indexed_upto, len(toks)):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if e >= n:
                    s.index.setdefault(tuple(toks[e - n:e]), []).append(e)
        s.indexed_upto = len(toks)

    def continuations(self, seq_id: Hashable) -> list[list[int]]:
        """Distinct continuations (each 1..depth tokens), best first."""
        s = self._seqs[seq_id]
        self._index(s)  # end positions < len: every indexed occurrence has a continuation
        toks, out, seen = s.tokens, [], set()
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(toks) < n:
                continue
            ends = s.index.get(tuple(toks[len(toks) - n:]), ())
            for e in reversed(ends[-self.max_scan:]):
                cont = tuple(toks[e:e + self.depth])
                if cont and cont not in seen:
                    seen.add(cont)
                    out.append(list(cont))
                    if len(out) == self.branches:
                        return out
        return out

    def propose(self, seq_ids: Sequence[Hashable], budgets: Sequence[int]) -> list[DraftTree]:
        return [self._trie(self._seqs[s].tokens[-1], self.continuations(s), b) for s, b in zip(seq_ids, budgets)]

    @staticmethod
    def _trie(root: int, conts: list[list[int]], budget: int) -> DraftTree:
        tokens, parents = [root], [-1]
        child: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for cont in conts:
            node = 0
            for tok in cont:
                nxt = child.get((node, tok))
                if nxt is None:
                    if len(tokens) >= budget:
                        break
                    nxt = child[(node, tok)] = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                node = nxt
        return DraftTree(tokens, parents)


@dataclass
class _DraftSeq:
    context: list[int]  # verified tokens (the prompt, then every emitted token)
    computed: int = 0  # leading tokens of the block manager's list whose draft K/V is written
    drafted: list[int] = field(default_factory=list)  # the last proposal, after the context


class DraftModelDrafter:
    """A smaller TextGenerator proposes a greedy chain of `k` tokens.

    Owns the draft model's kv_cache and BlockManager (same vocabulary as the target). Per
    request the block manager holds the verified context and, during a proposal, the drafts
    after it. Only verified tokens are committed (style rule 12): after `update`, the drafts
    the target accepted whose K/V the draft model already wrote are committed and the rest are
    truncated; the emitted tokens it has not computed wait for the next proposal, which feeds
    them in one multi-token step (q_lens) before drafting the chain one token per step.
    """

    def __init__(self, generator, kv_cache, block_manager: BlockManager, *, k: int = 4,
                 max_seq_len: int | None = None):
        if k < 1:
            raise ValueError(f"DraftModelDrafter: expected k >= 1, got {k}")
        self.gen, self.kv_cache, self.bm, self.k = generator, kv_cache, block_manager, k
        self.max_seq_len = max_seq_len or generator.max_position_embeddings
        self._seqs: dict[Hashable, _DraftSeq] = {}

    def start(self, seq_id: Hashable, prompt: Sequence[int]) -> None:
        cached = self.bm.admit(seq_id, list(prompt))  # prefix-cache hits are computed already
        self._seqs[seq_id] = _DraftSeq(list(prompt), computed=cached)

    def finish(self, seq_id: Hashable) -> None:
        if self._seqs.pop(seq_id, None) is not None:
            self.bm.free(seq_id)

    def update(self, seq_id: Hashable, emitted: Sequence[int]) -> None:
        s = self._seqs[seq_id]
        n = len(s.context)
        usable = max(0, s.computed - n)  # drafts with K/V (all but the last one proposed)
        # The last emitted token is never counted as computed, even when it equals a draft whose
        # K/V is written (a chain the engine trimmed to its token budget): the next proposal
        # must feed at least that token to get the logits it drafts from.
        match = 0
        while match < min(len(emitted) - 1, usable) and emitted[match] == s.drafted[match]:
            match += 1
        s.computed = min(s.computed, n + match)
        self.bm.truncate(seq_id, n + match)
        self.bm.commit(seq_id, s.computed)
        self.bm.append(seq_id, list(emitted[match:]))
        s.context += emitted
        s.drafted = []

    def propose(self, seq_ids: Sequence[Hashable], budgets: Sequence[int]) -> list[DraftTree]:
        """A chain of min(k, budget - 1) greedy drafts per request (fewer near max_seq_len)."""
        states = [self._seqs[s] for s in seq_ids]
        ks = [max(0, min(self.k, b - 1, self.max_seq_len - len(st.context))) for st, b in zip(states, budgets)]
        self._fit_pool(seq_ids, ks)
        # step 0 feeds every token without draft K/V; step j > 0 feeds the draft of step j - 1
        feed = [self.bm.token_ids(s)[st.computed:] for s, st in zip(seq_ids, states)]
        for j in range(max(ks, default=0)):
            live = [i for i in range(len(seq_ids)) if j < ks[i]]
            nxt = self._forward([seq_ids[i] for i in live], [feed[i] for i in live])
            for i, t in zip(live, nxt):
                states[i].computed += len(feed[i])
                states[i].drafted.append(t)
                self.bm.append(seq_ids[i], [t])
                feed[i] = [t]
        return [DraftTree.chain([st.context[-1]] + st.drafted) for st in states]

    def _fit_pool(self, seq_ids: Sequence[Hashable], ks: list[int]) -> None:
        """Shorten the chains (in place; first come first served) so that all the drafts find
        blocks in the draft model's pool: a full pool gives shorter or no drafts, never an
        OUT_OF_BLOCKS in the middle of a proposal."""
        bm, bs = self.bm, self.bm.block_size
        available = bm.num_free_blocks + bm.num_cached_blocks
        for i, s in enumerate(seq_ids):
            n, held = bm.num_tokens(s), len(bm.block_table(s))
            while ks[i] > 0 and -(-(n + ks[i]) // bs) - held > available:
                ks[i] -= 1
            available -= max(0, -(-(n + ks[i]) // bs) - held)

    def _forward(self, seq_ids: list, feeds: list[list[int]]) -> list[int]:
        """One draft-model step over each request's last len(feed) tokens (in the block manager,
        not yet computed); -> the greedy next token of each request."""
        ids, pos, slots, lens, q_lens = [], [], [], [], []
        for s, f in zip(seq_ids, feeds):
            end = self.bm.num_tokens(s)
            ids += f
            pos += range(end - len(f), end)
            slots.append(self.bm.slots(s, end - len(f), end))
            lens.append(end)
            q_lens.append(len(f))
        last = torch.tensor(q_lens).cumsum(0) - 1
        logits = self.gen.forward_tensor(
            torch.tensor(ids), torch.tensor(pos), any(q > 1 for q in q_lens), self.kv_cache,
            self.bm.block_tables(seq_ids), torch.cat(slots), torch.tensor(lens, dtype=torch.int32),
            self.max_seq_len, last, q_lens=q_lens)
        return logits.argmax(dim=-1).tolist()
