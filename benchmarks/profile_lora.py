"""Where multi-LoRA decode time goes (Llama-3-8B-shaped bf16, batch 32 at 2k, rank-16 adapters on
all 7 projections, Triton kernels inside the decode CUDA graph):

    source .gpu/device-setup.sh && python3 benchmarks/profile_lora.py [--no-fold] > profile_lora.txt

Prints, for the base model and for 1 / 16 distinct adapters: the graph replay alone (GPU time, no
host work), forward_tensor synchronised per call (what bench_lora.py reports), back to back
(synchronised once per 50 calls: max(host, GPU)), the host time of one call with the GPU idle,
and kernel tables of the replayed base and 16-adapter steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from adapters import LoraManager  # noqa: E402
from benchmarks.bench_lora import DecodeBench, random_adapter  # noqa: E402
from benchmarks.common import LLAMA3_8B, make_random_checkpoint  # noqa: E402
from text_generator import TextGenerator  # noqa: E402


def measure(bench: DecodeBench, ids, n: int = 50) -> dict:
    gen = bench.gen
    for _ in range(3):
        bench.step(ids)
    torch.cuda.synchronize()
    graphs = gen.model_wrapper.graphs
    g = graphs._graphs[next(s for s in graphs.buckets if s >= bench.B)].graph
    t0 = time.perf_counter()
    for _ in range(n):
        g.replay()
    torch.cuda.synchronize()
    replay = (time.perf_counter() - t0) / n
    serial = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        bench.step(ids)
        torch.cuda.synchronize()
        serial.append(time.perf_counter() - t0)
    serial.sort()
    t0 = time.perf_counter()
    for _ in range(n):
        bench.step(ids)
    torch.cuda.synchronize()
    pipelined = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    bench.step(ids)
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dict(replay_ms=replay * 1e3, serial_ms=serial[n // 2] * 1e3, pipelined_ms=pipelined * 1e3,
                host_ms=host * 1e3)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--no-fold", action="store_true", help="keep the A stacks out of the base weights")
    args = ap.parse_args(argv)
    device, dtype = torch.device("cuda"), torch.bfloat16
    tmp = tempfile.TemporaryDirectory(prefix="profile_lora_")
    make_random_checkpoint(tmp.name, LLAMA3_8B, dtype, device=device)
    gen = TextGenerator.from_pretrained(tmp.name, device=device, dtype=dtype)
    bench = DecodeBench(gen, args.batch, args.context, 16)
    cfg = gen.config
    manager = LoraManager(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, q_size=cfg.num_heads * cfg.head_dim,
                          kv_size=cfg.num_kv_heads * cfg.head_dim, intermediate_size=cfg.intermediate_size,
                          max_loras=16, max_rank=args.rank, device=device, dtype=dtype, kernel="triton",
                          fold=False if args.no_fold else "auto")
    for a in range(16):
        manager.add_adapter(random_adapter(f"a{a}", manager, args.rank, device))
    rows = {"base": measure(bench, None)}
    kernel_table(bench, None, "base model")
    gen.model_wrapper.enable_lora(manager)  # as gen.enable_lora does: wrap, fold (where manager.folds), attach
    gen.lora_manager = manager
    for n in (1, 16):
        rows[f"{n} adapters"] = measure(bench, [f"a{i % n}" for i in range(args.batch)])
    print(f"batch {args.batch} @ {args.context}, rank {args.rank}")
    print(f"{'':>12} {'replay':>8} {'serial':>8} {'pipelined':>10} {'host':>8}   (ms)")
    for k, r in rows.items():
        print(f"{k:>12} {r['replay_ms']:8.2f} {r['serial_ms']:8.2f} {r['pipelined_ms']:10.2f} {r['host_ms']:8.2f}")
    kernel_table(bench, [f"a{i % 16}" for i in range(args.batch)],
                 f"16 adapters, A {'folded into the base GEMMs' if manager.folded else 'in shrink kernels'}")
    tmp.cleanup()


def kernel_table(bench: DecodeBench, ids, what: str) -> None:
    bench.step(ids)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            bench.step(ids)
        torch.cuda.synchronize()
    print(f"=== 5 replayed steps, {what} ===")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
