"""A/B of the prefill attention kernels: FlashInfer's ragged kernel over the step's own K/V (what
a prompt with nothing cached runs) against the paged kernel over the caches (the same step with
flashinfer_backend.only_own_kv answering False). Llama-3-8B-shaped bf16, batch 1, 1k-8k tokens;
CUDA-event time of one prefill (median of 6, two interleaved rounds), then kernel tables of one
step each at 1k and 4k.

    source .gpu/device-setup.sh && python3 benchmarks/ab_ragged_prefill.py > benchmarks/results/ragged_prefill.log

writes benchmarks/results/ragged_prefill.json (or $OUT/ragged_prefill.json when OUT is set).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model_wrapper.attention.flashinfer_backend as fb  # noqa: E402
from benchmarks.bench_forward import prefill_step  # noqa: E402
from benchmarks.common import LLAMA3_8B, make_random_checkpoint  # noqa: E402
from text_generator import TextGenerator  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402


def median_ms(step, n=6) -> float:
    """Median CUDA-event time of n calls of step() (after two warm-up calls)."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(n):
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    device, dtype = torch.device("cuda"), torch.bfloat16
    tmp = tempfile.TemporaryDirectory()
    make_random_checkpoint(tmp.name, LLAMA3_8B, dtype, device=device)
    gen = TextGenerator.from_pretrained(tmp.name, device=device, dtype=dtype)
    bs = 16
    kv = gen.allocate_kv_cache(8192 // bs + 8, bs)
    perm = torch.randperm(8192 // bs + 8)
    variants = (("paged", lambda batch: False), ("ragged", fb.only_own_kv))
    res = {}
    for T in (1024, 2048, 4096, 8192):
        step = prefill_step(gen, kv, bs, T, perm)
        for _ in range(2):  # interleaved rounds
            for name, rule in variants:
                fb.only_own_kv = rule
                ms = median_ms(step)
                res.setdefault(f"{T} {name}", []).append(ms)
                print(T, name, f"{ms:.2f}", flush=True)
    for k, v in res.items():
        print(f"{k:>12}: {' '.join(f'{x:.2f}' for x in v)}  best {min(v):.2f}")
    out = os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    with open(os.path.join(out, "ragged_prefill.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), median_ms=res), f, indent=1)
    for T in (1024, 4096):
        step = prefill_step(gen, kv, bs, T, perm)
        for name, rule in variants:
            fb.only_own_kv = rule
            step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            print(f"=== T={T} {name} ===")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=70))
    tmp.cleanup()


if __name__ == "__main__":
    main()
