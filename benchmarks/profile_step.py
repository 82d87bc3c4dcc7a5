"""Where a step's GPU time goes: kernel table of one decode step and one 4k prefill, and the
pure replay time of a captured decode graph (no host work), on the Llama-3-8B-shaped model.

    source .gpu/device-setup.sh && python3 benchmarks/profile_step.py > profile.txt
"""

from __future__ import annotations

import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import LLAMA3_8B, random_text_generator  # noqa: E402


def step_args(B, ctx, bs, vocab):
    per = -(-ctx // bs)
    tables = torch.arange(B * per, dtype=torch.int32).view(B, per)
    pos = torch.full((B,), ctx - 1)
    slots = tables[:, (ctx - 1) // bs].to(torch.int64) * bs + (ctx - 1) % bs
    return (torch.randint(0, vocab, (B,)), pos, False, None, tables, slots,
            torch.full((B,), ctx, dtype=torch.int32), ctx + 1)


def table(prof, n=22):
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=n, max_name_column_width=70)


def main():
    bs = 16
    gen = random_text_generator(LLAMA3_8B, device="cuda", cuda_graphs=False)
    kv = gen.allocate_kv_cache(4096, bs)
    for B, ctx in ((1, 512), (32, 512)):
        args = list(step_args(B, ctx, bs, gen.vocab_size))
        args[3] = kv
        for _ in range(3):
            gen.forward_tensor(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                gen.forward_tensor(*args)
            torch.cuda.synchronize()
        print(f"=== eager decode B={B} ctx={ctx}, 5 steps ===")
        print(table(prof))
    T = 4096
    pos = torch.arange(T)
    tables = torch.arange(T // bs, dtype=torch.int32)[None]
    pargs = (torch.randint(0, gen.vocab_size, (T,)), pos, True, kv, tables,
             tables[0, pos // bs].to(torch.int64) * bs + pos % bs, torch.tensor([T], dtype=torch.int32), T)
    for _ in range(2):
        gen.forward_tensor(*pargs, lm_head_indices=torch.tensor([T - 1]))
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        gen.forward_tensor(*pargs, lm_head_indices=torch.tensor([T - 1]))
        torch.cuda.synchronize()
    print(f"=== prefill T={T} ===")
    print(table(prof, 30))

    # graph replay alone vs the whole forward_tensor call
    from model_wrapper.cuda_graph import DecodeGraphRunner

    mw = gen.model_wrapper
    mw.graphs = DecodeGraphRunner(mw, max_batch=64)
    for B in (1, 32, 64):
        args = list(step_args(B, 512, bs, gen.vocab_size))
        args[3] = kv
        for _ in range(3):
            gen.forward_tensor(*args)
        torch.cuda.synchronize()
        g = mw.graphs._graphs[next(s for s in mw.graphs.buckets if s >= B)].graph
        t0 = time.perf_counter()
        for _ in range(50):
            g.replay()
        torch.cuda.synchronize()
        replay = (time.perf_counter() - t0) / 50
        t0 = time.perf_counter()
        for _ in range(50):
            gen.forward_tensor(*args)
        torch.cuda.synchronize()
        full = (time.perf_counter() - t0) / 50
        t0 = time.perf_counter()
        for _ in range(50):
            gen.forward_tensor(*args)
        host = (time.perf_counter() - t0) / 50  # not synchronised per call: host cost when GPU-bound
        print(f"graph B={B}: replay only {replay * 1e3:.3f} ms, forward_tensor {full * 1e3:.3f} ms "
              f"(back to back, unsynchronised: {host * 1e3:.3f} ms)")
    # host time alone: forward_tensor on the CPU side with the GPU idle
    args = list(step_args(32, 512, bs, gen.vocab_size))
    args[3] = kv
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gen.forward_tensor(*args)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"host time of one graph decode call (B=32): {(t1 - t0) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
