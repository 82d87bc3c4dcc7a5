"""Tensor parallelism (issue 8): forward_tensor at TP=1 and at TP=N on one host, in one run.

    source .gpu/device-setup.sh && NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 2 \\
        benchmarks/bench_tp.py --out benchmarks/results/tp
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_tp.py --device cpu --tiny --out /tmp/tp  # smoke

One Llama-3-8B-shaped random bf16 checkpoint (benchmarks.common.make_random_checkpoint; rank 0
writes it, every rank then loads what it needs). NCCL on CUDA (device cuda:LOCAL_RANK, NVLink
multicast off), gloo on the CPU; a gloo group carries the host-side barriers.

1. TP=1: rank 0 alone loads the whole model while the other ranks wait. Decode steps (batch
   1-128 at context 2048) with CUDA graphs, as the library runs them by default, and eagerly;
   prefill of one prompt (1k / 4k / 8k tokens). Then the correctness run (below) in bf16 and in
   an fp32 copy of the same weights (torch attention backend): the reference.
2. TP=N: every rank loads its slices; the same shapes, graphs and eager; the correctness run.

Timing: every measured step sits between a device synchronize plus a barrier of all the ranks
taking part and a device synchronize; the median of --iters steps after warm-up (a decode
step's warm-up includes its graph capture), and under TP the slower rank's median. Speedup =
TP=1 ms / TP=N ms, efficiency = speedup / N.

Correctness: one batched prefill of 4 prompts and a few teacher-forced decode steps (graph
replays at TP > 1 too), on the benchmarked model; each bf16 run's max |error| / max |fp32
logit| against the fp32 TP=1 reference. Pass: TP=N's error <= 2 x TP=1 bf16's own + 2e-3 (the
tests' bound), plus top-1 agreement and whether every rank returned the same logits.

Writes tp.json (rewritten after each phase, so a run cut short keeps what it measured) and
tp.png to --out. The GPU run takes about 3-4 minutes (mostly writing and loading 16 GB).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager, nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_forward import decode_step, prefill_step  # noqa: E402
from benchmarks.common import LLAMA3_8B, make_random_checkpoint, pyplot, tiny  # noqa: E402

BLOCK_SIZE = 16


class Ranks:
    """This process's place in the run: rank, world, device, the host-side (gloo) group."""

    def __init__(self, device: str, timeout_s: float):
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.cuda = device == "cuda"
        timeout = timedelta(seconds=timeout_s)
        if self.cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
            dist.init_process_group("nccl", timeout=timeout, device_id=self.device)
            self.host = dist.new_group(backend="gloo", timeout=timeout)
        else:
            self.device = torch.device("cpu")
            dist.init_process_group("gloo", timeout=timeout)
            self.host = None  # the default group is gloo already

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        dist.barrier(group=self.host)

    def worst(self, value: float) -> float:
        """The largest value over all ranks (each rank passes its own)."""
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host)
        return float(t)

    def agree(self, flag: bool) -> bool:
        """Rank 0's flag on every rank (a decision all ranks must take alike)."""
        obj = [flag]
        dist.broadcast_object_list(obj, src=0, group=self.host)
        return bool(obj[0])

    def say(self, *args) -> None:
        if self.rank == 0:
            print(*args, flush=True)


def median_ms(step, r: Ranks, *, iters: int, warmup: int, all_ranks: bool) -> float:
    """Median ms of step() over iters calls after warmup calls; each call timed from a
    synchronize (+ barrier of all ranks when all_ranks) to the synchronize after it."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        r.sync()
        if all_ranks:
            r.barrier()
        t0 = time.perf_counter()
        step()
        r.sync()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    return r.worst(ms) if all_ranks else ms


@contextmanager
def eager(gen):
    """Run gen's steps without its decode CUDA graphs (the cuda_graphs=False path), then restore."""
    mw = gen.model_wrapper
    saved, mw.graphs = mw.graphs, None
    try:
        yield
    finally:
        mw.graphs = saved


def time_shapes(gen, kv, perm, r: Ranks, shapes, *, all_ranks: bool, graphs: bool, prefill: bool) -> dict:
    """-> {("decode", B) or ("prefill", T): ms} for the shapes, with or without decode graphs."""
    out = {}
    with nullcontext() if graphs else eager(gen):
        for B in shapes["batches"]:
            torch.manual_seed(B)  # the same token ids on every rank
            step = decode_step(gen, kv, BLOCK_SIZE, B, shapes["context"], perm)
            out[("decode", B)] = median_ms(step, r, iters=shapes["iters"], warmup=3, all_ranks=all_ranks)
        if prefill:
            for T in shapes["prefills"]:
                torch.manual_seed(T)
                step = prefill_step(gen, kv, BLOCK_SIZE, T, perm)
                out[("prefill", T)] = median_ms(step, r, iters=shapes["prefill_iters"], warmup=1,
                                                all_ranks=all_ranks)
    return out


# -- correctness: one prefill + teacher-forced decode steps ---------------------------------

def check_inputs(cfg: dict, tiny_model: bool):
    """-> (prompts, decode_tokens [steps][batch]), the same on every rank (fixed seed)."""
    g = torch.Generator().manual_seed(1234)
    lens, steps = ((37, 5, 60, 13), 3) if tiny_model else ((517, 64, 1000, 13), 4)
    prompts = [torch.randint(0, cfg["vocab_size"], (n,), generator=g) for n in lens]
    tokens = torch.randint(0, cfg["vocab_size"], (steps, len(lens)), generator=g)
    return prompts, tokens


def check_blocks(prompts, tokens) -> int:
    return len(prompts) * -(-(max(len(p) for p in prompts) + len(tokens)) // BLOCK_SIZE)


def check_run(gen, kv, prompts, tokens) -> torch.Tensor:
    """Batched prefill (last-token logits), then one decode step per row of tokens; request b on
    blocks [b * per, (b + 1) * per). -> float32 logits [batch * (1 + steps), vocab] on the CPU."""
    B, steps = len(prompts), len(tokens)
    max_len = max(len(p) for p in prompts) + steps
    per = -(-max_len // BLOCK_SIZE)
    tables = torch.arange(B * per, dtype=torch.int32).view(B, per)

    def slots_of(b, pos):
        return tables[b, pos // BLOCK_SIZE].to(torch.int64) * BLOCK_SIZE + pos % BLOCK_SIZE

    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    pos = [torch.arange(n) for n in lens.tolist()]
    out = [gen.forward_tensor(torch.cat(prompts), torch.cat(pos), True, kv, tables,
                              torch.cat([slots_of(b, p) for b, p in enumerate(pos)]), lens, max_len,
                              lm_head_indices=torch.cumsum(lens, 0) - 1)]
    for t in range(steps):
        p = lens.to(torch.int64)
        lens = lens + 1
        out.append(gen.forward_tensor(tokens[t], p, False, kv, tables,
                                      torch.stack([slots_of(b, p[b]) for b in range(B)]), lens, max_len))
    return torch.cat(out).float().cpu()


def fp32_copy(gen):
    """The same weights in fp32 on the same device, torch attention backend, no graphs."""
    from model_wrapper import ModelWrapper
    from model_wrapper.model_wrapper import make_backend
    from model_wrapper.models.decoder import CausalLM
    from text_generator import TextGenerator

    mw = gen.model_wrapper
    with torch.device("meta"):
        model = CausalLM(mw.cfg)
    model = model.to_empty(device=mw.device).float()
    model.load_state_dict(mw.model.state_dict())
    if mw.cfg.tie_word_embeddings:
        model.tie_weights()
    model.eval().requires_grad_(False)
    backend = make_backend("torch", mw.cfg, mw.device, torch.float32)
    return TextGenerator(ModelWrapper(model, mw.cfg, backend, mw.device, torch.float32, cuda_graphs=False))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def top1(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).float().mean())


# -- the run ---------------------------------------------------------------------------------

def free(r: Ranks) -> None:
    """Give memory back after the caller dropped its references."""
    gc.collect()  # ModelWrapper <-> DecodeGraphRunner is a cycle: collect it to free the graphs
    if r.cuda:
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="shrunk model and shapes, for a CPU smoke run")
    ap.add_argument("--out", default="benchmarks/results/tp")
    ap.add_argument("--model-dir", default=None, help="checkpoint folder (reused when it matches); default: a temp dir")
    ap.add_argument("--iters", type=int, default=None, help="timed decode steps per shape (default 20; tiny 3)")
    ap.add_argument("--no-eager", action="store_true", help="skip the decode timings without CUDA graphs")
    ap.add_argument("--budget-s", type=float, default=360.0,
                    help="after this many seconds, skip the optional eager timings")
    ap.add_argument("--timeout-s", type=float, default=420.0, help="process-group timeout")
    args = ap.parse_args()
    t_start = time.monotonic()

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast (set before NCCL starts)
    r = Ranks(args.device, args.timeout_s)
    W = r.world
    if W < 2:
        raise SystemExit("bench_tp: run under torchrun --nproc-per-node N with N >= 2")
    if r.cuda and torch.cuda.device_count() < W:
        raise SystemExit(f"bench_tp: {W} ranks but {torch.cuda.device_count()} GPUs visible")
    cfg = tiny(LLAMA3_8B) if args.tiny else LLAMA3_8B
    shapes = dict(batches=[1, 8, 32, 64, 128], context=2048, prefills=[1024, 4096, 8192],
                  iters=args.iters or 20, prefill_iters=5)
    if args.tiny:
        shapes = dict(batches=[1, 4], context=128, prefills=[128, 256], iters=args.iters or 3, prefill_iters=2)
    prompts, tokens = check_inputs(cfg, args.tiny)
    num_blocks = max(max(shapes["batches"]) * -(-shapes["context"] // BLOCK_SIZE),
                     -(-max(shapes["prefills"]) // BLOCK_SIZE), check_blocks(prompts, tokens))
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))
    dtype = torch.bfloat16

    res = dict(command=f"torchrun --standalone --nproc-per-node {W} benchmarks/bench_tp.py " + " ".join(sys.argv[1:]),
               argv=sys.argv, world_size=W, torch=torch.__version__,
               device=torch.cuda.get_device_name(r.device) if r.cuda else "cpu",
               backend=dist.get_backend(), NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE"),
               model=("tiny Llama-3 shape" if args.tiny else "Llama-3-8B-shaped") + ", random bf16 weights",
               dtype="bfloat16", block_size=BLOCK_SIZE, context=shapes["context"],
               timing=(f"median of {shapes['iters']} decode / {shapes['prefill_iters']} prefill steps after "
                       "warm-up (incl. graph capture), each between synchronize + barrier of the ranks involved "
                       "and synchronize; under TP the slower rank's median"),
               seconds={})
    if r.cuda:
        v = torch.cuda.nccl.version()
        res["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        try:
            import flashinfer
            res["flashinfer"] = flashinfer.__version__
        except ImportError:
            pass

    def write():
        if r.rank == 0:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "tp.json"), "w") as f:
                json.dump(res, f, indent=1)

    # -- the checkpoint: rank 0 writes it once ------------------------------------------------
    t = time.monotonic()
    made = None
    if args.model_dir is None:
        obj = [tempfile.mkdtemp(prefix="bench_tp_") if r.rank == 0 else None]
        dist.broadcast_object_list(obj, src=0, group=r.host)
        made = model_dir = obj[0]
    else:
        model_dir = args.model_dir
    if r.rank == 0:
        make_random_checkpoint(model_dir, cfg, dtype, device=r.device)
    r.barrier()
    res["seconds"]["checkpoint"] = time.monotonic() - t
    r.say(f"checkpoint ready in {res['seconds']['checkpoint']:.0f} s: {model_dir}")

    from model_wrapper import TPGroup
    from text_generator import TextGenerator

    def load(tp):
        t = time.monotonic()
        gen = TextGenerator.from_pretrained(model_dir, device=r.device, dtype=dtype, tp_group=tp)
        kv = gen.allocate_kv_cache(num_blocks, BLOCK_SIZE)
        return gen, kv, time.monotonic() - t

    def skip_optional(label):
        over = time.monotonic() - t_start > args.budget_s
        if over:
            r.say(f"time budget ({args.budget_s:.0f} s) spent: skipping {label}")
        return over

    # -- phase 1: TP=1 on rank 0 alone --------------------------------------------------------
    single = {}
    if r.rank == 0:
        t = time.monotonic()
        gen, kv, res["seconds"]["load_tp1"] = load(None)
        has_graphs = gen.model_wrapper.graphs is not None
        res["cuda_graphs"] = has_graphs
        logits1 = check_run(gen, kv, prompts, tokens)
        single["graphs"] = time_shapes(gen, kv, perm, r, shapes, all_ranks=False, graphs=True, prefill=True)
        if has_graphs and not args.no_eager and not skip_optional("TP=1 eager decode"):
            single["eager"] = time_shapes(gen, kv, perm, r, shapes, all_ranks=False, graphs=False, prefill=False)
        del kv
        free(r)
        ref = fp32_copy(gen)
        del gen
        free(r)
        kv32 = ref.allocate_kv_cache(check_blocks(prompts, tokens), BLOCK_SIZE)
        logits32 = check_run(ref, kv32, prompts, tokens)
        del ref, kv32
        free(r)
        res["seconds"]["tp1_phase"] = time.monotonic() - t
        res["tp1_partial"] = {f"{mode} {kind} {n}": ms for mode, d in single.items() for (kind, n), ms in d.items()}
        write()
    r.barrier()
    r.say(f"TP=1 done at {time.monotonic() - t_start:.0f} s")

    # -- phase 2: TP=W on every rank ----------------------------------------------------------
    t = time.monotonic()
    gen, kv, load_s = load(TPGroup.from_default_group())
    res["seconds"]["load_tp"] = r.worst(load_s)
    has_graphs = gen.model_wrapper.graphs is not None
    logitsW = check_run(gen, kv, prompts, tokens)
    logitsW_eager = None
    if has_graphs:
        with eager(gen):
            logitsW_eager = check_run(gen, kv, prompts, tokens)
    gathered = [None] * W
    dist.all_gather_object(gathered, logitsW, group=r.host)
    multi = {"graphs": time_shapes(gen, kv, perm, r, shapes, all_ranks=True, graphs=True, prefill=True)}
    if has_graphs and not args.no_eager and not r.agree(skip_optional(f"TP={W} eager decode")):
        multi["eager"] = time_shapes(gen, kv, perm, r, shapes, all_ranks=True, graphs=False, prefill=False)
    res["seconds"]["tp_phase"] = time.monotonic() - t
    del kv, gen
    free(r)

    if r.rank == 0:
        res["decode"], res["prefill"] = table(single, multi, shapes, W)
        res["correctness"] = correctness(logits1, logitsW, logitsW_eager, logits32, gathered, prompts, tokens,
                                         args.tiny, W)
        res.pop("tp1_partial", None)
        res["seconds"]["total"] = time.monotonic() - t_start
        write()
        report(res, W)
        plot(res, W, os.path.join(args.out, "tp.png"))
    r.barrier()
    if made and r.rank == 0:
        shutil.rmtree(made, ignore_errors=True)
    dist.destroy_process_group()


def table(single, multi, shapes, W):
    """Per shape: TP=1 and TP=W ms, speedup, efficiency, tokens/s (graphs; eager beside)."""
    decode, prefill = [], []
    for B in shapes["batches"]:
        k = ("decode", B)
        a, b = single["graphs"][k], multi["graphs"][k]
        row = dict(batch=B, context=shapes["context"], tp1_ms=a, **{f"tp{W}_ms": b}, speedup=a / b,
                   efficiency=a / b / W, tp1_tokens_per_s=B / a * 1e3, **{f"tp{W}_tokens_per_s": B / b * 1e3})
        if "eager" in single:
            row["tp1_eager_ms"] = single["eager"][k]
        if "eager" in multi:
            row[f"tp{W}_eager_ms"] = multi["eager"][k]
            row[f"tp{W}_graph_gain"] = multi["eager"][k] / b  # eager ms / graph ms
        if "eager" in single and "eager" in multi:
            row["eager_speedup"] = single["eager"][k] / multi["eager"][k]
        decode.append(row)
    for T in shapes["prefills"]:
        k = ("prefill", T)
        a, b = single["graphs"][k], multi["graphs"][k]
        prefill.append(dict(tokens=T, batch=1, tp1_ms=a, **{f"tp{W}_ms": b}, speedup=a / b, efficiency=a / b / W,
                            tp1_tokens_per_s=T / a * 1e3, **{f"tp{W}_tokens_per_s": T / b * 1e3}))
    return decode, prefill


def correctness(l1, lw, lw_eager, l32, gathered, prompts, tokens, tiny_model, W):
    e1, ew = rel_err(l1, l32), rel_err(lw, l32)
    out = {
        "model": ("the benchmarked tiny model" if tiny_model else "the benchmarked Llama-3-8B-shaped model (32 layers)"),
        "reference": "fp32 copy of the same bf16 weights at TP=1, torch attention backend, no graphs",
        "inputs": (f"batched prefill of {len(prompts)} prompts ({', '.join(str(len(p)) for p in prompts)} tokens, "
                   f"last-token logits) + {len(tokens)} teacher-forced decode steps (CUDA-graph replays where "
                   "available)"),
        "rows": int(l1.shape[0]),
        "metric": "max |logits - fp32 logits| / max |fp32 logits| over all rows",
        "tp1_bf16_err": e1, f"tp{W}_bf16_err": ew,
        "bound": 2 * e1 + 2e-3, "pass": ew <= 2 * e1 + 2e-3,
        f"tp{W}_vs_tp1": rel_err(lw, l1),
        "top1_tp1_vs_fp32": top1(l1, l32), f"top1_tp{W}_vs_fp32": top1(lw, l32), f"top1_tp{W}_vs_tp1": top1(lw, l1),
        "ranks_identical": all(torch.equal(g, gathered[0]) for g in gathered),
    }
    if lw_eager is not None:
        out[f"tp{W}_eager_bf16_err"] = rel_err(lw_eager, l32)
        out[f"tp{W}_graph_vs_eager"] = rel_err(lw, lw_eager)
    return out


def report(res, W):
    print(f"\n{res['model']} on {W} x {res['device']}; decode at context {res['context']} ({res['timing']})")
    tw = f"TP={W}"
    print(f"{'decode B':>9} {'TP=1 ms':>9} {tw + ' ms':>9} {'speedup':>8} {'eff':>6} {'TP=1 tok/s':>11} "
          f"{tw + ' tok/s':>11} | {'eager TP=1':>10} {'eager ' + tw:>10} {'speedup':>8}")
    for d in res["decode"]:
        eg = (f"{d['tp1_eager_ms']:10.2f} {d[f'tp{W}_eager_ms']:10.2f} {d['eager_speedup']:8.2f}"
              if "eager_speedup" in d else f"{'-':>10} {'-':>10} {'-':>8}")
        print(f"{d['batch']:9d} {d['tp1_ms']:9.2f} {d[f'tp{W}_ms']:9.2f} {d['speedup']:8.2f} {d['efficiency']:6.2f} "
              f"{d['tp1_tokens_per_s']:11.0f} {d[f'tp{W}_tokens_per_s']:11.0f} | {eg}")
    print(f"{'prefill T':>9} {'TP=1 ms':>9} {tw + ' ms':>9} {'speedup':>8} {'eff':>6} {'TP=1 tok/s':>11} {tw + ' tok/s':>11}")
    for p in res["prefill"]:
        print(f"{p['tokens']:9d} {p['tp1_ms']:9.2f} {p[f'tp{W}_ms']:9.2f} {p['speedup']:8.2f} {p['efficiency']:6.2f} "
              f"{p['tp1_tokens_per_s']:11.0f} {p[f'tp{W}_tokens_per_s']:11.0f}")
    c = res["correctness"]
    print(f"correctness (bf16 vs fp32 reference, max rel err): TP=1 {c['tp1_bf16_err']:.4f}, "
          f"TP={W} {c[f'tp{W}_bf16_err']:.4f} (bound {c['bound']:.4f}: {'PASS' if c['pass'] else 'FAIL'}); "
          f"top-1 vs fp32 {c['top1_tp1_vs_fp32']:.2f} / {c[f'top1_tp{W}_vs_fp32']:.2f}, TP={W} vs TP=1 "
          f"{c[f'top1_tp{W}_vs_tp1']:.2f}; ranks identical: {c['ranks_identical']}"
          + (f"; graph vs eager {c[f'tp{W}_graph_vs_eager']:.4f}" if f"tp{W}_graph_vs_eager" in c else ""))
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in res["seconds"].items()), flush=True)


def plot(res, W, path):
    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    dec = res["decode"]
    x = [d["batch"] for d in dec]
    how = " (CUDA graphs)" if res.get("cuda_graphs") else ""
    a.plot(x, [d["tp1_ms"] for d in dec], "o-", color="C0", label="TP=1" + how)
    a.plot(x, [d[f"tp{W}_ms"] for d in dec], "s-", color="C1", label=f"TP={W}" + how)
    if "eager_speedup" in dec[0]:
        a.plot(x, [d["tp1_eager_ms"] for d in dec], "o--", color="C0", alpha=0.5, label="TP=1 eager")
        a.plot(x, [d[f"tp{W}_eager_ms"] for d in dec], "s--", color="C1", alpha=0.5, label=f"TP={W} eager")
    for d in dec:
        a.annotate(f"x{d['speedup']:.2f}", (d["batch"], d[f"tp{W}_ms"]), textcoords="offset points", xytext=(0, -12),
                   ha="center", fontsize=8)
    a.set(xlabel="batch (requests)", ylabel="ms / decode step", xscale="log",
          title=f"decode at context {res['context']} (labels: speedup)")
    a.set_xticks(x, [str(v) for v in x], minor=False)
    a.minorticks_off()
    a.legend(fontsize=8)
    pre = res["prefill"]
    x = [p["tokens"] for p in pre]
    b.plot(x, [p["tp1_ms"] for p in pre], "o-", label="TP=1")
    b.plot(x, [p[f"tp{W}_ms"] for p in pre], "s-", label=f"TP={W}")
    for p in pre:
        b.annotate(f"x{p['speedup']:.2f}", (p["tokens"], p[f"tp{W}_ms"]), textcoords="offset points",
                   xytext=(0, -12), ha="center", fontsize=8)
    b.set(xlabel="prompt tokens (batch 1)", ylabel="ms / prefill", xscale="log", yscale="log", title="prefill")
    b.set_xticks(x, [str(v) for v in x])
    b.minorticks_off()
    b.legend()
    fig.suptitle(f"{res['model']}: TP=1 vs TP={W} on {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 - report, then leave at once
        # A normal exit would tear NCCL down, which waits for every CUDA graph holding its
        # collectives (the traceback keeps them alive): exit now, and torchrun stops the others.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
