"""Session 57 c7: is the 4k prefill's host time (c6: 34 ms before the first kernel under the profiler, aten::index on
tensors of 1-4096 elements at 3-7 ms a call) torch's CPU thread pool? The validation's CPU ops timed alone, and the
Qwen3-30B-A3B 4k / 1k prefill's wall clock, under torch's default intra-op threads and under one.

    python3 benchmarks/results/session57/scripts/s57c7_host_threads.py
"""
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402


def cpu_ops(n=200):
    T = 4096
    starts, req = torch.zeros(1, dtype=torch.int64), torch.zeros(T, dtype=torch.int64)
    bt = torch.randperm(300)[:256].view(1, 256)
    used = torch.ones(1, 256, dtype=torch.bool)
    out = {}
    for name, fn in {
        "starts[req] ([1] by [4096])": lambda: starts[req],
        "bt[used] ([1, 256] by a mask)": lambda: bt[used],
        "bt[req, kv // 16] ([1, 256] by two [4096])": lambda: bt[req, torch.arange(T) // 16],
        "repeat_interleave": lambda: torch.repeat_interleave(torch.arange(1), torch.tensor([T])),
        "unique (256)": lambda: torch.unique(bt.flatten()),
        "bincount (256)": lambda: torch.bincount(bt.flatten(), minlength=300),
    }.items():
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1e6
    return out


def main():
    from benchmarks.bench_forward import prefill_step
    from benchmarks.bench_moe import QWEN3_30B_A3B, fill_kv
    from benchmarks.common import random_text_generator

    default = torch.get_num_threads()
    print(f"torch intra-op threads {default}, interop {torch.get_num_interop_threads()}, os cpus "
          f"{len(os.sched_getaffinity(0))}, {torch.__config__.parallel_info()}", flush=True)
    for th in (default, 1):
        torch.set_num_threads(th)
        print(f"threads {th}: " + "; ".join(f"{k} {v:.1f} us" for k, v in cpu_ops().items()), flush=True)
    gen = random_text_generator(dict(QWEN3_30B_A3B), device="cuda", dtype=torch.bfloat16)
    nb = int(1.1 * 4096 // 16) + 16
    kv = gen.allocate_kv_cache(nb, 16)
    fill_kv(kv)
    perm = torch.randperm(nb)
    for th in (default, 1, default, 1):
        torch.set_num_threads(th)
        for T in (4096, 1024):
            step = prefill_step(gen, kv, 16, T, perm)
            for _ in range(2):
                step()
            walls = []
            for _ in range(6):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize()
                walls.append((time.perf_counter() - t0) * 1e3)
            print(f"threads {th} T={T}: wall ms " + " ".join(f"{w:.1f}" for w in walls), flush=True)
        print("  ops: " + "; ".join(f"{k} {v:.1f} us" for k, v in cpu_ops(50).items()), flush=True)


if __name__ == "__main__":
    main()
