"""Scheduler: which requests compute which tokens in the next step (continuous batching).

The engine calls `schedule()` once per step; it returns the step's chunks, each a request and
the span of its tokens to compute, with their KV slots from the block manager. Policy (one
token budget per step, `max_num_batched_tokens`):

    1. decodes of running requests, oldest first: 1 token each; when the block pool cannot hold
       a new token, the NEWEST running request is preempted (blocks freed, requeued at the
       front of the waiting queue with prompt + outputs, recomputed later: no request is lost)
    2. unfinished prompts of running requests (chunked prefill), oldest first
    3. new requests from the waiting queue, first come first served, while the pool has room
       for their prompt plus one token above the watermark (prefix-cache hits count as room),
       and there are fewer than max_num_seqs running; only the uncached part is computed

Chunks of all three kinds go into ONE forward step. A chunk needs logits only when it reaches
the end of its request's tokens (the next token is sampled from them).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from kv_manager import BlockManager, KVCacheError
from text_generator.engine.request import Request, RequestStatus


@dataclass
class ScheduledChunk:
    """request computes tokens [start, start + num_tokens) this step."""

    request: Request
    start: int
    num_tokens: int
    needs_sample: bool
    is_decode: bool


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk]
    slots: torch.Tensor  # int64 [sum of num_tokens]: the KV slots of every chunk's tokens, in chunk order
    preempted: list[Request]
    failed: list[tuple[Request, str]]  # requests that can never fit, with the reason


class Scheduler:
    """Owns the waiting queue and the running list; drives the block manager.

    Invariants: a request is in at most one of `waiting` / `running`; a running request is
    admitted in the block manager (seq_id = request_id), a waiting one is not; `running` is in
    admission order (the last one is the first preempted).
    """

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self.waiting.append(req)

    def remove(self, req: Request) -> None:
        """Take a request out of the queues and free its blocks (finish, abort, error)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if req.request_id in self.bm:
            self.bm.free(req.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[Request] = []
        failed: list[tuple[Request, str]] = []
        scheduled: set[int] = set()
        slots: list[torch.Tensor] = []  # per chunk, or one tensor for a run of decodes

        # 1. decodes (the token sampled last step is not yet in the block manager). The usual
        #    case, one append_many for all of them, is tried first; when the pool cannot give
        #    every one its block (all or nothing: nothing changed), request by request with
        #    preemption.
        ready = [r for r in self.running if r.num_tokens - r.num_computed == 1
                 and r.num_registered == r.num_tokens - 1 and not r.final_pending][:budget]
        if ready:
            try:
                slots.append(self.bm.append_many([r.request_id for r in ready], [r.output_ids[-1] for r in ready]))
            except KVCacheError:
                pass
            else:
                for r in ready:
                    r.num_registered += 1
                    chunks.append(ScheduledChunk(r, r.num_computed, 1, True, True))
                    scheduled.add(id(r))
                budget -= len(ready)
                ready = []
        i = 0
        while ready and i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.num_tokens - req.num_computed != 1 or req.num_registered != req.num_tokens - 1 or req.final_pending:
                i += 1
                continue
            while not self.bm.can_append(req.request_id, 1):
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:
                break  # req itself was the newest: everyone after it is gone too
            slots.append(self.bm.append(req.request_id, req.output_ids[-1:]))
            req.num_registered += 1
            chunks.append(ScheduledChunk(req, req.num_computed, 1, True, True))
            scheduled.add(id(req))
            budget -= 1
            i += 1

        # 2. prompt chunks of running requests
        for req in self.running:
            if budget == 0:
                break
            if id(req) in scheduled or req.num_registered != req.num_tokens:
                continue
            budget -= self._chunk(req, budget, chunks, slots)

        # 3. admissions (not in a step that had to preempt: the pool is full)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            req = self.waiting[0]
            tokens = req.tokens
            if not self.bm.can_admit(tokens, extra_key=req.cache_key, reserve_tokens=1):
                if self.running:
                    break  # wait for running requests to finish and free blocks
                # Nothing else holds blocks: admit without the watermark if it fits at all.
                try:
                    self._admit(req, tokens)
                except KVCacheError as e:
                    self.waiting.popleft()
                    failed.append((req, f"the KV cache ({self.bm.num_blocks} blocks of "
                                        f"{self.bm.block_size} tokens) cannot hold this request's "
                                        f"{len(tokens)} tokens: {e}"))
                    continue
            else:
                self._admit(req, tokens)
            budget -= self._chunk(req, budget, chunks, slots)
        flat = slots[0] if len(slots) == 1 else torch.cat(slots) if slots else torch.empty(0, dtype=torch.int64)
        return SchedulerOutput(chunks, flat, preempted, failed)

    def _admit(self, req: Request, tokens: list[int]) -> None:
        cached = self.bm.admit(req.request_id, tokens, extra_key=req.cache_key)
        self.waiting.popleft()
        req.num_computed, req.num_registered = cached, len(tokens)
        if req.num_cached_tokens is None:
            req.num_cached_tokens = cached
        req.status = RequestStatus.RUNNING
        self.running.append(req)

    def _chunk(self, req: Request, budget: int, chunks: list[ScheduledChunk], slots: list[torch.Tensor]) -> int:
        start = req.num_computed
        n = min(req.num_tokens - start, budget)
        slots.append(self.bm.slots(req.request_id, start, start + n))
        chunks.append(ScheduledChunk(req, start, n, start + n == req.num_tokens, False))
        return n

    def _preempt(self, req: Request) -> None:
        """Recompute policy: drop the K/V (committed full blocks stay in the prefix cache as
        evictable, so the recompute may hit them) and requeue at the front with its outputs."""
        self.running.remove(req)
        self.bm.free(req.request_id)
        req.num_computed = req.num_registered = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
