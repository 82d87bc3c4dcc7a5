"""Instrumentation of the server's processes, off unless an environment variable names a place.

TG_SERVE_PROFILE=DIR: cProfile the server's two processes (benchmarks/profile_serve.py sets it).
The HTTP process writes DIR/http.prof when uvicorn returns, the engine process DIR/engine.prof when
its loop ends (`pstats` or snakeviz read them). TG_SERVE_PROFILE_CLOCK=cpu times them by the process's
CPU time (time.process_time) instead of the wall clock: on a host with fewer cores than busy processes,
a wall-clock profile charges the time the process spent off its core to whatever function was running
(the socket write that woke the client, typically).

TG_SERVE_TRACE=FILE: the engine process writes one CSV line per loop iteration that added requests
or stepped (StepTrace.FIELDS; times are time.perf_counter(), CLOCK_MONOTONIC on Linux, so they line
up with other processes' clocks): when the iteration began, how many requests it added, when the
engine's step began and ended, when its outputs were sent, the batch after the step, how long the
step waited for the device (LLMEngine.device_wait_s), and from the step's start to its send the
thread's CPU seconds (wall time well above CPU plus device wait: the process was off its core) and
the garbage collector's pauses (GcClock), and the tokens the step scheduled (LLMEngine.num_scheduled_tokens:
more than the batch running before it means prompt chunks), and the engine's step count after it
(LLMEngine.num_steps: the key that pairs a step with its message in FILE.out). benchmarks/bench_serve.py
reads it.

With TG_SERVE_TRACE=FILE the HTTP process also writes
- FILE.http: one line per submitted HTTP request when it ends (RequestTrace.FIELDS): when its handler
  began (the body read and parsed), when it began to send its engine requests into the command pipe, when
  the HTTP process read its last final output from the out pipe, when its stream took that output from
  its group, when the stream's last content chunk and its `[DONE]` had been handed to the server (the
  generator resumed after yielding them: uvicorn has written them to the socket, or buffered them if the
  client does not read), and the response id (what the client sees as the chunks' "id"); a request
  answered in one body has its taken, written and done times all at the moment its body was built;
- FILE.out: one line per out-pipe message (OutTrace.FIELDS): when the HTTP process read it and the
  engine step count it carries (Stats.steps), so that a reader pairs it with its step in FILE (the
  run-ahead engine's last iteration only collects the last outputs: its count repeats the step before).
Together with the client's own receive times they split a served pass's tail: engine -> pipe -> HTTP
process -> socket -> client.

Unset (the default), these cost nothing: `profiled` calls the function directly, `step_trace`,
`request_trace` and `out_trace` are None.
"""

from __future__ import annotations

import os
import time
from typing import Callable


def profiled(name: str, fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs), under cProfile when TG_SERVE_PROFILE names a folder (stats saved to
    DIR/<name>.prof however fn ends)."""
    folder = os.environ.get("TG_SERVE_PROFILE")
    if not folder:
        return fn(*args, **kwargs)
    import cProfile

    os.makedirs(folder, exist_ok=True)
    cpu = os.environ.get("TG_SERVE_PROFILE_CLOCK") == "cpu"
    prof = cProfile.Profile(time.process_time) if cpu else cProfile.Profile()
    try:
        return prof.runcall(fn, *args, **kwargs)
    finally:
        prof.dump_stats(os.path.join(folder, f"{name}.prof"))


class StepTrace:
    """Appends one line per engine-loop iteration to a CSV file, flushed at least every 0.2 s and
    whenever the engine goes idle (so that a reader sees a finished pass)."""

    FIELDS = ("t_loop", "added", "t_step", "t_stepped", "t_sent", "running", "waiting", "outputs", "device_wait",
              "step_cpu", "gc", "tokens", "running_before", "steps")

    def __init__(self, path: str):
        self.gc = GcClock()
        self.file = open(path, "a", buffering=1 << 16)
        if self.file.tell() == 0:
            self.file.write(",".join(self.FIELDS) + "\n")
        self.flushed = time.perf_counter()

    def record(self, *values) -> None:
        self.file.write(",".join(map(repr, values)) + "\n")
        now = time.perf_counter()
        if now - self.flushed > 0.2:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        self.file.flush()
        self.flushed = time.perf_counter() if now is None else now


class RequestTrace:
    """The HTTP process's side of TG_SERVE_TRACE: a line per submitted request when it ends, flushed at
    once (a burst's last requests must reach the file without a later one). Times are
    time.perf_counter(); one not reached (a client that went away first) is nan."""

    FIELDS = ("t_handler", "t_submit", "engine_requests", "t_final", "t_taken", "t_written", "t_done", "id")

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)
        if self.file.tell() == 0:
            self.file.write(",".join(self.FIELDS) + "\n")

    def record(self, t_handler: float, t_submit: float, n: int, t_final: float, t_taken: float, t_written: float,
               t_done: float, rid: str) -> None:
        self.file.write(f"{t_handler!r},{t_submit!r},{n},{t_final!r},{t_taken!r},{t_written!r},{t_done!r},{rid}\n")


class OutTrace:
    """The HTTP process's out-pipe messages (TG_SERVE_TRACE's FILE.out): when each was read, and the
    engine step it reports. Buffered (a line per step): flushed every 0.2 s and whenever no request is
    left live (the end of a pass: a reader sees all of it)."""

    FIELDS = ("t_read", "steps", "outputs")

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1 << 16)
        if self.file.tell() == 0:
            self.file.write(",".join(self.FIELDS) + "\n")
        self.flushed = time.perf_counter()

    def record(self, t_read: float, steps: int, outputs: int) -> None:
        self.file.write(f"{t_read!r},{steps},{outputs}\n")
        if t_read - self.flushed > 0.2:
            self.file.flush()
            self.flushed = t_read

    def flush(self) -> None:
        self.file.flush()
        self.flushed = time.perf_counter()


def request_trace() -> RequestTrace | None:
    """The HTTP process's RequestTrace when TG_SERVE_TRACE names a file (FILE.http), else None."""
    path = os.environ.get("TG_SERVE_TRACE")
    return RequestTrace(path + ".http") if path else None


def out_trace() -> OutTrace | None:
    """The HTTP process's OutTrace when TG_SERVE_TRACE names a file (FILE.out), else None."""
    path = os.environ.get("TG_SERVE_TRACE")
    return OutTrace(path + ".out") if path else None


def step_trace() -> StepTrace | None:
    """The engine process's StepTrace when TG_SERVE_TRACE names a file, else None."""
    path = os.environ.get("TG_SERVE_TRACE")
    return StepTrace(path) if path else None


class GcClock:
    """Seconds the garbage collector has paused this process since it was made (gc.callbacks)."""

    def __init__(self):
        import gc

        self.total = 0.0
        self._start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._start
