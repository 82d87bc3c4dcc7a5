"""EngineLoop: an LLMEngine stepping in a background thread, fed by the HTTP side's event loop.

    HTTP handlers (asyncio)                         engine thread
    submit() --("add", ...)--> commands queue ----> drain: add_request / abort / call(fn)
    RequestGroup.next() <-- asyncio.Queue <-------- step(): outputs routed by request id
                             (loop.call_soon_threadsafe)

Only the engine thread touches the LLMEngine (its requests, block manager, adapters), so the
engine needs no locks; the HTTP side never waits on a step. One RequestGroup holds the engine
requests of one HTTP request (n choices x prompts) and one queue for all their outputs.
Aborting a group (client gone) takes its unfinished requests out of the engine at the next
drain, which frees their blocks at once.

Requests of a group with the same prompt (the n choices of one prompt) share its KV blocks
through the prefix cache: the first one (the leader) enters the engine at once, the others
when the leader's first output arrives, by which time its prompt blocks are committed to the
cache (requests admitted in the same step would each compute the prompt).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import threading
import time
from typing import Callable

from loguru import logger

from text_generator.engine import LLMEngine, RequestOutput
from text_generator.errors import ErrorCode
from text_generator.sampling import SamplingParams
from text_generator.serve.errors import APIError
from text_generator.serve.metrics import ServerMetrics

ENGINE_FAILURE = "engine step failed"  # how the error of a request failed by a crashed step starts


class RequestGroup:
    """The engine requests of one HTTP request; `next()` returns their outputs in arrival order.

    request_ids[i] is choice i's engine request; arrival: time.perf_counter() at submission."""

    def __init__(self, owner: "EngineLoop", request_ids: list[str]):
        self.owner = owner
        self.request_ids = request_ids
        self.index = {rid: i for i, rid in enumerate(request_ids)}
        self.queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()
        self.arrival = time.perf_counter()
        self.unfinished = set(request_ids)

    @property
    def done(self) -> bool:
        return not self.unfinished

    async def next(self) -> RequestOutput:
        out = await self.queue.get()
        if out.finished:
            self.unfinished.discard(out.request_id)
        return out

    def abort(self) -> None:
        """Take the unfinished requests out of the engine (idempotent; nothing to do when done)."""
        for rid in list(self.unfinished):
            self.owner._put(("abort", rid))
        self.unfinished.clear()

    def deliver(self, out: RequestOutput) -> None:
        """Called from the engine thread."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, out)
        except RuntimeError:  # the event loop is closed (server shutting down)
            pass


class EngineLoop:
    """Owns the engine thread. max_queue: requests that may wait beyond the engine's
    max_num_seqs running ones; a submission past that is refused (503, TG_QUEUE_FULL)."""

    def __init__(self, engine: LLMEngine, *, max_queue: int = 256, metrics: ServerMetrics | None = None):
        self.engine = engine
        self.metrics = metrics
        self.capacity = engine.scheduler.max_num_seqs + max_queue
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._groups: dict[str, RequestGroup] = {}  # engine thread only
        self._followers: dict[str, list[tuple]] = {}  # leader id -> "add" commands waiting for it
        self._live = 0  # submitted and not yet finished; guarded by _lock
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._stop = False
        self.error: BaseException | None = None  # what killed the thread, if anything did
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # -- the HTTP side ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop

    def submit(self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None) -> RequestGroup:
        """One engine request per (prompt, params) pair; all run under `adapter` (None: base).
        Raises APIError 503 when the queue is full or the engine thread is gone."""
        if not self.alive:
            raise APIError(503, ErrorCode.ENGINE_FAILED, f"the engine is not running ({self.error!r})")
        with self._lock:
            if self._live + len(prompts) > self.capacity:
                raise APIError(503, ErrorCode.QUEUE_FULL,
                               f"server overloaded: {self._live} requests live, at most {self.capacity} "
                               f"(max_num_seqs + max_queue); retry later")
            self._live += len(prompts)
        base = f"srv-{next(self._ids)}"
        rids = [f"{base}-{i}" for i in range(len(prompts))]
        group = RequestGroup(self, rids)
        share = self.engine.block_manager.enable_prefix_caching
        leaders: dict[tuple[int, ...], str] = {}
        for rid, ids, p in zip(rids, prompts, params):
            leader = leaders.setdefault(tuple(ids), rid) if share else rid
            self._put(("add", rid, ids, p, adapter, group, None if leader == rid else leader))
        return group

    async def call(self, fn: Callable[[LLMEngine], object]):
        """Run fn(engine) in the engine thread between steps (adapter loading); returns its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._put(("call", fn, fut))
        return await asyncio.wrap_future(fut)

    def _put(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    # -- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop:
                self._wake.clear()
                self._drain()
                if not self.engine.has_unfinished():
                    self._wake.wait(timeout=1.0)
                    continue
                try:
                    outputs = self.engine.step()
                except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                    logger.exception("engine step failed")
                    self._fail_all(f"{ENGINE_FAILURE}: {type(e).__name__}: {e}")
                    continue
                self._route(outputs)
                if self.metrics is not None:
                    self.metrics.on_step(self.engine, self._commands.qsize())
        except BaseException as e:  # noqa: BLE001 - recorded for /health, then the thread ends
            self.error = e
            logger.exception("engine loop died")
            raise

    def _drain(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            kind = cmd[0]
            if kind == "add":
                rid, leader, group = cmd[1], cmd[6], cmd[5]
                self._groups[rid] = group
                if leader in self._followers:
                    self._followers[leader].append(cmd)
                    continue
                self._followers[rid] = []
                self._add(cmd)
            elif kind == "abort":
                if self._abort(cmd[1]) and self.metrics is not None:
                    self.metrics.requests.labels(finish_reason="abort").inc()
            else:
                _, fn, fut = cmd
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(self.engine))
                    except Exception as e:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(e)

    def _add(self, cmd: tuple) -> None:
        _, rid, ids, params, adapter, _group, _leader = cmd
        self.engine.add_request(ids, params, adapter=adapter, request_id=rid)

    def _release_followers(self, leader: str) -> None:
        """The leader's prompt is in the prefix cache (or it is gone): its followers enter now."""
        for cmd in self._followers.pop(leader, ()):
            self._add(cmd)

    def _abort(self, rid: str) -> bool:
        """Take rid out (its blocks are free at once; its report is dropped). False: not live."""
        for followers in self._followers.values():
            waiting = [c for c in followers if c[1] == rid]
            if waiting:
                followers.remove(waiting[0])
                self._forget(rid)
                return True
        self._release_followers(rid)
        if not self.engine.abort(rid):
            return False
        self._forget(rid)
        return True

    def _forget(self, rid: str) -> None:
        if self._groups.pop(rid, None) is not None:
            with self._lock:
                self._live -= 1

    def _route(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._release_followers(out.request_id)
            group = self._groups.get(out.request_id)
            if group is None:
                continue  # aborted by its client: nobody is listening
            if out.finished:
                self._forget(out.request_id)
                if self.metrics is not None:
                    self.metrics.on_finished(out, group.arrival)
            group.deliver(out)

    def _fail_all(self, message: str) -> None:
        self._followers.clear()
        for rid in list(self._groups):
            group = self._groups[rid]
            self.engine.abort(rid)
            self._forget(rid)
            group.deliver(RequestOutput(request_id=rid, prompt_token_ids=[], new_token_ids=[], token_ids=[],
                                        finished=True, finish_reason="error", error=message))
