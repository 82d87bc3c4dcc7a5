"""Running ahead (LLMEngine's async scheduling): launch a step, read its tokens back a step later.

    step k:    forward -> launch(): sample on the device, start the copy to pinned host memory,
               a PLACEHOLDER in each sampled request's output_ids            -> InFlight
    step k+1:  schedule + forward (the placeholders' real ids come from InFlight.token_ids on
               the device, forward_tensor's prev_token_ids), then complete(): wait for the copy,
               replace the placeholders, stop checks and outputs, commit step k's K/V

So the host's scheduling, validation and attention planning overlap the device's previous
step. The engine decides when this is allowed (LLMEngine._may_run_ahead); these functions only
move a step's tokens between the device, the requests and the block manager.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from text_generator.engine.output import record_logprobs
from text_generator.engine.request import Request, RequestOutput
from text_generator.engine.scheduler import ScheduledChunk

if TYPE_CHECKING:
    from text_generator.engine.engine import LLMEngine

PLACEHOLDER = 0  # the id standing in input_ids / output_ids for a token still on the device


@dataclass
class InFlight:
    """A launched step whose sampled tokens are still on the device (async scheduling)."""

    reqs: list[Request]  # sampled requests, in the sampler's row order
    rows: dict[int, int]  # id(request) -> its row in token_ids
    preemptions: list[int]  # each one's num_preemptions at launch (a preempted one is not patched)
    commits: list[tuple[Request, int, int]]  # (request, num_computed, num_preemptions) to commit
    token_ids: torch.Tensor | None  # [S] on the device
    host: dict[str, torch.Tensor]  # the sampler's outputs, copying to (pinned) host memory
    event: object  # CUDA event after the copies (None on the CPU)


def launch(engine: "LLMEngine", logits: torch.Tensor, chunks: list[ScheduledChunk], sampled: list[Request]
           ) -> InFlight:
    """Sample on the device, start the copy of the results to the host, and stand a
    placeholder for each new token in its request (the scheduler sees the request one token
    longer; the next forward takes the real id from the device)."""
    out = engine.sampler(logits, [r.params for r in sampled], generators=[r.generator for r in sampled]) \
        if sampled else None
    host, event = {}, None
    if out is not None:
        for name in ("token_ids", "logprobs", "top_token_ids", "top_logprobs"):
            t = getattr(out, name)
            if t is None:
                continue
            if t.device.type == "cuda":
                h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                h.copy_(t, non_blocking=True)
                t = h
            host[name] = t
        if out.token_ids.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
    rows = {}
    for i, req in enumerate(sampled):
        req.output_ids.append(PLACEHOLDER)
        req.pending += 1
        rows[id(req)] = i
        n_out = len(req.output_ids)
        if n_out >= req.params.max_new_tokens or len(req.prompt_ids) + n_out >= engine.max_seq_len:
            req.final_pending = True
    commits = [(c.request, c.request.num_computed, c.request.num_preemptions) for c in chunks]
    return InFlight(sampled, rows, [r.num_preemptions for r in sampled], commits,
                    None if out is None else out.token_ids, host, event)


def complete(engine: "LLMEngine", step: InFlight) -> list[RequestOutput]:
    """Read a launched step's tokens back: replace its placeholders, check stops, report;
    then commit its chunks' K/V (their input tokens are all real by now)."""
    outputs = []
    bm = engine.block_manager
    if step.reqs:
        if step.event is not None:
            t = time.perf_counter()
            step.event.synchronize()  # the host waits for the device here (or the device for the host: 0)
            engine.device_wait_s += time.perf_counter() - t
        tokens = step.host["token_ids"].tolist()
        lps = step.host["logprobs"].tolist() if "logprobs" in step.host else None
        top_ids = step.host["top_token_ids"].tolist() if "top_token_ids" in step.host else None
        top_lps = step.host["top_logprobs"].tolist() if "top_logprobs" in step.host else None
        for i, (req, tok) in enumerate(zip(step.reqs, tokens)):
            if req.finished:
                continue  # finished (stop, abort) on an earlier token: this row ran ahead of it
            at = len(req.output_ids) - req.pending
            req.output_ids[at] = tok
            req.pending -= 1
            pos = len(req.prompt_ids) + at
            if req.num_preemptions == step.preemptions[i] and req.request_id in bm \
                    and bm.num_computed_tokens(req.request_id) <= pos < bm.num_tokens(req.request_id):
                bm.set_token(req.request_id, pos, tok)  # the next step appended the placeholder
            if req.params.logprobs is not None:
                record_logprobs(req, i, lps, top_ids, top_lps)
            outputs.append(engine.emit(req, [tok], at=at))
    live = [(r, n) for r, n, p in step.commits if not r.finished and r.num_preemptions == p]
    bm.commit_many([r.request_id for r, _ in live], [n for _, n in live])
    return outputs
