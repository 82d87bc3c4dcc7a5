"""EngineClient: the HTTP process's handle on the engine process (engine_worker.py).

    asyncio handlers                  EngineClient                         engine process
    submit() / RequestGroup.abort() -> cmd pipe (one message per group) -> steps continuously
    RequestGroup.take() <- its deque    <- dispatch <- the event loop reads <- out pipe

The engine and the HTTP side no longer share a GIL: JSON, SSE, pydantic and uvicorn's work run
here while the engine process steps. The event loop itself watches the out pipe (add_reader) and
reads every step's batch there: no reader thread, so no handing the GIL back and forth between
it and the loop (each hand-over waits up to sys.getswitchinterval(), 5 ms, while the loop is busy:
a busy loop fell behind a step of 9 ms and the full pipe then blocked the engine's send).
dispatch turns every request's news into a RequestOutput as a "delta" engine makes them (a running
request's: this step's token ids, the engine's delta_text, new logprob rows; its final one: the
whole output, rebuilt from the deltas), records the metrics and feeds the request's group. /metrics
gauges come from the Stats sent with each batch. Both pipes are grown to
/proc/sys/fs/pipe-max-size (1 MiB by default; Linux): a burst of submissions (512 prompts of 256
tokens are ~700 KB) does not block the loop in write() until the engine drains the pipe between
two steps, and the engine's send does not wait for a busy loop.

If the engine process dies, the loop sees the pipe close: every live request ends with an
ENGINE_DEAD error (503), new submissions get 503 and `alive` turns False (/health answers 503).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import multiprocessing
import threading
import time
from typing import Callable

from loguru import logger

from text_generator.engine import RequestOutput
from text_generator.errors import ErrorCode
from text_generator.sampling import SamplingParams
from text_generator.serve.engine_worker import Stats
from text_generator.serve.errors import APIError
from text_generator.serve.metrics import ServerMetrics
from text_generator.serve.profiling import out_trace

ENGINE_DEAD = "the engine process died"  # how the error of a request cut off by a dead engine starts


class RequestGroup:
    """The engine requests of one HTTP request; `next()` / `take()` return their outputs in arrival order.

    request_ids[i] is choice i's engine request; arrival: time.perf_counter() at submission.
    The outputs wait in a deque, and the one task that reads them waits on a future that `put` resolves:
    an asyncio.Queue's get / put_nowait / get_nowait layers cost a streamed token more than the chunk's
    own JSON (TG_SERVE_PROFILE_CLOCK=cpu). One reader per group (its handler's task)."""

    def __init__(self, owner: "EngineClient", request_ids: list[str]):
        self.owner = owner
        self.request_ids = request_ids
        self.index = {rid: i for i, rid in enumerate(request_ids)}
        self.arrival = time.perf_counter()
        self.t_put = float("nan")  # when the HTTP process last read one of its outputs (TG_SERVE_TRACE)
        self.unfinished = set(request_ids)
        self._outs: collections.deque[RequestOutput] = collections.deque()
        self._waiter: asyncio.Future | None = None

    @property
    def done(self) -> bool:
        return not self.unfinished

    def put(self, out: RequestOutput) -> None:
        """Queue one output of one of its requests and wake the reader (event loop only)."""
        self._outs.append(out)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # (a cancelled wait)
                waiter.set_result(None)

    async def _wait(self) -> None:
        while not self._outs:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    async def next(self) -> RequestOutput:
        if not self._outs:
            await self._wait()
        out = self._outs.popleft()
        if out.finished:
            self.unfinished.discard(out.request_id)
        return out

    async def take(self) -> list[RequestOutput]:
        """Every output queued now (waits for one if there is none): what a stream sends at once,
        so that a stream that fell behind its engine requests catches up in one chunk per choice."""
        if not self._outs:
            await self._wait()
        outs = list(self._outs)
        self._outs.clear()
        for out in outs:
            if out.finished:
                self.unfinished.discard(out.request_id)
        return outs

    def abort(self) -> None:
        """Take the unfinished requests out of the engine (idempotent; nothing to do when done)."""
        for rid in sorted(self.unfinished):
            self.owner._send(("abort", rid))
        self.unfinished.clear()


class _Live:
    """What the HTTP side keeps of one engine request: its group and its output so far."""

    __slots__ = ("group", "tokens", "pieces", "logprobs", "top", "last")

    def __init__(self, group: RequestGroup):
        self.group = group
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self.logprobs: list[float] | None = None
        self.top: list[dict] | None = None
        self.last: float | None = None  # when its last token came


class EngineClient:
    """Starts and talks to the engine process. max_queue: requests that may wait beyond the
    engine's max_num_seqs running ones; a submission past that is refused (503, TG_QUEUE_FULL).
    on_start(engine): a picklable function run in the engine process once its engine is built."""

    def __init__(self, args, *, max_queue: int = 256, metrics: ServerMetrics | None = None,
                 on_start: Callable | None = None):
        self.args = args
        self.metrics = metrics
        self.capacity = args.max_num_seqs + max_queue
        self.on_start = on_start
        self.info: dict = {}
        self.error: str | None = None  # why the engine process is gone, once it is
        self._live: dict[str, _Live] = {}  # event-loop thread only
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.process = None
        self.trace = out_trace()  # TG_SERVE_TRACE's FILE.out, or None

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> dict:
        """Spawn the engine process and wait until its engine is built -> its info (vocab_size,
        max_model_len, num_blocks, pid). Raises RuntimeError with the engine's error if it fails."""
        import torch

        from text_generator.serve import engine_worker

        ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA or threads
        cmd_recv, self._cmd = ctx.Pipe(duplex=False)
        self._out, out_send = ctx.Pipe(duplex=False)
        grow_pipe(self._cmd.fileno())
        grow_pipe(self._out.fileno())
        self.process = ctx.Process(target=engine_worker.main, name="text-generator-engine", daemon=True,
                                   args=(self.args, cmd_recv, out_send, torch.get_num_threads(), self.on_start))
        self.process.start()
        cmd_recv.close()  # the child's ends: closing ours lets each side see the other's death as EOF
        out_send.close()
        try:
            kind, payload = self._out.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise RuntimeError(f"the engine process exited while starting (exit code {self.process.exitcode})") from None
        if kind != "ready":
            self.process.join(30)
            raise RuntimeError(f"the engine could not start: {payload}")
        self.info = payload
        return payload

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop that serves the requests, from that loop: it reads the engine's
        messages (outputs, call replies) from now on."""
        self._loop = loop
        loop.add_reader(self._out.fileno(), self._on_readable)

    def stop(self) -> None:
        if self.process is None or self._stopping:
            return
        self._stopping = True
        self._unwatch()
        try:
            self._send(("stop",))
        except (OSError, ValueError):
            pass
        # read (and drop) what the engine still sends until it exits: a full pipe must not hold it
        deadline = time.monotonic() + 30
        while self.process.is_alive() and time.monotonic() < deadline:
            try:
                if self._out.poll(0.05):
                    self._out.recv()
            except (EOFError, OSError):
                break
        self.process.join(max(deadline - time.monotonic(), 0.1))
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(10)

    @property
    def num_live(self) -> int:
        """Requests submitted whose final output has not come back yet (their metrics are not
        recorded yet either)."""
        return len(self._live)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.error is None and not self._stopping and self.process.is_alive()

    # -- requests -------------------------------------------------------------------------------
    def submit(self, prompts: list[list[int]], params: list[SamplingParams], adapter: str | None) -> RequestGroup:
        """One engine request per (prompt, params) pair; all run under `adapter` (None: base).
        Raises APIError 503 when the queue is full or the engine process is gone. Event loop only."""
        if not self.alive:
            raise APIError(503, ErrorCode.ENGINE_FAILED, f"the engine is not running ({self.error})")
        if len(self._live) + len(prompts) > self.capacity:
            raise APIError(503, ErrorCode.QUEUE_FULL,
                           f"server overloaded: {len(self._live)} requests live, at most {self.capacity} "
                           f"(max_num_seqs + max_queue); retry later")
        base = f"srv-{next(self._ids)}"
        rids = [f"{base}-{i}" for i in range(len(prompts))]
        group = RequestGroup(self, rids)
        for rid in rids:
            self._live[rid] = _Live(group)
        self._send(("add", [(rid, ids, p) for rid, ids, p in zip(rids, prompts, params)], adapter))
        return group

    async def call(self, name: str, *args):
        """Run `name` (load_adapter / unload_adapter / stats) in the engine process between steps."""
        return await asyncio.wrap_future(self._call(name, args))

    def call_sync(self, name: str, *args, timeout: float = 60.0):
        """call() from a thread outside the event loop (tests, tools)."""
        return self._call(name, args).result(timeout)

    def _call(self, name: str, args: tuple) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if not self.alive:
            fut.set_exception(RuntimeError(f"the engine is not running ({self.error})"))
            return fut
        call_id = next(self._ids)
        self._calls[call_id] = fut
        self._send(("call", call_id, name, args))
        return fut

    def _send(self, cmd: tuple) -> None:
        with self._send_lock:
            try:
                self._cmd.send(cmd)
            except (OSError, ValueError):  # the engine process is gone; the reader reports it
                pass

    # -- the out pipe, read on the event loop --------------------------------------------------
    def _on_readable(self) -> None:
        """The out pipe has data: handle every message that is there, then give the loop back.
        (recv does not wait: a readable pipe holds a whole message, or the start of one that the
        engine is writing out right now, without pausing between its parts.)"""
        try:
            while self._out.poll():
                msg = self._out.recv()
                if msg[0] == "out":
                    self._dispatch(msg[1], msg[2])
                elif msg[0] == "reply":
                    self._reply(*msg[1:])
        except (EOFError, OSError):  # the engine process is gone
            self._unwatch()
            if not self._stopping:
                # (joined off the loop: the process may take a moment to exit after closing its pipe)
                threading.Thread(target=self._engine_gone, name="engine-gone", daemon=True).start()

    def _unwatch(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(self._out.fileno())
            except (ValueError, OSError, RuntimeError):  # closed pipe or loop
                pass

    def _reply(self, call_id: int, ok: bool, result) -> None:
        fut = self._calls.pop(call_id, None)
        if fut is not None and fut.set_running_or_notify_cancel():
            if ok:
                fut.set_result(result)
            else:
                kind, message = result
                fut.set_exception({"ValueError": ValueError, "OSError": OSError}.get(kind, RuntimeError)(message))

    def _engine_gone(self) -> None:
        self.process.join(5)
        self.error = f"{ENGINE_DEAD} (exit code {self.process.exitcode})"
        logger.error(self.error)
        for fut in list(self._calls.values()):
            if fut.set_running_or_notify_cancel():
                fut.set_exception(RuntimeError(self.error))
        self._calls.clear()
        try:
            self._loop.call_soon_threadsafe(self._fail_all, self.error)
        except RuntimeError:  # the event loop is closed (server shutting down)
            pass

    def _dispatch(self, batch: tuple, stats: tuple) -> None:
        """One step's news (engine_worker.pack's columns) -> each request's RequestOutput into its
        group's queue; metrics (stats: Stats' fields)."""
        now = time.perf_counter()
        m = self.metrics
        rids, new_ids, deltas, rows, ends = batch
        ended = {e[0]: e[1:] for e in ends}
        for i, rid in enumerate(rids):
            live = self._live.get(rid)
            if live is None:
                continue  # a second report of a request already ended
            new, delta = new_ids[i], deltas[i]
            live.tokens += new
            if delta:
                live.pieces.append(delta)
            row = rows[i] if rows is not None else None
            if row is not None:
                if live.logprobs is None:
                    live.logprobs, live.top = [], []
                live.logprobs += row[0]
                live.top += row[1]
            group = live.group
            group.t_put = now
            if m is not None and new:
                m.on_tokens(now - (live.last if live.last is not None else group.arrival), len(new),
                            first=live.last is None)
                live.last = now
            end = ended.get(i)
            finished = end is not None
            reason, error, num_cached = (end[0], end[1], end[2]) if finished else (None, None, 0)
            if finished:
                del self._live[rid]
                if m is not None:
                    m.on_finished(reason, end[3], num_cached, len(live.tokens),
                                  None if live.last is None else live.last - group.arrival)
            if rid not in group.unfinished:
                continue  # aborted by its client: nobody is listening
            # as a "delta" engine's outputs: a running request's carry this step's tokens and rows only
            # (what its stream sends; no copies of ever longer lists), the final one everything
            if finished:
                ids, lps, tops = live.tokens, live.logprobs, live.top
            else:
                ids, lps, tops = new, None if row is None else row[0], None if row is None else row[1]
            group.put(RequestOutput(
                request_id=rid, prompt_token_ids=[], new_token_ids=new, token_ids=ids, finished=finished,
                finish_reason=reason, error=error, text="".join(live.pieces) if finished else None,
                delta_text=delta, logprobs=lps, top_logprobs=tops, num_cached_tokens=num_cached))
        if m is not None:
            m.on_stats(Stats._make(stats))
        if self.trace is not None:
            self.trace.record(now, stats[-1], len(rids))
            if not self._live:
                self.trace.flush()

    def _fail_all(self, message: str) -> None:
        live, self._live = self._live, {}
        for rid, entry in live.items():
            if rid in entry.group.unfinished:
                entry.group.put(RequestOutput(
                    request_id=rid, prompt_token_ids=[], new_token_ids=[], token_ids=entry.tokens, finished=True,
                    finish_reason="error", error=message))


def grow_pipe(fd: int) -> None:
    """Make the pipe behind fd as large as an unprivileged process may (/proc/sys/fs/pipe-max-size,
    1 MiB by default) instead of 64 KiB; nothing where that cannot be done (not Linux, not a pipe)."""
    try:
        import fcntl

        setsize = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # (named in Python >= 3.10 on Linux)
        with open("/proc/sys/fs/pipe-max-size") as f:
            size = int(f.read())
        fcntl.fcntl(fd, setsize, size)
    except (ImportError, OSError, ValueError):
        pass
