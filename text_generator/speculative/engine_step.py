"""Speculative decode steps inside LLMEngine, built on the speculative package's pieces.

When an engine has a drafter (`LLMEngine(..., speculative=NgramDrafter())`) and a step holds
only decodes, the engine runs this step instead of a plain one:

    eligible requests (greedy, no penalties, no logprobs; structured ones too, verified under
        their grammar): drafter.propose -> DraftTree
        (root = the request's last token), pruned to the token budget, max_seq_len and the
        tokens still wanted; drafts appended to the block manager only where blocks are free
    other requests: a lone-root tree (a plain decode)
    ONE forward_tensor (q_lens = tree sizes, spec_mask = tree masks)
    drafted requests: verify_greedy -> K/V of the accepted path compacted (compact_accepted_kv),
        only verified tokens committed; the target's own bonus token is left unregistered, as
        after any engine step (the next step's decode appends it, preempting if it must)
    lone roots: the engine's Sampler on their row

Output is exactly plain greedy decoding (the verifier's guarantee); sampled requests never draft
here, so their outputs and seeds are untouched. Steps with prefill chunks run plainly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from text_generator.engine.request import RequestOutput
from text_generator.engine.scheduler import ScheduledChunk
from text_generator.sampling import SamplingParams
from text_generator.speculative.decoder import compact_accepted_kv
from text_generator.speculative.tree import DraftTree, build_tree_batch
from text_generator.speculative.verify import verify_greedy, verify_greedy_grammar

if TYPE_CHECKING:
    from text_generator.engine import LLMEngine

MAX_TREE_NODES = 16  # per request and step, the root included


def can_draft(p: SamplingParams) -> bool:
    """Greedy verification reproduces argmax of the raw logits (masked by the request's grammar
    for structured output): penalties would change the target, and logprobs are not computed
    for accepted drafts."""
    return p.greedy and not p.has_penalties and p.logprobs is None


def speculative_step(engine: "LLMEngine", chunks: list[ScheduledChunk]) -> list[RequestOutput] | None:
    """Run a decode-only step as draft trees; None (nothing done) when no request drafts."""
    bm, drafter = engine.block_manager, engine.drafter
    room = engine.scheduler.max_num_batched_tokens - len(chunks)  # tokens left for drafts
    budgets = {}
    for c in chunks:
        r = c.request
        if room > 0 and can_draft(r.params) and engine.is_drafting(r.request_id):
            budgets[r.request_id] = min(MAX_TREE_NODES, engine.max_seq_len - c.start,
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
            if t.tokens[0] != r.output_ids[-1] or t.size == 1 or not bm.can_append(r.request_id, t.size - 1):
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
    batch = build_tree_batch(trees, cached, [bm.slots(r.request_id, s, s + t.size) for r, s, t in zip(reqs, cached, trees)],
                             bm.block_tables([r.request_id for r in reqs]))
    kwargs = {"q_lens": batch.q_lens}
    if batch.spec_mask is not None:
        kwargs["spec_mask"] = batch.spec_mask
    if any(r.adapter is not None for r in reqs):
        kwargs["adapter_ids"] = [r.adapter for r in reqs]
    logits = engine.generator.forward_tensor(
        batch.input_ids, batch.position_ids, False, engine.kv_cache, batch.block_tables, batch.slots,
        batch.input_lengths, engine.max_seq_len, None, **kwargs)
    outputs, plain = [], []
    off = batch.offsets
    for b, (r, s, t) in enumerate(zip(reqs, cached, trees)):
        if t.size == 1:
            bm.commit(r.request_id, s + 1)
            r.num_computed = s + 1
            plain.append(b)
            continue
        rows = logits[off[b]:off[b + 1]]
        v = verify_greedy(t, rows) if r.grammar is None else verify_greedy_grammar(t, rows, r.grammar)
        # speculative.commit_accepted without its final append of the bonus token, which may
        # need a block the pool no longer has; the engine registers it at the next step
        src = batch.slots[off[b]:off[b + 1]][v.path]
        bm.truncate(r.request_id, s)
        dst = bm.append(r.request_id, [t.tokens[i] for i in v.path])
        compact_accepted_kv(engine.kv_cache, src, dst)
        bm.commit(r.request_id, s + len(v.path))
        r.num_computed = r.num_registered = s + len(v.path)
        engine.num_draft_tokens += t.size - 1
        engine.num_accepted_tokens += len(v.path) - 1
        outputs.append(engine.emit(r, v.tokens))
    outputs += engine.sample(logits[[off[b] for b in plain]], [reqs[b] for b in plain])
    return outputs
