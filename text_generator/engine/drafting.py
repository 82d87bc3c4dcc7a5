"""The engine's side of a drafter (LLMEngine(..., speculative=...)): when a step drafts, and what
the drafter hears of its requests.

The engine asks drafts_this_step before a step (a drafting step reads a run-ahead step back
first); emit hands each drafting request's new tokens to update_drafter, which starts the
request in the drafter (with its context, and for EAGLE-3 the target's hidden states from
engine.hidden_feed) and updates it; a drafter that fails drops the request (stop_drafting),
which then decodes plainly. The speculative step itself is speculative/engine_step.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loguru import logger

from text_generator.engine.output import describe
from text_generator.engine.request import Request
from text_generator.engine.scheduler import ScheduledChunk

if TYPE_CHECKING:
    from text_generator.engine.engine import LLMEngine


def drafts_this_step(engine: "LLMEngine", chunks: list[ScheduledChunk]) -> bool:
    """Whether this step (decodes only, numbered num_steps) is a speculative one: a request
    that may draft wants drafts in it (draft_lengths: adaptive.py). It needs the
    requests' accepted tokens on the host before it can be built at all: the drafter
    proposes from them (n-gram lookup, a draft model's forward), and how many were accepted
    sets every later token's position, slot and kv length, which the host plans attention
    and allocates blocks with."""
    if engine.drafter is None or not engine._draft_reqs or not all(c.is_decode for c in chunks):
        return False
    return any(c.request.request_id in engine._draft_reqs
               and engine.draft_lengths.wanted(c.request.request_id, engine.num_steps) > 0 for c in chunks)


def stop_drafting(engine: "LLMEngine", request_ids, error: Exception) -> None:
    """The drafter failed on these requests: they decode without drafts from now on (a later
    token starts them afresh in the drafter)."""
    logger.warning("drafter failed on requests {}, which decode without drafts now: {}",
                   list(request_ids), describe(error))
    for rid in request_ids:
        engine._drafting.discard(rid)
        try:
            engine.drafter.finish(rid)
        except Exception:  # (a drafter that failed half-way may not know the request)
            pass


def update_drafter(engine: "LLMEngine", req: Request, new: list[int]) -> None:
    """Tell the drafter the request's new tokens (starting it first). A drafter that fails
    (e.g. its own KV pool is full) drops the request, which then decodes plainly; a later
    token starts it afresh."""
    rid, feed = req.request_id, engine.hidden_feed
    known = len(req.prompt_ids) + len(req.output_ids) - req.pending  # (run-ahead placeholders after them)
    try:
        if rid not in engine._drafting:
            engine._drafting.add(rid)
            context = req.prompt_ids + req.output_ids[:known - len(req.prompt_ids) - len(new)]
            rows = None if feed is None else feed.take(rid, len(context))
            if rows is None:
                engine.drafter.start(rid, context)
            else:  # the states of the context's last positions
                engine.drafter.start(rid, context, hidden=rows)
        rows = None if feed is None else feed.take(rid, known - 1)
        if rows is None:
            engine.drafter.update(rid, new)
        else:  # one row per new token: the positions before them
            engine.drafter.update(rid, new, hidden=rows)
    except Exception as e:
        stop_drafting(engine, [rid], e)
