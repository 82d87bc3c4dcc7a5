"""All-reduce of decode-sized messages: NCCL against torch's symmetric-memory one-shot and two-shot
kernels (model_wrapper/all_reduce.py), eager and inside a CUDA graph, on the GPUs of one host.

    source .gpu/device-setup.sh && NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
        torchrun --standalone --nproc-per-node 2 benchmarks/bench_allreduce.py --out benchmarks/results/allreduce
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_allreduce.py --device cpu --out /tmp/ar  # smoke (gloo)

Messages: [rows, 4096] bf16 for rows 1 .. 2048 (8 KiB .. 16 MiB: a decode step's row-parallel
outputs at batch 1-128 and prefill chunks beyond). Per method and size:
  graph  a CUDA graph of --ops all-reduces back to back (as a decode graph holds them), replayed
         --reps times; us per all-reduce = replay time / ops (CUDA events), median over replays,
         the slower rank's
  eager  the same ops launched one by one (host launch cost included)
Correctness: every method's sum equals NCCL's (the same exact-in-bf16 inputs), checked per size.
On the CPU (gloo) only "dist" runs (the symmetric-memory path falls back there): a smoke run.
Writes allreduce.json and allreduce.png to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import pyplot  # noqa: E402
from model_wrapper.all_reduce import SymmMemAllReduce  # noqa: E402

HIDDEN = 4096
ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]


def worst(x: float, device) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def time_graph(fn, x, ops: int, reps: int, device) -> float:
    """us per call of fn(x) inside a graph of `ops` calls, median over reps replays."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream(device).wait_stream(s)
    torch.cuda.synchronize(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(ops):
            fn(x)
    times = []
    for _ in range(reps + 2):
        dist.barrier()
        torch.cuda.synchronize(device)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / ops)
    del g
    return statistics.median(times[2:])


def time_eager(fn, x, ops: int, reps: int, device) -> float:
    times = []
    for _ in range(reps + 2):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(ops):
            fn(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e6 / ops)
    return statistics.median(times[2:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", default="benchmarks/results/allreduce")
    ap.add_argument("--ops", type=int, default=50, help="all-reduces per graph / timed eager run")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    rows = [int(r) for r in args.rows.split(",")]
    cuda = args.device == "cuda"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", timeout=timedelta(seconds=300), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    rank, W = dist.get_rank(), dist.get_world_size()
    dtype = torch.bfloat16
    max_bytes = max(rows) * HIDDEN * dtype.itemsize

    methods = {"dist": lambda x: dist.all_reduce(x)}
    fallback = {}
    for kind in ("one_shot", "two_shot"):
        red, why = SymmMemAllReduce.create(None, kind, max_bytes)
        if red is None:
            fallback[kind] = why
        else:
            methods[kind] = red
    if rank == 0:
        print(f"{W} ranks on {torch.cuda.get_device_name(device) if cuda else 'cpu'}; methods {list(methods)}"
              + (f"; not available: {fallback}" if fallback else ""), flush=True)

    res = dict(command="torchrun --standalone --nproc-per-node %d benchmarks/bench_allreduce.py %s"
               % (W, " ".join(sys.argv[1:])), world_size=W, torch=torch.__version__,
               device=torch.cuda.get_device_name(device) if cuda else "cpu", backend=dist.get_backend(),
               NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE"),
               TORCH_SYMM_MEM_DISABLE_MULTICAST=os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
               hidden=HIDDEN, dtype="bfloat16", ops=args.ops, reps=args.reps, unavailable=fallback, rows=[])
    for r in rows:
        g = torch.Generator(device="cpu").manual_seed(r * 100 + rank)
        base = torch.randint(-8, 8, (r, HIDDEN), generator=g).to(dtype).to(device)  # sums stay exact in bf16
        want = base.clone()
        dist.all_reduce(want)
        row = dict(rows=r, bytes=r * HIDDEN * dtype.itemsize)
        for name, fn in methods.items():
            if name == "dist":
                got = base.clone()
                dist.all_reduce(got)
                run = lambda x, fn=fn: fn(x)  # noqa: E731 - in place on x: the values grow, the time does not
            else:
                got = fn(base)
                run = fn
            row[f"{name}_equal"] = bool(torch.equal(got, want))
            x = base.clone()
            row[f"{name}_eager_us"] = worst(time_eager(run, x, args.ops, args.reps, device), device)
            if cuda:
                row[f"{name}_graph_us"] = worst(time_graph(run, x, args.ops, args.reps, device), device)
        res["rows"].append(row)
        if rank == 0:
            print("  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "allreduce.json"), "w") as f:
            json.dump(res, f, indent=1)
        report(res, list(methods), cuda)
        plot(res, list(methods), cuda, os.path.join(args.out, "allreduce.png"))
    dist.barrier()
    dist.destroy_process_group()


def report(res, methods, cuda):
    kinds = ["graph", "eager"] if cuda else ["eager"]
    head = " ".join(f"{m + ' ' + k:>18}" for k in kinds for m in methods)
    print(f"\n{'rows x 4096':>11} {'KiB':>7} {head}   (us per all-reduce, slower rank)")
    for row in res["rows"]:
        vals = " ".join(f"{row[f'{m}_{k}_us']:18.1f}" for k in kinds for m in methods)
        ok = all(row[f"{m}_equal"] for m in methods)
        print(f"{row['rows']:11d} {row['bytes'] / 1024:7.0f} {vals}   {'' if ok else 'MISMATCH'}")


def plot(res, methods, cuda, path):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r["bytes"] / 1024 for r in res["rows"]]
    for i, m in enumerate(methods):
        for k, style in (("graph", "-"), ("eager", ":")) if cuda else (("eager", "-"),):
            ax.plot(x, [r[f"{m}_{k}_us"] for r in res["rows"]], style, marker="o", color=f"C{i}", label=f"{m} {k}")
    ax.set(xscale="log", yscale="log", xlabel="message KiB (rows x 4096 bf16)", ylabel="us per all-reduce",
           title=f"all-reduce on {res['world_size']} x {res['device']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
