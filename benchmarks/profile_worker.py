"""What `serve`'s engine process adds to each engine step: LLMEngine stepping alone against the same engine
driven by serve's EngineWorker loop (command polling, output packing, one pipe message per step to a
reader process), in one process, alternating, on a tiny random model on the CPU (an engine step costs
little there, so the loop's own work shows).

    python3 benchmarks/profile_worker.py                    # 128 requests x 64 tokens, logprobs=1
    python3 benchmarks/profile_worker.py --rounds 5 --no-logprobs

Reports the CPU time (time.process_time of this process: the engine's thread, with one torch thread)
per step of each mode over the same load, their difference per step and per output token, and a
breakdown of the worker's extras for one full 128-request step (packing, pickling, the stats, the
poll; and the unpickling the HTTP process's reader then does). CPU time rather than wall time: the
helper machines are shared, so wall times move with other jobs while a process's own CPU time does
not (much). Run from an older tree (before engine_worker.pack) it times that tree's per-request tuples.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_engine import TINY  # noqa: E402
from benchmarks.bench_serve import checkpoint  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3, help="alternating (engine, worker) rounds; medians reported")
    p.add_argument("--no-logprobs", action="store_true")
    p.add_argument("--checkpoint", default=None)
    a = p.parse_args()
    a.tiny, a.device = True, "cpu"
    return a


def _drain(conn) -> None:
    """The reader process: receive (and unpickle) every message, as the HTTP process's event loop does."""
    while True:
        try:
            if conn.recv() == "end":
                return
        except EOFError:
            return


def main() -> None:
    from text_generator import LLMEngine, SamplingParams, TextGenerator
    from text_generator.serve import engine_worker
    from text_generator.tokenizer import load_tokenizer

    a = parse_args()
    torch.set_num_threads(1)
    path = checkpoint(a)
    gen = TextGenerator.from_pretrained(path, device="cpu")
    max_len = a.input_len + a.output_len + 16
    engine = LLMEngine(gen, max_num_seqs=a.max_num_seqs, max_num_batched_tokens=4096, max_seq_len=max_len,
                       tokenizer=load_tokenizer(path), output_kind="delta")  # as serve's engine process
    params = SamplingParams(temperature=0.0, max_new_tokens=a.output_len, ignore_eos=True,
                            logprobs=None if a.no_logprobs else 1)
    g = torch.Generator().manual_seed(0)
    vocab = TINY["vocab_size"]

    def prompts():
        return [torch.randint(3, vocab, (a.input_len,), generator=g).tolist() for _ in range(a.num_prompts)]

    ctx = multiprocessing.get_context("spawn")
    out_recv, out_send = ctx.Pipe(duplex=False)
    cmd_recv, cmd_send = ctx.Pipe(duplex=False)
    reader = ctx.Process(target=_drain, args=(out_recv,), daemon=True)
    reader.start()
    worker = engine_worker.EngineWorker(engine, out_send.send)

    def engine_alone(ps) -> tuple[float, int]:
        for p in ps:
            engine.add_request(p, params)
        steps, c0 = 0, time.process_time()
        while engine.has_unfinished():
            engine.step()
            steps += 1
        return time.process_time() - c0, steps

    def through_worker(ps) -> tuple[float, int]:
        cmd_send.send(("add", [(f"r{i}-{id(ps)}", p, params) for i, p in enumerate(ps)], None))
        steps, c0 = 0, time.process_time()
        while True:  # engine_worker._lead's loop, without the TP broadcast
            cmds = []
            if cmd_recv.poll(0):
                cmds.append(cmd_recv.recv())
                while cmd_recv.poll():
                    cmds.append(cmd_recv.recv())
            worker.apply(cmds)
            if not worker.busy:
                break
            worker.step()
            steps += 1
        return time.process_time() - c0, steps

    engine_alone(prompts())  # untimed warm-up of both paths
    through_worker(prompts())
    tokens = a.num_prompts * a.output_len
    rows = {"engine": [], "worker": []}
    for r in range(a.rounds):
        for name, fn in (("engine", engine_alone), ("worker", through_worker)) if r % 2 == 0 else \
                (("worker", through_worker), ("engine", engine_alone)):
            cpu, steps = fn(prompts())
            rows[name].append((cpu, steps))
            print(f"round {r} {name}: {1e3 * cpu:.0f} ms CPU, {steps} steps, {1e6 * cpu / steps:.0f} us/step",
                  flush=True)
    e = statistics.median(c / s for c, s in rows["engine"])
    w = statistics.median(c / s for c, s in rows["worker"])
    steps = statistics.median(s for _, s in rows["engine"])
    print(f"\nmedian CPU per step: engine alone {1e6 * e:.0f} us, through the worker {1e6 * w:.0f} us: "
          f"+{1e6 * (w - e):.0f} us a step ({100 * (w - e) / e:.1f}%), "
          f"+{1e6 * (w - e) * steps / tokens:.2f} us per output token")
    breakdown(engine, worker, params, prompts(), cmd_recv)
    out_send.send("end")
    reader.join(10)


def breakdown(engine, worker, params, ps, cmd_conn, reps: int = 200) -> None:
    """Time each of the worker's extras on one decode step's outputs of len(ps) requests."""
    from text_generator.serve import engine_worker

    for p in ps:
        engine.add_request(p, params)
    outs = []
    while engine.has_unfinished() and len(outs) < len(ps):
        outs = [o for o in engine.step() if not o.finished]  # a decode step with every request
    n = len(outs)

    def t(fn) -> float:
        c0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return 1e6 * (time.perf_counter() - c0) / reps

    if hasattr(engine_worker, "pack"):
        def pack():
            return engine_worker.pack(outs, [])
    else:  # a tree before pack(): one tuple per request
        def pack():
            return [engine_worker.lean(o) for o in outs]
    message = ("out", pack(), tuple(engine_worker.engine_stats(engine)))
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    print(f"one step of {n} requests: pack {t(pack):.0f} us, pickle {t(lambda: pickle.dumps(message, -1)):.0f} us "
          f"({len(data)} bytes), unpickle {t(lambda: pickle.loads(data)):.0f} us, "
          f"stats {t(lambda: engine_worker.engine_stats(engine)):.1f} us, poll {t(lambda: cmd_conn.poll(0)):.1f} us")
    while engine.has_unfinished():
        engine.step()


if __name__ == "__main__":
    main()
