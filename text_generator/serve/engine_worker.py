"""The engine process: an LLMEngine stepping continuously, fed commands by the HTTP process
through one pipe and sending it one batch of lean outputs per step through another.

    HTTP process (engine_client.py)                      engine process (this module: main)
    ("add", [(rid, ids, params)], adapter)   ---cmd--->   drain the pipe between steps
    ("abort", rid) / ("call", id, name, args)             add_request / abort / load_adapter ...
    ("stop",)                                             step(): RequestOutputs -> pack()
                                             <--out---    ("out", columns, Stats) per step
                                                                  (pack's lists; Stats as a tuple)
                                             <--out---    ("reply", id, ok, result or (kind, message))

Only token ids and the engine's own incremental text (delta_text: the engine detokenizes, since
stop strings end requests there) cross the pipe, one message per step for all requests, never
the whole output so far: the HTTP process rebuilds each request's output from the deltas.
Every request that was submitted gets exactly one final report (an `ends` entry), also when it
is aborted before it reached the engine or when add_request refuses it.

Tensor parallelism (--tensor-parallel under torchrun): this process is rank 0 of the process
group; ranks 1..N-1 run `follow` in their torchrun processes. Each loop iteration rank 0
broadcasts the commands it read (an empty list too, at least once a second while idle, so that
the others' collectives never time out), and every rank applies them and steps the same engine
code: SPMD in lockstep, as `generate --tensor-parallel` does (model_wrapper/parallel.py), only
rank 0 sends outputs and replies.

Requests of a group with the same prompt (the n choices of one prompt) share its KV blocks
through the prefix cache: the first one (the leader) enters the engine at once, the others when
the leader's first output arrives, by which time its prompt blocks are committed to the cache.
"""

from __future__ import annotations

import os
import time
from typing import Callable, NamedTuple

from loguru import logger

from text_generator.engine.output import describe
from text_generator.serve.profiling import profiled, step_trace

ENGINE_FAILURE = "engine step failed"  # how the error of a request failed by a crashed step starts
IDLE_POLL_S = 1.0  # an idle engine wakes this often (under TP: the heartbeat to the other ranks)


class Lean(NamedTuple):
    """A final report the engine will not make (a refused add, an abort before the engine had the
    request); pack() sends it as any other. num_cached / prompt_len: as on a final output."""

    request_id: str
    new_token_ids: list[int]
    delta_text: str | None
    finish_reason: str | None  # None while running
    error: str | None = None
    num_cached: int = 0
    prompt_len: int = 0


class Stats(NamedTuple):
    """The engine after a step (for /metrics and tests): scheduler queues, KV blocks, drafts."""

    waiting: int
    running: int
    used_blocks: int  # held by live requests
    free_blocks: int  # neither held nor cached
    cached_blocks: int  # in the prefix cache only (evictable)
    num_blocks: int
    draft_tokens: int
    accepted_tokens: int
    steps: int  # engine steps run since start (a benchmark's steps per pass: more steps or longer ones)


def engine_stats(engine, waiting_followers: int = 0) -> Stats:
    bm, sched = engine.block_manager, engine.scheduler
    return Stats(len(sched.waiting) + waiting_followers, len(sched.running), bm.num_used_blocks,
                 bm.num_free_blocks, bm.num_cached_blocks, bm.num_blocks, engine.num_draft_tokens, engine.num_accepted_tokens,
                 engine.num_steps)


def pack(outputs: list, finals: list[Lean]) -> tuple:
    """One step's news -> the columns the HTTP process reads (engine_client._dispatch):

        rids     [request id]                       one entry per reported request: finals first
        new_ids  [[token id, ...]]                  its new tokens
        deltas   [str | None]                       its new text
        rows     None (nobody asked for logprobs)   or per request None / (new tokens' logprobs,
                                                    their {top id: logprob} dicts)
        ends     [(index, finish_reason, error, num_cached, prompt_len)]  the requests that finished

    Per step, in the engine process's loop (its thread is the engine's): column lists built by
    comprehensions, logprob rows sliced, one tuple per finished request only. Against one tuple of
    eight fields per request this halves the packing and shrinks the pickle (benchmarks/profile_worker.py)."""
    rids = [f.request_id for f in finals] + [o.request_id for o in outputs]
    new_ids = [f.new_token_ids for f in finals] + [o.new_token_ids for o in outputs]
    deltas = [f.delta_text for f in finals] + [o.delta_text for o in outputs]
    rows = None
    if any(o.logprobs is not None for o in outputs):
        rows = [None] * len(finals) + [None if o.logprobs is None else _new_rows(o) for o in outputs]
    k = len(finals)
    ends = [(i, f.finish_reason, f.error, f.num_cached, f.prompt_len) for i, f in enumerate(finals)]
    ends += [(k + i, o.finish_reason, o.error, o.num_cached_tokens, len(o.prompt_token_ids))
             for i, o in enumerate(outputs) if o.finished]
    return rids, new_ids, deltas, rows, ends


def _new_rows(out) -> tuple[list[float], list[dict]]:
    """The logprobs and top dicts of the tokens an output adds (slices of its lists)."""
    lps, tops = out.logprobs, out.top_logprobs or []
    end = len(out.token_ids)
    start = end - len(out.new_token_ids)
    if start == 0 and len(lps) == end == len(tops):  # (a "delta" engine's running output: the rows are its own)
        return lps, tops
    if start >= 0 and len(lps) >= end and len(tops) >= end:
        return lps[start:end], tops[start:end]
    from text_generator.serve.responses import new_logprobs  # a row without its top entries: the general rule

    rows = new_logprobs(out)
    return [lp for _, lp, _ in rows], [top for _, _, top in rows]


class EngineWorker:
    """Applies commands to one LLMEngine and steps it; `send` (rank 0) gets every message out,
    None on the other TP ranks. Owns the leader / follower bookkeeping of shared prompts."""

    def __init__(self, engine, send: Callable[[tuple], None] | None):
        self.engine = engine
        self.send = send
        self._followers: dict[str, list[tuple]] = {}  # leader id -> (rid, ids, params, adapter) waiting
        self._finals: list[Lean] = []  # finals the engine will not report (refused adds, waiting aborts)
        self.stepped_at = 0.0

    def apply(self, cmds: list[tuple]) -> bool:
        """Apply the commands in order; False once a "stop" came."""
        for cmd in cmds:
            kind = cmd[0]
            if kind == "add":
                self._add_group(cmd[1], cmd[2])
            elif kind == "abort":
                self._abort(cmd[1])
            elif kind == "call":
                self._call(*cmd[1:])
            elif kind == "stop":
                return False
        return True

    @property
    def busy(self) -> bool:
        return self.engine.has_unfinished() or bool(self._finals)

    def step(self) -> int:
        """One engine step (if anything is unfinished) and its outputs sent -> how many outputs."""
        outputs = []
        if self.engine.has_unfinished():
            try:
                outputs = self.engine.step()
            except Exception as e:  # noqa: BLE001 - a failed step fails its requests, not the server
                logger.exception("engine step failed")
                outputs = self._fail_all(f"{ENGINE_FAILURE}: {type(e).__name__}: {e}")
        self.stepped_at = time.perf_counter()  # (before packing and sending: TG_SERVE_TRACE's t_stepped)
        for out in outputs:
            self._release_followers(out.request_id)
        finals, self._finals = self._finals, []
        if self.send is not None:
            waiting = sum(map(len, self._followers.values()))
            self.send(("out", pack(outputs, finals), tuple(engine_stats(self.engine, waiting))))
        return len(outputs) + len(finals)

    # -- commands --------------------------------------------------------------------------
    def _add_group(self, items: list[tuple], adapter: str | None) -> None:
        share = self.engine.block_manager.enable_prefix_caching
        leaders: dict[tuple[int, ...], str] = {}
        for rid, ids, params in items:
            leader = leaders.setdefault(tuple(ids), rid) if share else rid
            if leader != rid:
                self._followers[leader].append((rid, ids, params, adapter))
                continue
            self._followers[rid] = []
            self._add(rid, ids, params, adapter)

    def _add(self, rid: str, ids: list[int], params, adapter: str | None) -> None:
        try:
            self.engine.add_request(ids, params, adapter=adapter, request_id=rid)
        except Exception as e:  # noqa: BLE001 - a refused request (e.g. a grammar that does not compile)
            self._finals.append(Lean(rid, [], None, "error", describe(e), prompt_len=len(ids)))
            self._release_followers(rid)

    def _release_followers(self, leader: str) -> None:
        """The leader's prompt is in the prefix cache (or it is gone): its followers enter now."""
        for item in self._followers.pop(leader, ()):
            self._add(*item)

    def _abort(self, rid: str) -> None:
        for followers in self._followers.values():
            waiting = [f for f in followers if f[0] == rid]
            if waiting:
                followers.remove(waiting[0])
                self._finals.append(Lean(rid, [], None, "abort", prompt_len=len(waiting[0][1])))
                return
        self._release_followers(rid)
        self.engine.abort(rid)  # reported by the engine's next step (nothing if it finished already)

    def _call(self, call_id: int, name: str, args: tuple) -> None:
        gen = self.engine.generator
        try:
            if name == "load_adapter":
                result = gen.load_adapter(*args)
            elif name == "unload_adapter":
                result = gen.unload_adapter(*args)
            elif name == "stats":
                result = engine_stats(self.engine, sum(map(len, self._followers.values())))._asdict()
                result["requests"] = {rid: len(r.output_ids) for rid, r in self.engine.requests.items()}
            else:
                raise ValueError(f"call: expected load_adapter / unload_adapter / stats, got {name!r}")
            reply = ("reply", call_id, True, result)
        except Exception as e:  # noqa: BLE001 - handed to the caller
            kind = "ValueError" if isinstance(e, ValueError) else "OSError" if isinstance(e, OSError) else "RuntimeError"
            reply = ("reply", call_id, False, (kind, str(e)))
        if self.send is not None:
            self.send(reply)

    def _fail_all(self, message: str) -> list:
        from text_generator.engine import RequestOutput

        rids = list(self.engine.requests) + [f[0] for fs in self._followers.values() for f in fs]
        self._followers.clear()
        for rid in rids:
            self.engine.abort(rid)
        try:
            self.engine.step()  # collects the abort reports, which nobody needs: the errors replace them
        except Exception:  # noqa: BLE001 - nothing is scheduled; a second failure changes nothing
            logger.exception("engine step after a failed step")
        return [RequestOutput(request_id=rid, prompt_token_ids=[], new_token_ids=[], token_ids=[], finished=True,
                              finish_reason="error", error=message) for rid in rids]


# -- building the engine (in the engine process and on every TP rank) -------------------------
def build_engine(args):
    """args: the parsed `serve` flags -> (LLMEngine, info dict for the HTTP process)."""
    from text_generator import TextGenerator
    from text_generator.engine import LLMEngine
    from text_generator.tokenizer import load_tokenizer

    tp = None
    if args.tensor_parallel:
        from text_generator.cli import _init_tensor_parallel

        tp = _init_tensor_parallel(args)
    tokenizer = load_tokenizer(args.model_dir)
    gen = TextGenerator.from_pretrained(args.model_dir, device=args.device, dtype=args.dtype,
                                        attention_backend=args.attention_backend, tp_group=tp,
                                        quantization=getattr(args, "quantization", None))
    loras = dict(s.split("=", 1) for s in args.lora)
    if loras or args.enable_lora:
        ranks = [adapter_rank(path) for path in loras.values()]
        gen.enable_lora(max_loras=args.max_loras or max(4, len(loras)),
                        max_rank=args.max_lora_rank or max([16, *ranks]))
        for name, path in loras.items():
            gen.load_adapter(name, path)
    max_len = min(args.max_model_len or gen.max_position_embeddings, gen.max_position_embeddings)
    drafter = None
    if args.speculative == "ngram":
        from text_generator.speculative import NgramDrafter

        drafter = NgramDrafter()
    engine = LLMEngine(gen, num_blocks=args.num_blocks or _num_blocks(gen, args, max_len),
                       block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       enable_prefix_caching=not args.no_prefix_caching, max_seq_len=max_len,
                       tokenizer=tokenizer, speculative=drafter, kv_cache_dtype=args.kv_cache_dtype,
                       output_kind="delta")  # pack() sends only each step's news: no per-step copies
    if gen.device.type == "cuda" and not getattr(args, "no_warmup", False):
        from text_generator.serve.warmup import warm_up

        warm_up(engine)  # every rank alike (it steps): graphs captured, kernels compiled before "ready"
    info = dict(vocab_size=gen.vocab_size, max_model_len=max_len, num_blocks=engine.block_manager.num_blocks,
                pid=os.getpid())
    return engine, info


def adapter_rank(path: str) -> int:
    import json

    with open(os.path.join(path, "adapter_config.json")) as f:
        return int(json.load(f).get("r", 8))


def _num_blocks(gen, args, max_len: int) -> int:
    """--gpu-memory-utilization of the GPU on CUDA (the TP ranks agree on the smallest), else room
    for --max-num-seqs sequences of max_len tokens."""
    if gen.device.type != "cuda":
        return -(-max_len // args.block_size) * args.max_num_seqs + 1
    import torch

    from kv_manager import profile_num_blocks

    n = profile_num_blocks(gen.kv_cache_spec_for(args.kv_cache_dtype), args.block_size, device=gen.device,
                           memory_fraction=args.gpu_memory_utilization, max_seq_len=max_len)
    if gen.tp_group.enabled:
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64, device=gen.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=gen.tp_group.group)
        n = int(t.item())
    return n


# -- process entry points ----------------------------------------------------------------------
def main(args, cmd_conn, out_conn, num_threads: int, on_start: Callable | None = None) -> None:
    """The engine process (multiprocessing spawn target). on_start(engine), if given, runs once
    the engine is built (instrumentation, warm-up)."""
    import signal

    import torch

    from text_generator.cli import _setup_logging

    # Ctrl-C reaches the whole process group: the HTTP process shuts down and then stops this one
    # (a "stop" command, or its pipe closing), so that no step is cut in half
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _setup_logging(getattr(args, "log_level", "WARNING"))
    # on CUDA the engine's host work is single-threaded Python: torch's intra-op threads (one per
    # core by default) only spin and take the cores of the HTTP process (an H200 host with 64 cores:
    # 1,146% CPU and half the throughput; with one thread the served rate matched the engine's). One
    # thread here even where OMP_NUM_THREADS is set (TextGenerator's host_threads default yields to it):
    # this process shares the host with the HTTP process. On the CPU: the HTTP process's count.
    on_cuda = str(args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    torch.set_num_threads(1 if on_cuda else num_threads)
    try:
        engine, info = build_engine(args)
        if on_start is not None:
            on_start(engine)
    except Exception as e:  # noqa: BLE001 - reported to the HTTP process, which refuses to start
        logger.exception("the engine could not start")
        out_conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    out_conn.send(("ready", info))
    worker = EngineWorker(engine, out_conn.send)
    broadcast = _broadcaster(engine)
    try:
        profiled("engine", _lead, worker, cmd_conn, broadcast)
    finally:
        _shutdown(engine)


def _lead(worker: EngineWorker, cmd_conn, broadcast) -> None:
    last_sync = time.monotonic()
    trace = step_trace()
    while True:
        t_loop = time.perf_counter()
        cmds = intake(cmd_conn, 0 if worker.busy else IDLE_POLL_S)
        if broadcast is not None and (cmds or worker.busy or time.monotonic() - last_sync >= IDLE_POLL_S):
            broadcast(cmds)
            last_sync = time.monotonic()
        if not worker.apply(cmds):
            return
        if trace is None:
            if worker.busy:
                worker.step()
        elif worker.busy:
            _traced_step(worker, trace, t_loop, sum(len(c[1]) for c in cmds if c[0] == "add"))
            if not worker.busy:
                trace.flush()  # idle now: a reader sees the whole pass at once


def intake(cmd_conn, timeout: float) -> list[tuple]:
    """Every command waiting in the pipe (waiting up to timeout seconds for the first): all the
    submissions that arrived during a step enter the engine together, before the next step, which
    admits as many as its budget (max_num_seqs, max_num_batched_tokens) allows. A closed pipe (the
    HTTP process is gone) reads as a "stop"."""
    cmds = []
    try:
        if cmd_conn.poll(timeout):
            cmds.append(cmd_conn.recv())
            while cmd_conn.poll():
                cmds.append(cmd_conn.recv())
    except (EOFError, OSError):
        cmds.append(("stop",))
    return cmds


def _traced_step(worker: EngineWorker, trace, t_loop: float, added: int) -> None:
    engine = worker.engine
    tokens, wait, gc0 = engine.num_scheduled_tokens, engine.device_wait_s, trace.gc.total
    running0, cpu0, t_step = len(engine.scheduler.running), time.thread_time(), time.perf_counter()
    n = worker.step()
    cpu = time.thread_time() - cpu0  # (includes the packing and the send, as t_sent does)
    sched = engine.scheduler
    trace.record(t_loop, added, t_step, worker.stepped_at, time.perf_counter(), len(sched.running), len(sched.waiting), n,
                 engine.device_wait_s - wait, cpu, trace.gc.total - gc0, engine.num_scheduled_tokens - tokens, running0,
                 engine.num_steps)


def follow(args) -> int:
    """A TP rank other than 0 (under torchrun): build the same engine, then apply rank 0's
    commands and step in lockstep until it says stop."""
    engine, _ = build_engine(args)
    worker = EngineWorker(engine, None)
    receive = _broadcaster(engine)
    try:
        while True:
            if not worker.apply(receive(None)):
                return 0
            if worker.busy:
                worker.step()
    finally:
        _shutdown(engine)


def _broadcaster(engine):
    """Under TP: cmds -> the same list on every rank (rank 0 gives it, the others pass None).
    Commands travel in a gloo group of the same ranks (made here, on every rank alike): pickled
    bytes stay on the host instead of crossing to the GPU and back through NCCL each step."""
    tp = engine.generator.tp_group
    if not tp.enabled:
        return None
    import torch.distributed as dist

    ranks = list(range(tp.world_size)) if tp.group is None else dist.get_process_group_ranks(tp.group)
    host = dist.new_group(ranks=ranks, backend="gloo")

    def broadcast(cmds):
        box = [cmds]
        dist.broadcast_object_list(box, src=ranks[0], group=host)
        return box[0]

    return broadcast


def _shutdown(engine) -> None:
    tp = engine.generator.tp_group
    if tp.enabled:
        import gc

        import torch.distributed as dist

        if dist.is_initialized():
            gc.unfreeze()  # NCCL's teardown waits for CUDA graphs that hold its collectives
            gc.collect()
            dist.destroy_process_group()
