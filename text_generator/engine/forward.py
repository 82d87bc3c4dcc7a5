"""One forward of an LLMEngine step: a step's scheduled chunks -> forward_tensor's flat inputs -> logits.

The scheduler's chunks (scheduler.py) and their KV slots come in; the sampling rows of the
logits go out to the engine's Sampler, or to runahead.launch. Under run-ahead, a decode's last
token may still be on the device (runahead.InFlight): its row reads it there (prev_token_ids).
For a hidden-state drafter (EAGLE-3) the forward also returns every token's target states of
the drafting requests, which go to engine.hidden_feed (speculative/hidden_feed.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from text_generator.engine.runahead import InFlight
from text_generator.engine.scheduler import ScheduledChunk
from text_generator.sampling import row_tensor

if TYPE_CHECKING:
    from text_generator.engine.engine import LLMEngine


def forward_chunks(engine: "LLMEngine", chunks: list[ScheduledChunk], slots: torch.Tensor,
                   prev: InFlight | None = None) -> torch.Tensor:
    """One forward_tensor call over every chunk: flat tensors built with list concatenation
    and vectorised index arithmetic (no per-token Python).

        chunk r:      tokens [start_r, start_r + q_r) of its request
        input_ids:    [ chunk 0 tokens | chunk 1 tokens | ... ]        T = sum(q)
        offset_r    = q_0 + ... + q_{r-1};   position of token t = start_r + t - offset_r
        lm_head:      offset_r + q_r - 1 for chunks that sample
    """
    reqs = [c.request for c in chunks]
    ids: list[int] = []
    dev_rows: list[int] = []  # rows whose id is a placeholder for prev's token on the device
    dev_index: list[int] = []
    for c in chunks:
        if c.is_decode:
            req = c.request
            if req.pending and prev is not None and id(req) in prev.rows:
                dev_rows.append(len(ids))
                dev_index.append(prev.rows[id(req)])
            ids.append(req.output_ids[-1])
        else:
            ids += c.request.token_span(c.start, c.start + c.num_tokens)
    q = torch.tensor([c.num_tokens for c in chunks], dtype=torch.int64)
    start = torch.tensor([c.start for c in chunks], dtype=torch.int64)
    offset = torch.cumsum(q, 0) - q
    T = len(ids)
    positions = torch.arange(T) + torch.repeat_interleave(start - offset, q, output_size=T)
    sample = torch.tensor([c.needs_sample for c in chunks])
    adapters = [r.adapter for r in reqs]
    kwargs = {"q_lens": q}
    if any(a is not None for a in adapters):
        kwargs["adapter_ids"] = adapters
    if dev_rows:
        kwargs["prev_token_ids"] = (prev.token_ids, torch.tensor(dev_rows), torch.tensor(dev_index))
    lm_head = (offset + q - 1)[sample]
    feed = engine.hidden_feed is not None and any(r.request_id in engine._draft_reqs for r in reqs)
    if feed:  # every token's states for the drafter: all rows (logits too, by the contract)
        kwargs.update(engine.hidden_feed.forward_kwargs())
    out = engine.generator.forward_tensor(
        torch.tensor(ids, dtype=torch.int64), positions,
        not all(c.is_decode for c in chunks), engine.kv_cache,
        engine.block_manager.block_tables([r.request_id for r in reqs]),
        slots, (start + q).to(torch.int32), engine.max_seq_len,
        None if feed else lm_head, **kwargs)
    if not feed:
        return out
    logits, hidden = out
    for c, o in zip(chunks, offset.tolist()):
        rid = c.request.request_id
        if rid not in engine._draft_reqs:
            continue
        if not c.is_decode and rid in engine._drafting:  # computed again (preempted): start afresh
            engine._drafting.discard(rid)
            engine.drafter.finish(rid)
        engine.hidden_feed.add(rid, c.start, hidden[o:o + c.num_tokens])
    if lm_head.numel() == T:  # every row samples (a decode-only step): nothing to pick
        return logits
    # the sampling rows, copied without a stream synchronize (a blocking copy would make the
    # host wait for this forward, and the next step would no longer run ahead of it)
    return logits.index_select(0, row_tensor(lm_head.tolist(), logits.device, torch.int64))
