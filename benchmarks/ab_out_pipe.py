"""How the HTTP process reads the engine's out pipe, and what that costs the engine: a sender process
standing in for the engine process (one message per "step" of --step-ms, the size of a 128-request
step's pack()) against a receiver whose asyncio event loop is kept busy as the HTTP process's is.

    python3 benchmarks/ab_out_pipe.py                   # all four arms, CPU only
    python3 benchmarks/ab_out_pipe.py --busy 0.45 --burst-s 1.0 --steps 400

Arms (reader x pipe size):
  thread-64k  a reader thread blocks in recv() and hands each message to the loop with
              call_soon_threadsafe (serve up to session 33), the default 64 KiB pipe
  thread-1m   the same with the pipe grown to /proc/sys/fs/pipe-max-size
  loop-64k    the event loop reads the pipe itself (add_reader), 64 KiB pipe
  loop-1m     add_reader and the grown pipe (serve now: engine_client.py)

The loop's load: callbacks of pure Python work taking --busy of each --step-ms (the HTTP process at
saturation: SSE chunks of 128 streams per step), and all of it (100%) for the first --burst-s seconds
(the admission burst: 512 requests parsed). Reported per arm: the time the sender spent blocked in
send() (that is the engine process not stepping: its per-step cost), in total and per step, and the
delivery latency from send to the loop's handling of the message (p50 / p99). A reader thread must take
the GIL back from a busy loop after each blocking read (up to sys.getswitchinterval(), 5 ms, each time),
so it falls behind, the pipe fills and the engine's send blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import pickle
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from text_generator.serve.engine_client import grow_pipe  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="messages per arm")
    p.add_argument("--step-ms", type=float, default=9.0, help="the engine's step (the H100's decode step ~9 ms)")
    p.add_argument("--requests", type=int, default=128, help="requests per step's message")
    p.add_argument("--busy", type=float, default=0.45, help="the loop's busy fraction after the burst")
    p.add_argument("--burst-s", type=float, default=0.5, help="seconds of a fully busy loop at the start")
    p.add_argument("--arms", nargs="*", default=["thread-64k", "thread-1m", "loop-64k", "loop-1m"])
    return p.parse_args()


def message(n: int, t_sent: float) -> tuple:
    """The shape of engine_worker.pack()'s message for n requests with one token and logprobs=1 each."""
    rids = [f"srv-{i}-0" for i in range(n)]
    cols = (rids, [[1000 + i] for i in range(n)], ["" for _ in range(n)],
            [([-0.5], [{1000 + i: -0.5}]) for i in range(n)], [])
    return ("out", cols, (0, n, 100, 100, 0, 4001, 0, 0, 1), t_sent)


def sender(conn, steps: int, step_s: float, n: int, result) -> None:
    """The engine process's part: a step (sleep: the device's time), then one send; -> blocked times."""
    blocked = []
    for _ in range(steps):
        time.sleep(step_s)
        t = time.perf_counter()
        conn.send(message(n, t))
        blocked.append(time.perf_counter() - t)
    conn.send(("end", None, None, time.perf_counter()))
    result.send(blocked)


def spin(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


async def load(stop: asyncio.Event, busy: float, step_s: float, burst_s: float) -> None:
    """The HTTP process's work on the loop: fully busy for burst_s (in 1 ms callbacks: other work
    interleaves, as request handlers do), then busy of every step_s."""
    t0 = time.perf_counter()
    while not stop.is_set() and time.perf_counter() - t0 < burst_s:
        spin(0.001)
        await asyncio.sleep(0)
    while not stop.is_set():
        spin(busy * step_s)
        await asyncio.sleep((1 - busy) * step_s)


def run_arm(arm: str, a) -> dict:
    reader, size = arm.split("-")
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    res_recv, res_send = ctx.Pipe(duplex=False)
    if size == "1m":
        grow_pipe(recv.fileno())
    proc = ctx.Process(target=sender, args=(send, a.steps, a.step_ms / 1e3, a.requests, res_send), daemon=True)
    latencies: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def handle(msg) -> None:
            if msg[0] == "end":
                stop.set()
            else:
                latencies.append(time.perf_counter() - msg[3])

        if reader == "loop":
            def readable() -> None:
                while recv.poll():
                    handle(recv.recv())

            loop.add_reader(recv.fileno(), readable)
        else:
            def read() -> None:
                while True:
                    msg = recv.recv()
                    loop.call_soon_threadsafe(handle, msg)
                    if msg[0] == "end":
                        return

            threading.Thread(target=read, daemon=True).start()
        proc.start()
        await load(stop, a.busy, a.step_ms / 1e3, a.burst_s)
        if reader == "loop":
            loop.remove_reader(recv.fileno())

    asyncio.run(main())
    blocked = res_recv.recv()
    proc.join()
    lat = sorted(latencies)
    return dict(arm=arm, blocked_ms_total=1e3 * sum(blocked), blocked_ms_per_step=1e3 * statistics.mean(blocked),
                steps_blocked_over_1ms=sum(b > 1e-3 for b in blocked),
                latency_ms_p50=1e3 * lat[len(lat) // 2], latency_ms_p99=1e3 * lat[int(0.99 * (len(lat) - 1))])


def main() -> None:
    a = parse_args()
    size = len(pickle.dumps(message(a.requests, 0.0), protocol=pickle.HIGHEST_PROTOCOL))
    print(f"{a.steps} steps of {a.step_ms} ms, {size} bytes a message, loop busy {100 * a.busy:.0f}% after a "
          f"{a.burst_s} s fully busy burst", flush=True)
    for arm in a.arms:
        r = run_arm(arm, a)
        print(f"{arm:10s}  engine blocked in send: {r['blocked_ms_total']:7.1f} ms in all, "
              f"{r['blocked_ms_per_step']:.3f} ms a step ({r['steps_blocked_over_1ms']} steps > 1 ms); "
              f"delivery p50 {r['latency_ms_p50']:.2f} ms, p99 {r['latency_ms_p99']:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
