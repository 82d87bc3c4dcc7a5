"""EAGLE-3 drafting: a one-layer draft head over the target's hidden states proposes greedy chains
(or trees of them: the head's best few first drafts, each continued greedily).

Draft entry p pairs the target's feature of position p with the token at p + 1, and its output
predicts the token at p + 2. Per request the drafter keeps the verified context and the target's
hidden states of the positions whose entry is not written yet ("pending"); the entry of the
context's last token waits for the token after it. With a context t_0 .. t_{n-1} (t_{n-1} the
next tree's root, whose target state comes with the next verify pass):

    position   ..  n-2               n-1         n          ..
    token      ..  t_{n-1}           d_1         d_2        ..     d_j: the head's drafts
    feature    ..  fc(h_{n-2})       g_{n-2}     g_{n-1}    ..     g: the head's pre-norm output
    predicts   ..  d_1               d_2         d_3

The driver (SpeculativeDecoder) reads the drafter's `hidden_layers` and asks forward_tensor for
those states (output_hidden_states), then passes them on:

    start(seq, prompt, hidden=[m', n, H_t])   the states of the prompt's last m' positions (all of
                                              them unless the target's prefix cache held some)
    propose(seqs, budgets)                    step 0: every pending entry in one multi-token step
                                              (features fc(target states)); steps 1 .. k-1: the
                                              last draft's entry (feature: the head's own g)
    update(seq, emitted, hidden=[e, n, H_t])  the states at the accepted path (root and accepted
                                              drafts): the next pending entries; the entries the
                                              head wrote from its own features are dropped

The head runs only in propose. A request that does not draft for a while (adaptive speculation
backed off: LLMEngine still hands over its states every step) only queues its states, as given,
and its next proposal catches the head up on all of them in step 0, the entries a head that ran
every step would have written (the head's context is its own K/V over every past position; none
can be dropped without changing its drafts). Steps 1 .. k-1 take their input ids from the
previous step's drafts on the device (prev_token_ids): the drafts are read back once per proposal.

A tree's branches run as lanes of one batch: branch c > 0 continues in a fork of its request's
committed entries in the head's block manager (BlockManager.fork; the partial last block copied),
freed when the proposal is made.

The head's K/V is a one-layer paged cache with a BlockManager of its own, without prefix
caching (an entry depends on the token after it, which a block's hash does not cover); only
entries computed from the target's states are committed (style rule 12). A request admitted
after a target prefix-cache hit has no target states for the cached positions: its head
attends to the positions after them (kv index = position - first position with a state; RoPE
only sees differences), which may lower acceptance and never changes the output.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Sequence

import torch

from kv_manager import BlockManager, allocate_kv_cache
from model_wrapper import ForwardBatch, ModelWrapper
from model_wrapper.eagle3_loader import load_eagle3_head
from model_wrapper.model_wrapper import make_backend
from model_wrapper.models.eagle3 import FEATURE
from text_generator.sampling import row_tensor
from text_generator.speculative.tree import DraftTree
from text_generator.validation import validate_step


# Raw pending rows a request keeps before they are picked (each may hold its whole step's states
# alive): adaptive speculation probes at least every 64 steps (max_backoff), so this bounds only
# requests that cannot draft for longer (a step with no token budget left for drafts), or a longer
# max_backoff.
RAW_LIMIT = 64


@dataclass
class _Eagle3Seq:
    context: list[int]  # verified tokens (prompt, then every emitted token)
    offset: int  # first position with a draft entry (the prompt's first position the target computed)
    computed: int  # positions < computed have entries written from target states (committed)
    # the target states of positions computed .. (their entries not written yet): first `picked`
    # [r, 3, H_t] in the head's dtype (a prompt's), then `raw` as the driver passed them
    # ([r_i, len(hidden_layers), H_t], picked at the next proposal: nothing per token until then)
    picked: torch.Tensor | None = None
    raw: list[torch.Tensor] = field(default_factory=list)

    def num_pending(self) -> int:
        return (0 if self.picked is None else self.picked.shape[0]) + sum(x.shape[0] for x in self.raw)


class Eagle3Drafter:
    """Drafts trees of `branches` chains of up to `k` tokens (branches = 1: a chain) with an
    EAGLE-3 head (model_wrapper/eagle3_loader.py).

    Owns the head (under a ModelWrapper of its own: attention backend and kernels of the
    target's kind; with cuda_graphs, on a backend that has them, the one-entry-per-lane steps
    1 .. k-1 replay decode graphs per lane bucket, the feature in a static buffer), its one-layer
    kv_cache of num_blocks x block_size and its BlockManager. hidden_layers: the distinct target
    states (output_hidden_states indices, sorted) the driver must pass to start / update; the
    head's three are picked from them.
    """

    def __init__(self, target, path: str, *, k: int = 4, branches: int = 1, num_blocks: int = 256,
                 block_size: int = 16, max_seq_len: int | None = None, cuda_graphs: bool = True):
        if k < 1 or branches < 1:
            raise ValueError(f"Eagle3Drafter: expected k >= 1 and branches >= 1, got k={k}, branches={branches}")
        mw = target.model_wrapper
        embed = None if target.tp_group.enabled else mw.model.model.embed_tokens.weight
        head, cfg, aux = load_eagle3_head(path, target.config, target_embed=embed, dtype=target.dtype,
                                          device=target.device)
        backend = make_backend(mw.backend.name, cfg, target.device, target.dtype)
        self.runner = ModelWrapper(head, cfg, backend, target.device, target.dtype, cuda_graphs=cuda_graphs,
                                   kernel_config=mw.kernel_config)
        self.head, self.k, self.branches = head, k, branches
        self.aux_layers = aux  # the head's three states, in fc's order
        self.hidden_layers = tuple(sorted(set(aux)))
        self._pick = torch.tensor([self.hidden_layers.index(i) for i in aux], device=target.device)
        self.kv_cache = allocate_kv_cache(self.runner.kv_cache_spec, num_blocks, block_size, target.device)
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.max_seq_len = max_seq_len or target.max_position_embeddings
        self._seqs: dict[Hashable, _Eagle3Seq] = {}

    # -- the Drafter protocol, with the target's hidden states -----------------------------------
    def start(self, seq_id: Hashable, prompt: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        """hidden [m', len(hidden_layers), H_t]: the target's states of the prompt's last m' positions."""
        m = len(prompt)
        self._check(hidden)
        if hidden is not None and hidden.shape[0] > m:
            raise ValueError(f"Eagle3Drafter.start: expected at most len(prompt)={m} rows of hidden, "
                             f"got {hidden.shape[0]}")
        first = m - (0 if hidden is None else hidden.shape[0])
        # picked now: a long prompt's rows wait in the head's dtype (and let go of the step's tensor)
        self._seqs[seq_id] = _Eagle3Seq(list(prompt), offset=first, computed=first,
                                        picked=None if hidden is None else self._pick_rows(hidden))

    def update(self, seq_id: Hashable, emitted: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        """hidden [len, len(hidden_layers), H_t]: the target's states of the positions after the
        pending ones (the accepted path of the last verify pass); None after a prefill.

        The head does not run here: the states wait (as given, no copy) until the next proposal
        writes every pending entry in one multi-token step. A request that does not draft for a
        while (adaptive speculation backed off) costs its steps nothing but this bookkeeping,
        and its next proposal catches the head up on all the positions at once, with the entries
        a head that ran every step would have written (same tokens, same features, causal)."""
        s = self._seqs[seq_id]
        self._check(hidden)
        if hidden is not None and hidden.shape[0] != len(emitted):
            raise ValueError(f"Eagle3Drafter.update: expected one row of hidden per emitted token "
                             f"({len(emitted)}), got {hidden.shape[0]}")
        self._drop_own_entries(seq_id, s)
        s.context += emitted
        if hidden is not None and hidden.shape[0]:
            s.raw.append(hidden)
            if len(s.raw) >= RAW_LIMIT:  # a request that has not drafted for a long while
                self._fold(s)

    def finish(self, seq_id: Hashable) -> None:
        if self._seqs.pop(seq_id, None) is not None and seq_id in self.bm:
            self.bm.free(seq_id)

    def propose(self, seq_ids: Sequence[Hashable], budgets: Sequence[int]) -> list[DraftTree]:
        """Per request a tree of `branches` chains: the head's best first drafts (best first), each
        continued greedily to k drafts, within budget - 1 nodes (branches = 1: one greedy chain).
        No drafts without a pending entry, or without blocks for the entries (a full pool drafts less)."""
        states = [self._seqs[s] for s in seq_ids]
        for s, st in zip(seq_ids, states):
            self._drop_own_entries(s, st)
        ready = [min(st.num_pending(), len(st.context) - 1 - st.computed) for st in states]
        widths = [min(self.branches, b - 1) if r > 0 else 0 for b, r in zip(budgets, ready)]
        ks = [max(0, min(self.k, (b - 1) // w, self.max_seq_len - len(st.context))) if w > 0 else 0
              for st, b, w in zip(states, budgets, widths)]
        self._fit_pool(seq_ids, ready, ks, widths)
        live = [i for i in range(len(seq_ids)) if ks[i] > 0]
        if not live:
            return [DraftTree.chain([st.context[-1]]) for st in states]
        # step 0: the pending entries, features from the target's states
        tokens, rows = [], []
        for i in live:
            st, r = states[i], ready[i]
            tokens.append(st.context[st.computed + 1: st.computed + 1 + r])
            rows.append(self._take_pending(st, r))
        feature = self.head.fuse(torch.cat(rows), self.runner.kernels)
        width = max(widths[i] for i in live)
        top, g = self._forward([seq_ids[i] for i in live], tokens, feature, width=width)
        # lanes: (request, branch, the lane's sequence in the block manager), from row j of step 0
        lanes, rows0 = [], []
        for j, i in enumerate(live):
            states[i].computed += ready[i]
            self.bm.commit(seq_ids[i], states[i].computed - states[i].offset)
            for c in range(widths[i]):
                lanes.append((i, c, seq_ids[i] if c == 0 else ("eagle3-branch", seq_ids[i], c)))
                rows0.append((j, c))
        # The drafts stay on the device until the proposal is done: each step's drafts are the next
        # step's input ids there (prev_token_ids), so the host plans step j + 1 while the device
        # runs step j, and reads every draft back at once at the end.
        cur = top.flatten().index_select(0, self._index([j * width + c for j, c in rows0]))  # [lanes]
        g = g.index_select(0, self._index([j for j, _ in rows0]))
        drafted, drafted_lanes = [cur], [list(range(len(lanes)))]  # per step: its drafts, its lanes
        forks = [lane for _, c, lane in lanes if c > 0]
        try:
            for lane in forks:  # a branch continues in a copy of its request's committed entries
                self._fork(lane[1], lane)
            alive = drafted_lanes[0]
            for step in range(1, max(ks)):  # one entry per lane and step, from the head's own feature
                keep = [x for x, a in enumerate(alive) if step < ks[lanes[a][0]]]
                if len(keep) < len(alive):
                    idx = self._index(keep)
                    alive, cur, g = [alive[x] for x in keep], cur.index_select(0, idx), g.index_select(0, idx)
                top, g = self._forward([lanes[a][2] for a in alive], [[0] for _ in alive], g, device_ids=cur)
                cur = top[:, 0]
                drafted.append(cur)
                drafted_lanes.append(alive)
        finally:
            for lane in forks:
                if lane in self.bm:
                    self.bm.free(lane)
        flat = iter(torch.cat(drafted).tolist())  # the proposal's one read back
        chains: list[list[list[int]]] = [[[] for _ in range(w)] for w in widths]  # per request, per branch
        for alive in drafted_lanes:
            for a in alive:
                i, c, _ = lanes[a]
                chains[i][c].append(next(flat))
        return [self._tree(st.context[-1], ch) for st, ch in zip(states, chains)]

    @staticmethod
    def _tree(root: int, chains: list[list[int]]) -> DraftTree:
        """root with one chain per branch, branch after branch (parents before children)."""
        tokens, parents = [root], [-1]
        for chain in chains:
            parent = 0
            for tok in chain:
                tokens.append(tok)
                parents.append(parent)
                parent = len(tokens) - 1
        return DraftTree(tokens, parents)

    def _fork(self, parent: Hashable, child: Hashable) -> None:
        """child: a copy of parent's committed entries in the head's cache (shared full blocks, the
        partial last block copied)."""
        for src, dst in self.bm.fork(parent, child):
            for k_cache, v_cache in self.kv_cache:
                k_cache[dst].copy_(k_cache[src])
                v_cache[dst].copy_(v_cache[src])

    # -- internals ------------------------------------------------------------------------------
    def _check(self, hidden: torch.Tensor | None) -> None:
        """A ValueError unless hidden is None or [r, len(hidden_layers), H_t]."""
        n = len(self.hidden_layers)
        if hidden is not None and (hidden.dim() != 3 or hidden.shape[1] != n
                                   or hidden.shape[2] != self.head.target_hidden):
            raise ValueError(f"Eagle3Drafter: expected hidden [rows, {n}, {self.head.target_hidden}] "
                             f"(output_hidden_states={list(self.hidden_layers)}), got {list(hidden.shape)}")

    def _pick_rows(self, hidden: torch.Tensor) -> torch.Tensor:
        """[r, len(hidden_layers), H_t] -> the head's three states [r, 3, H_t] on its device, in
        its dtype (fuse casts to it anyway)."""
        return hidden.to(self._pick.device, self.head.fc.weight.dtype).index_select(1, self._pick)

    def _drop_own_entries(self, seq_id: Hashable, st: _Eagle3Seq) -> None:
        """Truncate the entries the head wrote from its own features (the last proposal's)."""
        if seq_id in self.bm:  # admitted with its first entries (a BlockManager needs some)
            self.bm.truncate(seq_id, st.computed - st.offset)

    def _fold(self, st: _Eagle3Seq) -> None:
        """Pick the raw pending rows (in one op) onto the picked ones."""
        if st.raw:
            new = self._pick_rows(st.raw[0] if len(st.raw) == 1 else torch.cat(st.raw))
            st.picked = new if st.picked is None else torch.cat([st.picked, new])
            st.raw = []

    def _take_pending(self, st: _Eagle3Seq, r: int) -> torch.Tensor:
        """Pop the first r pending rows, picked: [r, 3, H_t]."""
        self._fold(st)
        rows = st.picked
        st.picked = rows[r:] if rows.shape[0] > r else None
        return rows[:r]

    def _fit_pool(self, seq_ids, ready: list[int], ks: list[int], widths: list[int]) -> None:
        """Narrow, then shorten the trees (in place, first come first served) so that every entry a
        proposal writes finds a block: per request ready + k - 1 entries, and per further branch
        a copy of the partial last block and k - 1 entries. A full pool drafts less, never fails."""
        bm, bs = self.bm, self.bm.block_size
        available = bm.num_free_blocks
        for i, s in enumerate(seq_ids):
            n, held = (bm.num_tokens(s), len(bm.block_table(s))) if s in bm else (0, 0)
            total = n + ready[i]  # entries after step 0

            def need(k, w):
                end = -(-(total + k - 1) // bs)
                return max(0, end - held) + (w - 1) * (end - total // bs if k > 1 else 0)

            while ks[i] > 0 and need(ks[i], widths[i]) > available:
                if widths[i] > 1:
                    widths[i] -= 1
                else:
                    ks[i] -= 1
            if ks[i] > 0:
                available -= need(ks[i], widths[i])

    def _forward(self, seq_ids: list, tokens: list[list[int]], feature: torch.Tensor, width: int = 1,
                 device_ids: torch.Tensor | None = None):
        """One head step: each request's `tokens` are its next entries (appended to the block
        manager here), feature [sum(len), H] theirs; device_ids [sum(len)]: the entries' ids on
        the device (then `tokens` are placeholders, and so are the block manager's ids of these
        entries: nothing reads them without prefix caching). -> (the `width` best drafts after
        each request's last entry, best first, as target ids [B, width] on the device; the head's
        pre-norm output there [B, H])."""
        ids, pos, slots, lens, q = [], [], [], [], []
        for s, toks in zip(seq_ids, tokens):
            if s in self.bm:
                start = self.bm.num_tokens(s)
                self.bm.append(s, toks)
            else:
                start = 0
                self.bm.admit(s, toks)
            ids += toks
            pos += range(start, start + len(toks))
            slots.append(self.bm.slots(s, start, start + len(toks)))
            lens.append(start + len(toks))
            q.append(len(toks))
        cfg, mw = self.runner.cfg, self.runner
        kwargs = {"q_lens": q}
        if device_ids is not None:
            every = torch.arange(len(ids))
            kwargs["prev_token_ids"] = (device_ids, every, every)
        step = validate_step(
            input_ids=torch.tensor(ids), position_ids=torch.tensor(pos), is_prefill=max(q) > 1,
            kv_cache=self.kv_cache, block_tables=self.bm.block_tables(seq_ids), slots=torch.cat(slots),
            input_lengths=torch.tensor(lens, dtype=torch.int32), max_seq_len=self.max_seq_len,
            lm_head_indices=torch.tensor(q).cumsum(0) - 1, kwargs=kwargs, num_layers=1,
            num_kv_heads=mw.shard.num_kv_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
            model_max_len=cfg.max_position_embeddings, dtype=mw.dtype, device=mw.device, loaded_adapters=())
        batch = ForwardBatch.build(
            input_ids=step.input_ids, input_ids_cpu=step.input_ids_cpu, positions=step.positions, slots=step.slots,
            is_prefill=step.is_prefill, block_size=step.block_size, q_lens_cpu=step.q_lens,
            seq_lens_cpu=step.input_lengths, block_tables_cpu=step.block_tables,
            lm_head_indices=step.lm_head_indices, spec_mask=None, atten_mask=None, device=mw.device,
            token_req_cpu=step.token_req, token_kv_index_cpu=step.token_kv_index, prev_token_ids=step.prev_token_ids)
        batch.extras[FEATURE] = feature
        logits, out = mw.forward(batch, self.kv_cache)
        return self.head.to_target(logits.topk(width, dim=-1).indices), out

    def _index(self, rows: list[int]) -> torch.Tensor:
        """Host row numbers -> an index on the head's device, copied without waiting for it."""
        return row_tensor(rows, self._pick.device, torch.int64)
