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
more than the batch running before it means prompt chunks). benchmarks/bench_serve.py reads it.

With TG_SERVE_TRACE=FILE the HTTP process also writes FILE.http: one line per submitted HTTP request
(RequestTrace.FIELDS): when its handler began (the body read and parsed) and when it began to send its
engine requests into the command pipe.

Unset (the default), these cost nothing: `profiled` calls the function directly, `step_trace` and
`request_trace` are None.
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
              "step_cpu", "gc", "tokens", "running_before")

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
    """The HTTP process's side of TG_SERVE_TRACE: a line per submitted request, flushed at once (a
    burst's last requests must reach the file without a later one)."""

    FIELDS = ("t_handler", "t_submit", "engine_requests")

    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)
        if self.file.tell() == 0:
            self.file.write(",".join(self.FIELDS) + "\n")

    def record(self, t_handler: float, t_submit: float, n: int) -> None:
        self.file.write(f"{t_handler!r},{t_submit!r},{n}\n")


def request_trace() -> RequestTrace | None:
    """The HTTP process's RequestTrace when TG_SERVE_TRACE names a file (FILE.http), else None."""
    path = os.environ.get("TG_SERVE_TRACE")
    return RequestTrace(path + ".http") if path else None


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
