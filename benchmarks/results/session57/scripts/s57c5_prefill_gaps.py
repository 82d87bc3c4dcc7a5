"""Session 57 c5: where the Qwen3-30B-A3B 4k prefill's wall clock goes beyond its GPU time (c4: 84-101 ms a call
against 59-69 ms of kernels). Per layer count: wall ms per call, the caching allocator's counters over the timed
calls (alloc retries: an allocation that failed, freed the cache (cudaFree, a device sync) and tried again; device
allocs / frees), and one profiled call with CPU activity: the GPU's span (first kernel start to last end) against
its busy time, and the CPU's CUDA runtime calls by total time.

    python3 benchmarks/results/session57/scripts/s57c5_prefill_gaps.py --layers 48,24 [--fp8]
"""
import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from benchmarks.bench_forward import prefill_step  # noqa: E402
from benchmarks.bench_moe import QWEN3_30B_A3B, fill_kv  # noqa: E402
from benchmarks.common import random_text_generator  # noqa: E402


def counters():
    s = torch.cuda.memory_stats()
    return {k: s.get(k, 0) for k in ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms",
                                     "num_sync_all_streams")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="48,24")
    ap.add_argument("--tokens", default="4096,1024")
    args = ap.parse_args()
    for L in (int(x) for x in args.layers.split(",")):
        cfg = dict(QWEN3_30B_A3B, num_hidden_layers=L)
        gen = random_text_generator(cfg, device="cuda", dtype=torch.bfloat16)
        nb = int(1.1 * 4096 // 16) + 16
        kv = gen.allocate_kv_cache(nb, 16)
        fill_kv(kv)
        perm = torch.randperm(nb)
        free, total = torch.cuda.mem_get_info()
        print(f"layers {L}: {torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated, {free / 2**30:.1f} GiB free "
              f"of {total / 2**30:.1f}", flush=True)
        for T in (int(x) for x in args.tokens.split(",")):
            step = prefill_step(gen, kv, 16, T, perm)
            for _ in range(2):
                step()
            torch.cuda.synchronize()
            c0 = counters()
            walls = []
            for _ in range(6):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                step()
                torch.cuda.synchronize()
                walls.append((time.perf_counter() - t0) * 1e3)
            c1 = counters()
            print(f"  T={T}: wall ms {' '.join(f'{w:.1f}' for w in walls)}; allocator over 6 calls: "
                  + ", ".join(f"{k} +{c1[k] - c0[k]}" for k in c0), flush=True)
            from torch.profiler import ProfilerActivity, profile
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3
            ev = prof.events()
            gpu = sorted((e.time_range.start, e.time_range.end) for e in ev
                         if e.device_type == torch.autograd.DeviceType.CUDA)
            busy = sum(b - a for a, b in gpu) / 1e3
            span = (gpu[-1][1] - gpu[0][0]) / 1e3 if gpu else 0.0
            gaps = sorted(((gpu[i + 1][0] - gpu[i][1]) / 1e3, i) for i in range(len(gpu) - 1))[-5:]
            print(f"  T={T} profiled: wall {wall:.1f} ms, GPU span {span:.1f} ms, busy {busy:.1f} ms, "
                  f"{len(gpu)} GPU records; largest gaps (ms) {[round(g, 2) for g, _ in gaps]}", flush=True)
            rt = {}
            for e in ev:
                if e.device_type == torch.autograd.DeviceType.CPU and (e.name.startswith("cuda") or e.name in (
                        "aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::to", "aten::copy_")):
                    n, t = rt.get(e.name, (0, 0.0))
                    rt[e.name] = (n + 1, t + (e.time_range.end - e.time_range.start) / 1e3)
            for name, (n, t) in sorted(rt.items(), key=lambda kv: -kv[1][1])[:12]:
                print(f"    cpu {name:40s} {n:6d} calls {t:9.2f} ms", flush=True)
            top = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            print(top, flush=True)
        del gen, kv
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
