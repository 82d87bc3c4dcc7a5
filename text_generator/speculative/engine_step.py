"""Speculative decode steps inside LLMEngine, built on the speculative package's pieces.

When an engine has a drafter (`LLMEngine(..., speculative=NgramDrafter())`) and a step holds
only decodes, the engine runs this step instead of a plain one:

    eligible requests (greedy, no logprobs; penalties too; structured ones too, verified under
        their grammar) that want drafts this step (engine.draft_lengths: adaptive.py) with
        their draft length as budget: drafter.propose -> DraftTree
        (root = the request's last token), pruned to the token budget, max_seq_len and the
        tokens still wanted; drafts appended to the block manager only where blocks are free
    other requests: a lone-root tree (a plain decode)
    ONE forward_tensor (q_lens = tree sizes, spec_mask = tree masks)
    on the device, for the whole batch at once: each node's greedy target (penalties applied
        with the drafts on its path in the history: verify.tree_targets), the accepted path
        (verify.accept_greedy) and the Sampler's tokens for the lone roots
    ONE host sync: the accepted nodes, bonus tokens and sampled tokens in one tensor
    (structured requests walk their grammar on the host: verify_greedy_grammar)
    K/V of every accepted path compacted in one gather / scatter (compact_accepted_kv), only
        verified tokens committed; the target's own bonus token is left unregistered, as after
        any engine step (the next step's decode appends it, preempting if it must)

Output is exactly plain greedy decoding, penalties included (the verifier's guarantee); sampled
requests never draft here, so their outputs and seeds are untouched. Steps with prefill chunks
run plainly, and so do steps in which no request wants drafts (the engine runs those ahead).
Each drafting request's outcome (deepest draft, drafts accepted; a request the drafter gave
nothing counts as nothing accepted) goes to engine.draft_lengths.record.

Host work is per request, not per token: the batch tensors are built from flat lists
(tree.build_tree_batch), slots come from the block tables in one op, and the per-request Python
left is the block manager's bookkeeping and the emission of the accepted tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from text_generator.engine.request import Request, RequestOutput
from text_generator.engine.scheduler import ScheduledChunk
from text_generator.sampling import SamplingParams, row_tensor
from text_generator.speculative.decoder import compact_accepted_kv
from text_generator.speculative.tree import DraftTree, TreeBatch, build_tree_batch
from text_generator.speculative.verify import Verdict, accept_greedy, tree_targets, verify_greedy_grammar

if TYPE_CHECKING:
    from text_generator.engine import LLMEngine

MAX_TREE_NODES = 16  # per request and step, the root included


def can_draft(p: SamplingParams) -> bool:
    """Greedy verification reproduces argmax of the logits after the request's penalties
    (tree_targets) or masked by its grammar (verify_greedy_grammar), not both at once; logprobs
    are not computed for accepted drafts."""
    return p.greedy and p.logprobs is None and not (p.has_penalties and p.structured is not None)


def tree_slots(block_manager, seq_ids: list, cached: list[int], sizes: list[int]) -> torch.Tensor:
    """Slots of kv indices cached[b] .. cached[b] + sizes[b] - 1 of every request, [sum(sizes)]
    int64, from the block tables as plain ints (one tensor for the batch, none per request)."""
    bs, out = block_manager.block_size, []
    for s, c, n in zip(seq_ids, cached, sizes):
        table = block_manager.block_table(s)
        out += [table[k // bs] * bs + k % bs for k in range(c, c + n)]
    return torch.tensor(out, dtype=torch.int64)


def speculative_step(engine: "LLMEngine", chunks: list[ScheduledChunk]) -> list[RequestOutput] | None:
    """Run a decode-only step as draft trees; None (nothing done) when no request drafts."""
    bm, drafter, lengths, step = engine.block_manager, engine.drafter, engine.draft_lengths, engine.num_steps
    room = engine.scheduler.max_num_batched_tokens - len(chunks)  # tokens left for drafts
    budgets = {}
    for c in chunks:
        r = c.request
        want = lengths.wanted(r.request_id, step)
        if room > 0 and want > 0 and can_draft(r.params) and engine.is_drafting(r.request_id):
            budgets[r.request_id] = min(want + 1, MAX_TREE_NODES, engine.max_seq_len - c.start,
                                        r.params.max_new_tokens - len(r.output_ids), room + 1)
    ids = [rid for rid, b in budgets.items() if b > 1]
    if not ids:
        return None
    try:
        proposed = dict(zip(ids, drafter.propose(ids, [budgets[i] for i in ids])))
    except Exception as e:  # a failing drafter costs its speedup, never the step
        engine.stop_drafting(ids, e)
        return None
    trees = []
    for c in chunks:
        r = c.request
        t = proposed.get(r.request_id)
        if t is not None:
            t = t.pruned(min(budgets[r.request_id], room + 1), r.params.max_new_tokens - len(r.output_ids) - 1)
            if t.tokens[0] != r.output_ids[-1] or t.size == 1:
                lengths.record(r.request_id, step, 0, 0)  # the drafter had nothing
                t = None
            elif not bm.can_append(r.request_id, t.size - 1):
                t = None
        if t is None:
            t = DraftTree([r.output_ids[-1]], [-1])
        else:
            bm.append(r.request_id, t.tokens[1:])
            room -= t.size - 1
        trees.append(t)
    if all(t.size == 1 for t in trees):
        return None
    reqs = [c.request for c in chunks]
    cached = [c.start for c in chunks]
    rids = [r.request_id for r in reqs]
    batch = build_tree_batch(trees, cached, tree_slots(bm, rids, cached, [t.size for t in trees]),
                             bm.block_tables(rids))
    kwargs = {"q_lens": batch.q_lens}
    if batch.spec_mask is not None:
        kwargs["spec_mask"] = batch.spec_mask
    if any(r.adapter is not None for r in reqs):
        kwargs["adapter_ids"] = [r.adapter for r in reqs]
    feed = engine.hidden_feed
    if feed is not None:
        kwargs.update(feed.forward_kwargs())
    out = engine.generator.forward_tensor(
        batch.input_ids, batch.position_ids, False, engine.kv_cache, batch.block_tables, batch.slots,
        batch.input_lengths, engine.max_seq_len, None, **kwargs)
    logits, hidden = out if feed is not None else (out, None)
    return _verify_and_commit(engine, reqs, cached, trees, batch, logits, hidden)


def _verify_and_commit(engine: "LLMEngine", reqs: list[Request], cached: list[int], trees: list[DraftTree],
                       batch: TreeBatch, logits: torch.Tensor, hidden: torch.Tensor | None = None
                       ) -> list[RequestOutput]:
    """Verify every drafted tree, compact and commit the accepted K/V, sample the lone roots,
    emit: -> the step's outputs. The device -> host traffic is one tensor (plus the grammar
    walks of structured requests and the logprobs of lone roots that asked for them).
    hidden [T, n, H]: the target's states of every node (a drafter that reads them): those of
    each drafting request's accepted path, or its lone root, go to engine.hidden_feed."""
    bm, off = engine.block_manager, batch.offsets
    plain = [b for b, t in enumerate(trees) if t.size == 1]
    drafted = [b for b, t in enumerate(trees) if t.size > 1 and reqs[b].grammar is None]
    walked = [b for b, t in enumerate(trees) if t.size > 1 and reqs[b].grammar is not None]
    target = None
    if drafted:
        target = tree_targets(logits, batch, [r.params for r in reqs], [r.prompt_ids for r in reqs],
                              [r.output_ids for r in reqs])
    plain_reqs = [reqs[b] for b in plain]
    sampled = engine.sample_on_device(logits.index_select(0, row_tensor([off[b] for b in plain], logits.device,
                                                                       torch.int64)), plain_reqs) if plain else None
    parts = [t for t in (target, None if sampled is None else sampled.token_ids) if t is not None]
    host = torch.cat(parts).tolist() if parts else []  # the step's one device -> host sync
    verdicts: dict[int, Verdict] = {b: accept_greedy(trees[b], host[off[b]:off[b + 1]]) for b in drafted}
    for b in walked:
        verdicts[b] = verify_greedy_grammar(trees[b], logits[off[b]:off[b + 1]], reqs[b].grammar)
    # An accepted path that is a prefix of the node list (any accepted chain) is in place: drop
    # the nodes after it. Any other is truncated away and appended again for every request
    # first, then all their K/V moves in one gather / scatter (compact_accepted_kv reads every
    # source before writing, so a block one request frees and another takes is safe).
    src, dst = [], []
    for b, v in verdicts.items():
        r = reqs[b]
        if v.path[-1] == len(v.path) - 1:
            bm.truncate(r.request_id, cached[b] + len(v.path))
            continue
        src += [off[b] + i for i in v.path]
        bm.truncate(r.request_id, cached[b])
        dst.append(bm.append(r.request_id, [trees[b].tokens[i] for i in v.path]))
    if dst:
        compact_accepted_kv(engine.kv_cache, batch.slots[torch.tensor(src)], torch.cat(dst))
    for b in plain:
        bm.commit(reqs[b].request_id, cached[b] + 1)
        reqs[b].num_computed = cached[b] + 1
    fed = [] if hidden is None else [b for b, r in enumerate(reqs) if r.request_id in engine._draft_reqs]
    if fed:  # one gather for the batch, each request's rows a view of it
        paths = [verdicts[b].path if b in verdicts else [0] for b in fed]
        picked = hidden.index_select(0, row_tensor([off[b] + i for b, p in zip(fed, paths) for i in p],
                                                   hidden.device, torch.int64))
        for b, part in zip(fed, picked.split([len(p) for p in paths])):
            engine.hidden_feed.add(reqs[b].request_id, cached[b], part)
    outputs = []
    for b, v in verdicts.items():
        r, t = reqs[b], trees[b]
        bm.commit(r.request_id, cached[b] + len(v.path))
        r.num_computed = r.num_registered = cached[b] + len(v.path)
        engine.num_draft_tokens += t.size - 1
        engine.num_accepted_tokens += len(v.path) - 1
        engine.draft_lengths.record(r.request_id, engine.num_steps, max(t.depths()), len(v.path) - 1)
        outputs.append(engine.emit(r, v.tokens))
    if plain:
        outputs += engine.emit_sampled(plain_reqs, sampled, host[len(host) - len(plain):])
    return outputs
