"""What the HTTP layer costs: the OpenAI-compatible server under an `openai`-client load, beside the engine
driven directly with the same requests, in one run, their timed passes interleaved.

    python3 benchmarks/bench_serve.py                 # GPU: Llama-3-8B shape, bf16, random weights
    python3 benchmarks/bench_serve.py --tiny --device cpu

Budget: `--num-prompts 512 --repeats 3 --rates --no-paced` on one H100 of a 16-core job takes about 4-5 minutes:
the server's start 95-115 s (model load and the start-up pass's graph captures, beside the engine row's own), the
untimed first passes, then ~30 s a pair (two ~8 s passes, the clients' set-up, the trace reads); give it 300 s.
The rates rows add ~70 s per rate at 8/s (512 requests).

Load: --num-prompts random prompts of --input-len token ids, each generating exactly --output-len tokens
greedily (EOS ignored) with logprobs=1 (so that every step's token reaches the client as a chunk: the
demo byte tokenizer the random checkpoint carries decodes most ids to no text).

Both sides are resident at once: `python -m text_generator serve` starts in a subprocess (its engine in its
own process, as `serve` always runs) while this process builds the same LLMEngine (same max-num-seqs,
batched tokens, max-model-len, the same --num-blocks on both sides instead of a memory fraction, one torch
thread on CUDA, the server's start-up pass, output_kind "delta"). Each side first runs the load once untimed on other prompts;
then --repeats pairs of timed passes, engine pass then server pass, each pair on its own fresh prompts (so
that no pass finds the previous one's prompts in a prefix cache). Each pair gives a ratio server / engine
tokens/s; the HTTP cost is 1 - the median ratio, reported with every pass and the ratios' spread. The engine
pass adds all requests at t = 0 (LLMEngine.generate); the served pass sends them all at once.
Then Poisson arrivals at each --rates (server only).

The load generator must not be what it measures: the openai client spends about 200-250 us of Python per
SSE chunk, so one process parses at most ~4,000-5,000 chunks/s: ~60 streams at one token per 15 ms step.
--client-procs processes share the requests round-robin, each with its own event loop. The default on CUDA
gives each process at most 32 requests (16 processes for 512): a process's requests reach the server
together, so the engine (first come, first admitted) runs a process's whole share in the same wave of
max-num-seqs streams; with 64 a process (8 processes, session 35) parsed 64 streams at once, fell up to
0.4 s behind the server's writes and set the end of the pass. The clients are niced below the server and
only the processes of the running wave are busy, so 16 fit the GPU host's 16 cores beside the server's two
processes. Every served row reports client_cpu_pct (the busiest client
process: near 100 means the client set the pace), http_cpu_pct and engine_proc_cpu_pct (the server's
two processes, from /proc), and tokens_per_chunk (above 1 where the server sent a stream's queued tokens
as one chunk because it, or its client, was behind). (engine_proc_cpu_pct near 100 does not by itself mean
the engine is host-bound: CUDA's default synchronize spins on the CPU while it waits for the GPU.)

Reports output tokens/s, TTFT and inter-token latency p50 / p99, steady_tokens_per_s (over the middle half
of a pass: without the burst's admission and the tail) and engine_steps (the pass's engine steps: from
LLMEngine.num_steps, and from the server's /metrics tg_engine_steps), so that a cost shows as more steps or as
longer ones. With the trace (the default; --no-trace: none; the server's engine process writes a line per step,
TG_SERVE_TRACE, and a wrapper of the engine row's step records the same) every timed pass also gets `phases`:
per quarter of the pass its steps, wall ms per step, ms inside LLMEngine.step (of which waiting for the device),
ms of loop work around it (intake: commands read and applied; send: outputs packed and sent), CPU and GC-pause
ms per step and the mean running batch; the server's passes add when the engine had added the last request and
the gaps before the first step and after the last one, and the HTTP process's first handler and submissions.
The load generator's set-up is not the server's cost: before a saturation pass every client process builds
its openai client and its request bodies and opens one keep-alive connection per request (GET /v1/models,
all at once); all processes then start on one clock (t_start, 2 s after the pass is handed out:
client_ready_ms_before_start says by how much they were ready, client_connections how many connections
were open). The requests go out through the openai client's generic `post` with the pre-built bodies (the
per-call transform of a 256-token prompt in `completions.create` cost ~5 ms, which held each process's first
send back ~350 ms when it sat inside the window); the chunks are parsed by the openai client as ever. The
server's own work on the burst (~0.7 ms a request in uvicorn, FastAPI and pydantic) stays in the window.
The server's passes are timed on the client clock (the start to the last token received) and, with the
trace, also on the server's clock: from the first request in the server's hands (its handler began) to the
last token at its client. With the trace the server's passes also get `tail` (tail_split): from the engine's
last step to the HTTP process reading its outputs, its streams taking and writing them, the clients parsing
them and closing their streams (the HTTP process's per-request and per-message trace lines, the clients'
receive times, paired by response id), per request and for the pass's last ones. uvicorn's HTTP parser and
loop (httptools or h11, uvloop or asyncio) are recorded as "uvicorn". Writes benchmarks/results/serve.json, serve.png and
serve_trace.json (every step of every timed pass; serve_tiny.* with --tiny).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_engine import TINY  # noqa: E402
from benchmarks.common import LLAMA3_8B, make_random_checkpoint, percentile, pyplot  # noqa: E402

BLOCK_SIZE = 16  # the engine's and serve's default


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--num-prompts", type=int, default=None, help="requests per pass (default 512; tiny: 8)")
    p.add_argument("--input-len", type=int, default=None, help="default 256 (tiny: 16)")
    p.add_argument("--output-len", type=int, default=None, help="default 128 (tiny: 8)")
    p.add_argument("--rates", type=float, nargs="*", default=None, help="requests/s (default 8 16 32; tiny: 4)")
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks of each side (default: 1.25 x max-num-seqs full-length sequences)")
    p.add_argument("--client-procs", type=int, default=None,
                   help="load-generator processes (default on CUDA: one per 32 requests, at least 8; 1 on the CPU)")
    p.add_argument("--repeats", type=int, default=3,
                   help="interleaved timed pairs (engine pass, server pass), each on fresh prompts")
    p.add_argument("--server-threads", type=int, default=None,
                   help="OMP_NUM_THREADS of the server (its engine process takes the same torch threads; "
                   "default: inherited)")
    p.add_argument("--no-paced", dest="paced", action="store_false",
                   help="no third pass per pair (the engine fed with the served pass's arrival times)")
    p.add_argument("--no-trace", dest="trace", action="store_false",
                   help="no per-step trace of either side (the pass phases are then not reported)")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    dflt = dict(num_prompts=8, input_len=16, output_len=8, rates=[4.0]) if a.tiny else \
        dict(num_prompts=512, input_len=256, output_len=128, rates=[8.0, 16.0, 32.0])
    for k, v in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.client_procs is None:
        a.client_procs = max(8, -(-a.num_prompts // 32)) if a.device != "cpu" else 1
    a.out = a.out or os.path.join(ROOT, "benchmarks", "results", "serve_tiny" if a.tiny else "serve")
    a.max_model_len = a.input_len + a.output_len + 16
    if a.num_blocks is None:  # every running sequence at full length, and a quarter more for the prefix cache
        a.num_blocks = -(-5 * a.max_num_seqs * -(-a.max_model_len // BLOCK_SIZE) // 4) + 1
    return a


def checkpoint(a) -> str:
    from text_generator.tokenizer import ByteTokenizer

    cfg = TINY if a.tiny else LLAMA3_8B
    path = a.checkpoint or os.path.join("/tmp", "bench_serve_tiny" if a.tiny else "bench_serve_8b")
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    make_random_checkpoint(path, cfg, dtype, device=a.device if a.device != "cpu" else "cpu")
    ByteTokenizer().save_pretrained(path)
    return path


def stats(ttft: list[float], itl: list[float], tokens: int, seconds: float, times: list[float]) -> dict:
    """times: when each output token was emitted (engine) or reached its client (server)."""
    return dict(output_tokens_per_s=tokens / seconds, seconds=seconds, output_tokens=tokens,
                steady_tokens_per_s=steady_rate(times),
                ttft_ms_p50=percentile(ttft, 50) * 1e3, ttft_ms_p99=percentile(ttft, 99) * 1e3,
                itl_ms_p50=percentile(itl, 50) * 1e3, itl_ms_p99=percentile(itl, 99) * 1e3)


def steady_rate(times: list[float]) -> float:
    """Tokens/s over the middle half of the span from the first output token to the last: the rate
    once the pass is under way, without the burst's admission (the server parses its requests one
    by one while the engine row has them all at t = 0) and the last requests' tail."""
    if len(times) < 2:
        return float("nan")
    t0, t1 = min(times), max(times)
    lo, hi = t0 + (t1 - t0) / 4, t1 - (t1 - t0) / 4
    return sum(1 for t in times if lo <= t < hi) / max(hi - lo, 1e-9)


def median_run(runs: list[dict]) -> dict:
    """The run of median throughput, with every run's tokens/s beside it (runs_tokens_per_s)."""
    res = dict(sorted(runs, key=lambda r: r["output_tokens_per_s"])[len(runs) // 2])
    res["runs_tokens_per_s"] = [r["output_tokens_per_s"] for r in runs]
    return res


class EngineRow:
    """LLMEngine in this process with the server's settings (see the module docstring); run() times one
    pass of LLMEngine.generate over prompts."""

    def __init__(self, a, path):
        from text_generator import LLMEngine, SamplingParams, TextGenerator
        from text_generator.tokenizer import load_tokenizer

        if a.device != "cpu":
            torch.set_num_threads(1)  # as serve's engine process on CUDA: the same engine on both sides
        self.gen = TextGenerator.from_pretrained(path, device=a.device)
        self.engine = LLMEngine(self.gen, num_blocks=a.num_blocks, block_size=BLOCK_SIZE, max_num_seqs=a.max_num_seqs,
                                max_num_batched_tokens=a.max_num_batched_tokens, max_seq_len=a.max_model_len,
                                tokenizer=load_tokenizer(path), output_kind="delta")  # as serve's engine
        if a.device != "cpu":
            from text_generator.serve.warmup import warm_up

            warm_up(self.engine)  # serve's start-up pass: every decode-graph bucket, every kernel
        self.params = SamplingParams(temperature=0.0, max_new_tokens=a.output_len, ignore_eos=True, logprobs=1)
        self.trace: list[tuple] | None = [] if a.trace else None
        if a.trace:  # the server's StepTrace fields, from a wrapper of the engine's step (generate calls it)
            from text_generator.serve.profiling import GcClock

            step, engine, trace, gc_clock = self.engine.step, self.engine, self.trace, GcClock()

            def traced_step():
                tokens, wait, gc0 = engine.num_scheduled_tokens, engine.device_wait_s, gc_clock.total
                running0, cpu0, t_step = len(engine.scheduler.running), time.thread_time(), time.perf_counter()
                outs = step()
                t, cpu = time.perf_counter(), time.thread_time() - cpu0
                trace.append((t_step, 0, t_step, t, t, len(engine.scheduler.running), len(engine.scheduler.waiting),
                              len(outs), engine.device_wait_s - wait, cpu, gc_clock.total - gc0,
                              engine.num_scheduled_tokens - tokens, running0))
                return outs

            self.engine.step = traced_step

    def run(self, prompts, arrivals: list[tuple[float, int]] | None = None) -> dict:
        """One timed pass: all prompts added at t = 0 (LLMEngine.generate), or with `arrivals`
        [(seconds after the start, how many)] in prompt order: the requests enter the engine when the
        server's engine process took them in (its trace), so that the engine runs the served pass's
        admission pattern without any HTTP (TTFT then counts from each request's arrival)."""
        self.engine.block_manager.reset_prefix_cache()
        steps = self.engine.num_steps
        if self.trace is not None:
            self.trace.clear()
        t0 = time.perf_counter()
        if arrivals is None:
            outs = self.engine.generate(prompts, self.params, use_tqdm=False)
        else:
            outs = self._paced(prompts, arrivals, t0)
        seconds = time.perf_counter() - t0
        ttft = [o.metrics.first_token_time - (t0 if arrivals is None else o.metrics.arrival_time) for o in outs]
        itl = [b - a_ for o in outs for a_, b in zip(o.metrics.token_times, o.metrics.token_times[1:])]
        res = stats(ttft, itl, sum(len(o.token_ids) for o in outs), seconds,
                    [t for o in outs for t in o.metrics.token_times])
        res["engine_steps"] = self.engine.num_steps - steps
        if self.trace is not None:
            res["phases"] = phases(self.trace, t0, t0 + seconds)
        return res

    def _paced(self, prompts, arrivals: list[tuple[float, int]], t0: float) -> list:
        offsets = [t for t, n in arrivals for _ in range(n)][:len(prompts)]
        offsets += [offsets[-1] if offsets else 0.0] * (len(prompts) - len(offsets))
        engine, ids, final, i = self.engine, [], {}, 0
        while len(final) < len(prompts):
            now = time.perf_counter() - t0
            while i < len(prompts) and offsets[i] <= now:
                ids.append(engine.add_request(prompts[i], self.params))
                i += 1
            if not engine.has_unfinished():
                time.sleep(max(offsets[i] - (time.perf_counter() - t0), 0.0))
                continue
            for o in engine.step():
                if o.finished:
                    final[o.request_id] = o
        return [final[r] for r in ids]


def phases(trace: list[tuple], begin: float, end: float) -> dict:
    """A pass's step trace (StepTrace.FIELDS rows) between begin and end -> per quarter of the pass
    (by wall time): steps, wall ms per step (the quarter / its steps), mean ms inside LLMEngine.step,
    of loop work around it (intake: the previous step's send to this step's start; send: this step's
    packing and send), waiting for the device inside the step, CPU ms and GC pause ms from the step's
    start to its send, mean running batch; and for the whole pass when the last request was added and
    the idle gaps at both ends."""
    rows = [r for r in trace if begin <= r[2] <= end]
    res: dict = dict(quarters=[], seconds=end - begin, steps=[])
    span = (end - begin) / 4
    prev_sent = None
    per_q: list[list] = [[] for _ in range(4)]
    for r in rows:
        t_loop, added, t_step, t_stepped, t_sent, running, waiting, outs, wait, cpu, gc_s, tokens, running0 = r[:13]
        per_q[min(int((t_step - begin) / span), 3)].append(
            (t_stepped - t_step, t_step - (t_step if prev_sent is None else prev_sent), t_sent - t_stepped,
             wait, cpu, gc_s, tokens, tokens > running0, running))
        res["steps"].append([round(x, 6) for x in (t_step - begin, t_stepped - t_step, t_step - (
            t_step if prev_sent is None else prev_sent), t_sent - t_stepped, wait, cpu, gc_s)] + [
            int(running), int(waiting), int(added), int(outs), int(tokens), int(running0)])
        prev_sent = t_sent
    names = ("step_ms", "intake_ms", "send_ms", "device_wait_ms", "cpu_ms", "gc_ms")
    for q in per_q:
        n = len(q)
        row = dict(steps=n, ms_per_step=1e3 * span / n if n else None)
        for k, name in enumerate(names):
            row[name] = 1e3 * sum(x[k] for x in q) / n if n else None
        row["tokens"] = sum(x[6] for x in q) / n if n else None
        row["prefill_steps"] = sum(x[7] for x in q)
        row["running"] = sum(x[-1] for x in q) / n if n else None
        res["quarters"].append(row)
    adds = [r for r in rows if r[1]]
    res["arrivals"] = [(r[2] - begin, int(r[1])) for r in adds]  # when the engine took requests in, how many
    if rows:
        res["first_step_after_ms"] = 1e3 * (rows[0][2] - begin)
        res["after_last_step_ms"] = 1e3 * (end - rows[-1][4])
        res["requests_added"] = sum(r[1] for r in rows)
        res["last_add_at_ms"] = 1e3 * (adds[-1][0] - begin) if adds else None
        res["steps_before_last_add"] = sum(1 for r in rows if adds and r[2] < adds[-1][2])
    return res


def read_trace(path: str) -> list[tuple]:
    """A trace CSV (text_generator/serve/profiling.py: StepTrace, RequestTrace, OutTrace) -> its rows as
    tuples, numbers as floats (other fields, such as a response id, as strings); a line being written
    (fewer fields than the header) is left out."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        lines = f.read().splitlines()
    if not lines:
        return []
    width = len(lines[0].split(","))
    rows = []
    for line in lines[1:]:
        fields = line.split(",")
        if len(fields) != width:
            continue
        rows.append(tuple(_field(x) for x in fields))
    return rows


def _field(x: str):
    try:
        return float(x)
    except ValueError:
        return x


def tail_split(steps: list[tuple], outs: list[tuple], http: list[tuple], requests: list[tuple], end: float) -> dict:
    """Where a served pass's last tokens wait after the engine's last step, from the three traces and the
    clients' receive times (all time.perf_counter(), one clock):

        engine step ends -> its outputs packed and sent -> the HTTP process reads them (out pipe, FILE.out;
        pipe_ms: each step's, paired by its step count) -> a stream takes its request's final output (take_ms) -> its last
        chunk is handed to uvicorn (write_ms) -> the client has parsed it (client_ms: socket + the openai
        client) -> the client's stream is closed (close_ms)

    per request (its final output; p50 / p99 / max over the pass), and for the pass's tail the time of the
    last of each after the engine's last step ended (last_*_ms). steps: StepTrace rows of the pass; outs:
    OutTrace rows; http: RequestTrace rows of the pass; requests: the clients' (id, sent, first token, last
    token, closed, client process); end: the last stream's close. client_ms_p50_by_process: the median
    lag of each load-generator process (one process behind the others: its own pace)."""
    if not steps:
        return {}
    # from the end of the engine's step (its outputs then packed, pickled and written: the send's end can
    # come after the reader has the message, which it reads while it is written)
    # one message per loop iteration that stepped; an iteration that only reported (the engine's step
    # count unchanged) repeats its count: rows and messages are paired by count and order within it
    stepped: dict[int, list[float]] = {}
    for r in steps:
        if len(r) > 13:
            stepped.setdefault(int(r[13]), []).append(r[3])
    read: dict[int, list[float]] = {}
    for o in outs:
        read.setdefault(int(o[1]), []).append(o[0])
    pairs = {c: list(zip(ts, read.get(c, ()))) for c, ts in stepped.items()}
    pipe = [t_read - t_end for ps in pairs.values() for t_end, t_read in ps]
    e_last = steps[-1][3]
    by_id = {r[7]: r for r in http if len(r) > 7}
    take, write, client, close = [], [], [], []
    by_proc: dict[int, list] = {}
    last = dict(final=[], written=[], client=[])
    for rid, _sent, _first, tok, closed, proc in requests:
        h = by_id.get(rid)
        if h is None or tok is None:
            continue
        t_final, t_taken, t_written = h[3], h[4], h[5]
        take.append(t_taken - t_final)
        write.append(t_written - t_taken)
        client.append(tok - t_written)
        by_proc.setdefault(proc, []).append(tok - t_written)
        close.append(closed - tok)
        last["final"].append(t_final)
        last["written"].append(t_written)
        last["client"].append(tok)

    def dist(xs):
        xs = sorted(xs)
        return [round(1e3 * percentile(xs, 50), 3), round(1e3 * percentile(xs, 99), 3), round(1e3 * xs[-1], 3)] \
            if xs else None

    res = dict(pipe_ms=dist(pipe), take_ms=dist(take), write_ms=dist(write), client_ms=dist(client),
               close_ms=dist(close), matched_requests=len(take), last_step_pipe_ms=None,
               client_ms_p50_by_process=[round(1e3 * percentile(v, 50), 2) for _, v in sorted(by_proc.items())])
    last_pairs = pairs.get(int(steps[-1][13]), []) if len(steps[-1]) > 13 else []
    if last_pairs:
        res["last_step_pipe_ms"] = 1e3 * (last_pairs[-1][1] - e_last)
    for k, v in last.items():
        res[f"last_{k}_ms"] = 1e3 * (max(v) - e_last) if v else None
    res["last_closed_ms"] = 1e3 * (end - e_last)
    return res


def tail_line(t: dict | None) -> str:
    """tail_split's numbers, one line."""
    if not t:
        return "-"

    def d(k):
        v = t.get(k)
        return "?" if not v else f"{v[0]:.1f} / {v[1]:.1f} / {v[2]:.1f}"

    def ms(k):
        v = t.get(k)
        return "?" if v is None else f"{v:.1f}"

    return (f"after the engine's last step: HTTP read it +{ms('last_step_pipe_ms')} ms, had every final output "
            f"+{ms('last_final_ms')}, wrote the last one +{ms('last_written_ms')}, last token at a client "
            f"+{ms('last_client_ms')}, last stream closed +{ms('last_closed_ms')} ms; per step / request (ms, p50 / "
            f"p99 / max): pipe {d('pipe_ms')}, final taken {d('take_ms')}, written {d('write_ms')}, at the client "
            f"{d('client_ms')}, closed {d('close_ms')} ({t.get('matched_requests')} requests); at the client, median "
            f"by process {t.get('client_ms_p50_by_process')}")


def client_line(row: dict) -> str:
    """A served pass's load generator and HTTP process, one line."""
    g = row.get
    return (f"clients: busiest {g('client_cpu_pct', float('nan')):.0f}% CPU, GC {g('client_gc_ms', float('nan')):.0f} ms "
            f"(longest pause {g('client_gc_max_pause_ms', float('nan')):.1f} ms), set-up ready "
            f"{g('client_ready_ms_before_start', float('nan')):.0f} ms before the start with "
            f"{g('client_connections', '?')} connections; HTTP process {g('http_cpu_pct', float('nan')):.0f}% CPU, "
            f"engine process {g('engine_proc_cpu_pct', float('nan')):.0f}%; {g('tokens_per_chunk', float('nan')):.3f} "
            f"tokens a chunk; ITL p50 / p99 {g('itl_ms_p50', float('nan')):.2f} / {g('itl_ms_p99', float('nan')):.1f} ms")


def phase_line(ph: dict | None) -> str:
    """The quarters' ms per step and their split (step / loop / device wait), one line."""
    if not ph or not ph.get("quarters"):
        return "-"
    qs = " | ".join("?" if q["steps"] == 0 else
                    f"{q['steps']} x {q['ms_per_step']:.2f} ms (step {q['step_ms']:.2f}: device wait "
                    f"{q['device_wait_ms']:.2f}; intake {q['intake_ms']:.2f}, send {q['send_ms']:.2f}; cpu "
                    f"{q['cpu_ms']:.2f}, gc {q['gc_ms']:.2f}; batch {q['running']:.0f}, {q['tokens']:.0f} tokens, "
                    f"{q['prefill_steps']} with prompt chunks)" for q in ph["quarters"])
    extra = f"; first step after {ph.get('first_step_after_ms', float('nan')):.1f} ms, last output + " \
            f"{ph.get('after_last_step_ms', float('nan')):.1f} ms"
    if "http_first_handler_ms" in ph:
        extra += f"; HTTP handlers: first began {ph['http_first_handler_ms']:.0f} ms, first submitted " \
                 f"{ph['http_first_submit_ms']:.0f} ms, last submitted {ph['http_last_submit_ms']:.0f} ms"
    if ph.get("last_add_at_ms") is not None and ph.get("requests_added"):
        extra += f", all {ph['requests_added']:.0f} requests added by {ph['last_add_at_ms']:.0f} ms " \
                 f"(step {ph['steps_before_last_add']})"
    return qs + extra


async def _client_part(port: int, jobs, output_len: int, t_start: float, warm: bool) -> dict:
    """One client process's share of a load: jobs = [(prompt, delay after t_start)], streamed with the
    openai AsyncOpenAI client -> its TTFTs, per-token ITLs, output tokens, end time, own CPU seconds and per
    request (response id, sent, first token, last token, stream closed).

    Before t_start (outside the timed window) the process builds its client and its request bodies and,
    with `warm`, opens one keep-alive connection per request (GET /v1/models, all at once): what a load
    generator sets up is not the server's cost. The requests go out through the client's generic
    `post` with those bodies, so that the openai client's per-call transform of the parameters (~5 ms
    for a 256-token prompt on the helper CPU: 64 requests held the process's first send back ~350 ms)
    stays out of the window; the chunks are parsed by the openai client as ever (AsyncStream[Completion])."""
    import importlib

    from openai import AsyncOpenAI, AsyncStream, DefaultAsyncHttpxClient
    from openai.types import Completion

    # (the HTTP library the openai client is built on: httpx, or its fork httpx2 in recent releases)
    httpx = importlib.import_module(DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])
    # idle keep-alive connections are dropped after 4 s here, before uvicorn closes its side (5 s)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=len(jobs) + 1, keepalive_expiry=4.0)
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=3600,
                         http_client=DefaultAsyncHttpxClient(limits=limits, timeout=3600))
    bodies = [dict(model="m", prompt=prompt, max_tokens=output_len, temperature=0.0, logprobs=1, stream=True,
                   stream_options={"include_usage": True}, ignore_eos=True) for prompt, _ in jobs]
    if warm:
        await asyncio.gather(*(client.models.list() for _ in jobs))
    # what the set-up built (the openai client, httpx, pydantic's schemas, the bodies) lives through the pass:
    # out of the collector's sight, a full collection in the window does not walk it (the server does the same)
    gc.collect()
    gc.freeze()
    pool = getattr(getattr(getattr(client, "_client", None), "_transport", None), "_pool", None)
    connections = len(pool.connections) if pool is not None else -1  # (httpx / httpcore internals: -1 unknown)
    ready = time.perf_counter()
    ttft, itl, tokens, chunks, times, reqs = [], [], [0], [0], [], []

    async def one(body, delay):
        await asyncio.sleep(max(t_start + delay - time.perf_counter(), 0.0))
        start = time.perf_counter()
        first = last = rid = None
        stream = await client.post("/completions", body=body, cast_to=Completion, stream=True,
                                   stream_cls=AsyncStream[Completion])
        async for chunk in stream:
            rid = chunk.id
            if chunk.usage is not None:
                tokens[0] += chunk.usage.completion_tokens
            if not chunk.choices or chunk.choices[0].logprobs is None:
                continue
            n = len(chunk.choices[0].logprobs.tokens or [])
            chunks[0] += 1
            now = time.perf_counter()
            times.extend([now] * n)
            if first is None:
                first = now
                ttft.append(now - start)
            elif n:
                itl.extend([(now - last) / n] * n)
            last = now
        reqs.append((rid, start, first, last, time.perf_counter()))

    pauses: list[float] = []  # the garbage collector's pauses in the window (a pause holds every stream back)
    gc_start = [0.0]

    def on_gc(phase, _info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - gc_start[0])

    gc.callbacks.append(on_gc)
    cpu0 = time.process_time()
    try:
        await asyncio.gather(*(one(b, d) for b, (_, d) in zip(bodies, jobs)))
    finally:
        gc.callbacks.remove(on_gc)
    end = time.perf_counter()
    cpu = time.process_time() - cpu0
    gc.unfreeze()  # (the process serves the next pass: its next set-up is frozen afresh)
    await client.close()
    return dict(ttft=ttft, itl=itl, tokens=tokens[0], chunks=chunks[0], first=min(r[1] for r in reqs), end=end,
                cpu=cpu, times=times, requests=reqs, ready=ready, connections=connections,
                gc_s=sum(pauses), gc_max_s=max(pauses, default=0.0))


def _client_process(port, jobs, output_len, t_start, warm) -> dict:
    return asyncio.run(_client_part(port, jobs, output_len, t_start, warm))


def _warm_client() -> None:
    # below the server's processes in the CPU scheduler: on a host with few cores the load generator
    # must not take the engine's or the HTTP process's core (its own pace is what it reports)
    os.nice(10)
    import openai  # noqa: F401 - imported once per worker, before the timed runs


class ClientPool:
    """The load generator: `procs` processes (spawned once, openai imported), each streaming its share
    of the requests on its own event loop, so that parsing SSE chunks with the openai client (about
    100 us of Python each) never limits the measurement; procs=1 runs in this process."""

    def __init__(self, procs: int):
        import concurrent.futures
        import multiprocessing

        self.procs = procs
        self.pool = None
        if procs > 1:
            self.pool = concurrent.futures.ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn"),
                                                               initializer=_warm_client)
            list(self.pool.map(time.sleep, [0.0] * procs))  # every worker started and warm

    def load(self, port: int, prompts, output_len: int, rate: float | None, seed: int = 0) -> dict:
        """All prompts at t = 0 (rate None) or Poisson arrivals at `rate`/s, dealt round-robin to the
        client processes -> stats() of the run, plus client_cpu_pct: the busiest client process's CPU
        time / the run's wall time (near 100: the client, not the server, set the pace)."""
        rng = random.Random(seed)
        delays, t = [], 0.0
        for _ in prompts:
            delays.append(t)
            if rate:
                t += rng.expovariate(rate)
        jobs = list(zip(prompts, delays))
        shares = [share for share in (jobs[i::self.procs] for i in range(self.procs)) if share]
        # all at once: every process opens its keep-alive connections first and all start together at
        # t_start (CLOCK_MONOTONIC: one clock for all processes); at a rate, connections open as they go
        # (a request minutes later would find its idle connection closed by the server)
        warm = not rate
        t_start = time.perf_counter() + (2.0 if warm else 0.5 if self.pool else 0.0)
        if self.pool is None:
            parts = [_client_process(port, shares[0], output_len, t_start, warm)]
        else:
            n = len(shares)
            parts = list(self.pool.map(_client_process, [port] * n, shares, [output_len] * n, [t_start] * n, [warm] * n))
        seconds = max(p["end"] for p in parts) - min(p["first"] for p in parts)  # first request sent to last token
        res = stats([x for p in parts for x in p["ttft"]], [x for p in parts for x in p["itl"]],
                    sum(p["tokens"] for p in parts), seconds, [t for p in parts for t in p["times"]])
        res["tokens_per_chunk"] = res["output_tokens"] / max(sum(p["chunks"] for p in parts), 1)
        res["client_procs"] = self.procs
        res["client_cpu_pct"] = 100 * max(p["cpu"] for p in parts) / seconds
        res["t_begin"], res["t_end"] = min(p["first"] for p in parts), max(p["end"] for p in parts)
        res["requests"] = [(*r, i) for i, p in enumerate(parts) for r in p["requests"]]  # (measure() takes it out)
        res["client_gc_ms"] = max(1e3 * p["gc_s"] for p in parts)  # the process that paused longest, in all
        res["client_gc_max_pause_ms"] = max(1e3 * p["gc_max_s"] for p in parts)
        if warm:  # the set-up's margin before the start (negative: a process was late) and its connections
            res["client_ready_ms_before_start"] = 1e3 * (t_start - max(p["ready"] for p in parts))
            res["client_connections"] = sum(p["connections"] for p in parts)
        return res

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a live process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids(pid: int) -> list[int]:
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(name))
            except OSError:
                continue
    return kids


class Server:
    """`python -m text_generator serve` in a subprocess with the engine settings of run_engine; `env`
    adds environment variables (e.g. TG_SERVE_PROFILE). http_pid / engine_pid: its two processes."""

    def __init__(self, a, path, num_prompts: int, env: dict | None = None, wait: bool = True):
        self.port = free_port()
        cmd = [sys.executable, "-m", "text_generator", "serve", path, "--port", str(self.port),
               "--served-model-name", "m", "--device", a.device, "--max-num-seqs", str(a.max_num_seqs),
               "--max-num-batched-tokens", str(a.max_num_batched_tokens), "--max-model-len",
               str(a.input_len + a.output_len + 16), "--max-queue", str(4 * num_prompts)]
        if getattr(a, "num_blocks", None):
            cmd += ["--num-blocks", str(a.num_blocks)]
        else:
            cmd += ["--gpu-memory-utilization", str(a.memory_fraction)]
        self.t0 = time.perf_counter()
        env = dict(env or {})
        self.trace = None
        if getattr(a, "trace", False):
            self.trace = env["TG_SERVE_TRACE"] = os.path.join(tempfile.mkdtemp(prefix="tg_serve_trace_"), "steps.csv")
        if getattr(a, "server_threads", None):
            env["OMP_NUM_THREADS"] = str(a.server_threads)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **env})
        self.startup_s = self.http_pid = self.engine_pid = None
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until /health answers (the model loaded and, on CUDA, the start-up pass run)."""
        import urllib.request

        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1)
                break
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited:\n{self.proc.stdout.read()[-3000:]}")
                time.sleep(1)
        self.startup_s = time.perf_counter() - self.t0  # model load + (CUDA) the engine's start-up pass
        self.http_pid = self.proc.pid
        # the engine process: multiprocessing's spawned child (not its resource tracker)
        kids = [k for k in child_pids(self.http_pid) if b"spawn_main" in open(f"/proc/{k}/cmdline", "rb").read()]
        self.engine_pid = kids[0] if kids else None

    def measure(self, clients: "ClientPool", prompts, output_len: int, rate: float | None, seed: int = 0) -> dict:
        """clients.load(...) plus the CPU % (of wall time) of the HTTP and the engine process meanwhile."""
        pids = {"http": self.http_pid, "engine_proc": self.engine_pid}
        before = {k: cpu_seconds(p) for k, p in pids.items() if p}
        steps = self.engine_steps()
        res = clients.load(self.port, prompts, output_len, rate, seed)
        requests = res.pop("requests")
        for k, c in before.items():  # (idle while the client processes get their jobs: divided by the run's time)
            res[f"{k}_cpu_pct"] = 100 * (cpu_seconds(pids[k]) - c) / res["seconds"]
        if steps is not None:
            res["engine_steps"] = self.engine_steps() - steps
        begin, end = res.pop("t_begin"), res.pop("t_end")
        if self.trace is not None:
            time.sleep(0.3)  # the engine process flushes its trace within 0.2 s of going idle
            res["phases"] = phases(read_trace(self.trace), begin, end)
            http = [r for r in read_trace(self.trace + ".http") if begin <= r[0] <= end]
            if http:  # the HTTP side of the admission: handlers began / submitted, first and last
                res["phases"]["http_first_handler_ms"] = 1e3 * (min(r[0] for r in http) - begin)
                res["phases"]["http_first_submit_ms"] = 1e3 * (min(r[1] for r in http) - begin)
                res["phases"]["http_last_submit_ms"] = 1e3 * (max(r[1] for r in http) - begin)
                # the server's clock: from the first request in the server's hands (its handler began) to the
                # last token at its client; leaves out the load generator's own start (building 512 requests
                # with the openai client, opening their connections), which the client clock counts
                res["server_clock_seconds"] = end - min(r[0] for r in http)
                res["server_clock_tokens_per_s"] = res["output_tokens"] / res["server_clock_seconds"]
            steps = [r for r in read_trace(self.trace) if begin <= r[2] <= end]
            outs = [o for o in read_trace(self.trace + ".out") if begin <= o[0] <= end + 1.0]
            res["tail"] = tail_split(steps, outs, http, requests, end)
            # every out-pipe message's read (s from the pass's start, engine step, outputs) and every request's
            # times (HTTP: handler, submitted, final read, taken, written; client: sent, first and last token,
            # closed; s from the start): to the trace file, beside the steps
            res["phases"]["http_reads"] = [(round(o[0] - begin, 6), int(o[1]), int(o[2])) for o in outs]
            by_id = {r[7]: r for r in http if len(r) > 7}
            res["phases"]["requests"] = [
                [round(t - begin, 6) if isinstance(t, float) else None for t in (*by_id[q[0]][:2], *by_id[q[0]][3:6], *q[1:5])]
                + [q[5]] for q in requests if q[0] in by_id]
        return res

    def engine_steps(self) -> int | None:
        """The server's engine steps so far (its /metrics tg_engine_steps; None for a server without it)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("tg_engine_steps "):
                    return int(float(line.split()[-1]))
        return None

    def close(self) -> None:
        # SIGINT: uvicorn shuts down, stops the engine process, then re-raises it as KeyboardInterrupt
        # (with SIGTERM it would die by the signal: no TG_SERVE_PROFILE stats would be written)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def interleaved(a, engine: EngineRow, server: Server, clients: ClientPool, passes) -> tuple[dict, dict, dict]:
    """The timed pairs: for each prompt set, an engine pass then a server pass at saturation ->
    (engine row, server row, the HTTP cost with its spread)."""
    eng, srv, paced, traces = [], [], [], []
    for i, prompts in enumerate(passes):
        eng.append(engine.run(prompts))
        srv.append(server.measure(clients, prompts, a.output_len, None))
        arrivals = srv[-1].get("phases", {}).pop("arrivals", None)
        for row in eng[-1:]:
            row.get("phases", {}).pop("arrivals", None)
        if not a.paced:
            arrivals = None
        if arrivals:  # the engine again, its requests entering when the server's engine process took them in
            paced.append(engine.run(prompts, arrivals))
            paced[-1]["phases"].pop("arrivals", None)
        for side, row in (("engine", eng[-1]), ("server", srv[-1])) + ((("engine_paced", paced[-1]),) if arrivals else ()):
            if "phases" in row:  # every step of the pass, to a file of its own (not the JSON of results)
                traces.append(dict(pair=i, side=side, seconds=row["phases"]["seconds"], fields=TRACE_FIELDS,
                                   steps=row["phases"].pop("steps"), http_reads=row["phases"].pop("http_reads", None),
                                   requests=row["phases"].pop("requests", None), request_fields=REQUEST_FIELDS))
        e, s_ = eng[-1]["output_tokens_per_s"], srv[-1]["output_tokens_per_s"]
        print(f"pair {i}: engine {e:.0f} tok/s ({eng[-1]['seconds']:.1f} s), server {s_:.0f} tok/s "
              f"({srv[-1]['seconds']:.1f} s): ratio {s_ / e:.3f}; steady (middle half) engine "
              f"{eng[-1]['steady_tokens_per_s']:.0f}, server {srv[-1]['steady_tokens_per_s']:.0f}; engine steps "
              f"{step_line(eng[-1])} against {step_line(srv[-1])}", flush=True)
        if "server_clock_tokens_per_s" in srv[-1]:
            sc = srv[-1]["server_clock_tokens_per_s"]
            print(f"  on the server's clock (from the first request in its hands): server {sc:.0f} tok/s "
                  f"({srv[-1]['server_clock_seconds']:.2f} s): ratio {sc / e:.3f}", flush=True)
        if "tail" in srv[-1]:
            print(f"  tail: {tail_line(srv[-1]['tail'])}", flush=True)
        print(f"  {client_line(srv[-1])}", flush=True)
        if "phases" in eng[-1]:
            print(f"  engine quarters: {phase_line(eng[-1]['phases'])}\n  server quarters: "
                  f"{phase_line(srv[-1].get('phases'))}", flush=True)
        if arrivals:
            p_ = paced[-1]["output_tokens_per_s"]
            print(f"  engine with the server's arrivals: {p_:.0f} tok/s ({paced[-1]['seconds']:.1f} s), {step_line(paced[-1])}: "
                  f"ratio to the engine {p_ / e:.3f}, server / it {s_ / p_:.3f}\n  its quarters: "
                  f"{phase_line(paced[-1]['phases'])}", flush=True)
        if traces:  # (after every pair: a run cut short by a time limit still leaves its pairs' traces)
            os.makedirs(os.path.dirname(a.out), exist_ok=True)
            with open(a.out + "_trace.json", "w") as f:
                json.dump(traces, f)
    cost = http_cost(eng, srv)
    if paced:  # how much of the cost the admission pattern alone explains (no HTTP in that row)
        ratios = sorted(p["output_tokens_per_s"] / e["output_tokens_per_s"] for e, p in zip(eng, paced))
        cost["paced_ratios"] = ratios
        cost["median_paced_cost"] = 1 - ratios[len(ratios) // 2]
        cost["engine_paced"] = median_run(paced)
    return median_run(eng), median_run(srv), cost


REQUEST_FIELDS = ("http handler", "http submitted", "http final read", "http final taken", "http last written",
                  "client sent", "client first token", "client last token", "client closed", "client process")
TRACE_FIELDS = ("t (s from the pass's start)", "step_s", "intake_s", "send_s", "device_wait_s", "cpu_s", "gc_s",
                "running", "waiting", "added", "outputs", "tokens", "running_before")


def step_line(row: dict) -> str:
    """A pass's engine steps and the mean wall time per step (more steps, or longer ones?)."""
    n = row.get("engine_steps")
    return "?" if not n else f"{n} ({1e3 * row['seconds'] / n:.2f} ms each)"


def http_cost(eng: list[dict], srv: list[dict]) -> dict:
    """1 - server / engine tokens/s, per interleaved pair and over the passes' medians."""
    ratios = [s["output_tokens_per_s"] / e["output_tokens_per_s"] for e, s in zip(eng, srv)]
    med = sorted(ratios)[len(ratios) // 2] if len(ratios) % 2 else \
        sum(sorted(ratios)[len(ratios) // 2 - 1:len(ratios) // 2 + 1]) / 2
    e_tps = sorted(r["output_tokens_per_s"] for r in eng)
    s_tps = sorted(r["output_tokens_per_s"] for r in srv)
    steady = [s["steady_tokens_per_s"] / e["steady_tokens_per_s"] for e, s in zip(eng, srv)]
    extra = {}
    if all("server_clock_tokens_per_s" in s for s in srv):
        sc = [s["server_clock_tokens_per_s"] / e["output_tokens_per_s"] for e, s in zip(eng, srv)]
        extra = dict(server_clock_pair_ratios=sc, median_server_clock_cost=1 - sorted(sc)[len(sc) // 2])
    return dict(**extra, pair_ratios=ratios, median_pair_cost=1 - med, steady_pair_costs=[1 - r for r in steady],
                median_steady_cost=1 - sorted(steady)[len(steady) // 2], min_pair_cost=1 - max(ratios),
                max_pair_cost=1 - min(ratios), cost_of_medians=1 - s_tps[len(s_tps) // 2] / e_tps[len(e_tps) // 2],
                engine_spread=(e_tps[-1] - e_tps[0]) / e_tps[len(e_tps) // 2],
                server_spread=(s_tps[-1] - s_tps[0]) / s_tps[len(s_tps) // 2])


def main() -> None:
    # a `timeout` (SIGTERM) still runs the finally blocks: the server subprocess and the clients stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    a = parse_args()
    path = checkpoint(a)
    g = torch.Generator().manual_seed(0)
    vocab = (TINY if a.tiny else LLAMA3_8B)["vocab_size"]

    def prompt_set():
        return [torch.randint(3, vocab, (a.input_len,), generator=g).tolist() for _ in range(a.num_prompts)]

    # fresh prompts for every pass (the prefix cache cannot help a timed pass); the untimed first pass of
    # each side runs the same load on other prompts: graphs and kernels warm on both sides alike
    warm, passes = prompt_set(), [prompt_set() for _ in range(a.repeats)]
    rate_sets = {rate: prompt_set() for rate in a.rates}
    res = dict(device=torch.cuda.get_device_name(0) if a.device != "cpu" else "cpu",
               model="tiny" if a.tiny else "Llama-3-8B-shaped, random bf16", num_prompts=a.num_prompts,
               input_len=a.input_len, output_len=a.output_len, max_num_seqs=a.max_num_seqs,
               max_num_batched_tokens=a.max_num_batched_tokens, max_model_len=a.max_model_len,
               num_blocks=a.num_blocks, cpu_count=os.cpu_count(), client_procs=a.client_procs,
               server_threads=a.server_threads, repeats=a.repeats,
               request="greedy, ignore_eos, logprobs=1, streamed (server) / LLMEngine.generate (engine)")
    res["uvicorn"] = uvicorn_stack()
    print(f"uvicorn: {res['uvicorn']}", flush=True)
    print(f"{os.cpu_count()} cores, {a.client_procs} client processes, server threads "
          f"{a.server_threads or 'inherited'}, {a.repeats} interleaved pairs of {a.num_prompts} requests, "
          f"{a.num_blocks} KV blocks per side", flush=True)
    clients = ClientPool(a.client_procs)
    server = Server(a, path, a.num_prompts, wait=False)  # loads in its own processes while this one does
    try:
        engine = EngineRow(a, path)
        engine.run(warm)  # untimed
        server.wait_ready()
        print(f"server ready in {server.startup_s:.1f} s", flush=True)
        server.measure(clients, warm, a.output_len, None)  # untimed
        res["engine"], sat, res["http_cost"] = interleaved(a, engine, server, clients, passes)
        res["server"] = {"saturation": sat}
        print("engine:", json.dumps(res["engine"]), flush=True)
        print("server saturation:", json.dumps(sat), flush=True)
        for rate, prompts in rate_sets.items():
            res["server"][k := f"rate {rate:g}/s"] = server.measure(clients, prompts, a.output_len, rate,
                                                                  seed=int(rate))
            print(f"server {k}:", json.dumps(res["server"][k]), flush=True)
        res["server_startup_s"] = server.startup_s
    finally:
        server.close()
        clients.close()
    c = res["http_cost"]
    res["http_cost_at_saturation"] = c["median_pair_cost"]
    print(f"HTTP layer costs {100 * c['median_pair_cost']:.1f}% of throughput at saturation (median of "
          f"{a.repeats} interleaved pairs; pairs {', '.join(f'{100 * (1 - r):.1f}%' for r in c['pair_ratios'])}; "
          f"medians' cost {100 * c['cost_of_medians']:.1f}%; passes spread: engine "
          f"{100 * c['engine_spread']:.1f}%, server {100 * c['server_spread']:.1f}%); over the passes' middle "
          f"halves {100 * c['median_steady_cost']:.1f}%", flush=True)
    if "median_server_clock_cost" in c:
        print(f"On the server's clock (its first request in hand to the last token at a client; the load generator's "
              f"own start left out): {100 * c['median_server_clock_cost']:.1f}% (pairs "
              f"{', '.join(f'{100 * (1 - r):.1f}%' for r in c['server_clock_pair_ratios'])})", flush=True)
    if "median_paced_cost" in c:
        print(f"The engine alone with the served passes' arrivals (no HTTP) costs {100 * c['median_paced_cost']:.1f}% "
              f"(pairs {', '.join(f'{100 * (1 - r):.1f}%' for r in c['paced_ratios'])})", flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    plot(res, a.out + ".png")


def uvicorn_stack() -> dict:
    """What `serve`'s uvicorn runs on here (its defaults, --http auto / --loop auto): the httptools C parser
    when importable (else h11, pure Python), uvloop when importable (else asyncio's loop)."""
    import importlib.util

    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return dict(http=AutoHTTPProtocol.__name__, loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
                httptools=bool(importlib.util.find_spec("httptools")))


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    names = ["engine"] + [f"server {k}" for k in res["server"]]
    rows = [res["engine"]] + list(res["server"].values())
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.bar(names, [r["output_tokens_per_s"] for r in rows])
    a.set(ylabel="output tokens / s", title="throughput")
    a.tick_params(axis="x", rotation=30)
    x = range(len(rows))
    b.plot(x, [r["ttft_ms_p50"] for r in rows], "o-", label="TTFT p50")
    b.plot(x, [r["ttft_ms_p99"] for r in rows], "o--", label="TTFT p99")
    b.plot(x, [r["itl_ms_p50"] for r in rows], "s-", label="ITL p50")
    b.plot(x, [r["itl_ms_p99"] for r in rows], "s--", label="ITL p99")
    b.set_xticks(list(x), names, rotation=30)
    b.set(ylabel="ms", yscale="log", title="latency")
    b.legend()
    fig.suptitle(f"serve vs engine: {res['model']} on {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
