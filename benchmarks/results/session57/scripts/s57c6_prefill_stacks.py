"""Session 57 c6: the Qwen3-30B-A3B 4k prefill (eager, 48 layers): the host's aten::index calls (c5: 7 calls, 25 ms of
host time, no GPU time) with their shapes and Python stacks, the host's time before the first kernel starts, and the
GPU's idle stretches over 0.2 ms with the kernels around them.

    python3 benchmarks/results/session57/scripts/s57c6_prefill_stacks.py
"""
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from benchmarks.bench_forward import prefill_step  # noqa: E402
from benchmarks.bench_moe import QWEN3_30B_A3B, fill_kv  # noqa: E402
from benchmarks.common import random_text_generator  # noqa: E402


def main():
    gen = random_text_generator(dict(QWEN3_30B_A3B), device="cuda", dtype=torch.bfloat16)
    nb = int(1.1 * 4096 // 16) + 16
    kv = gen.allocate_kv_cache(nb, 16)
    fill_kv(kv)
    perm = torch.randperm(nb)
    step = prefill_step(gen, kv, 16, 4096, perm)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True, with_stack=True) as prof:
        step()
        torch.cuda.synchronize()
    ev = list(prof.events())
    cpu0 = min(e.time_range.start for e in ev if e.device_type == torch.autograd.DeviceType.CPU)
    gpu = sorted((e.time_range.start, e.time_range.end, e.name) for e in ev
                 if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"first kernel starts {(gpu[0][0] - cpu0) / 1e3:.2f} ms after the call's first host op; GPU span "
          f"{(gpu[-1][1] - gpu[0][0]) / 1e3:.2f} ms, busy {sum(b - a for a, b, _ in gpu) / 1e3:.2f} ms", flush=True)
    for i in range(len(gpu) - 1):
        gap = (gpu[i + 1][0] - gpu[i][1]) / 1e3
        if gap > 0.2:
            print(f"  idle {gap:6.2f} ms at {(gpu[i][1] - cpu0) / 1e3:7.2f} ms after {gpu[i][2][:60]} before "
                  f"{gpu[i + 1][2][:60]}", flush=True)
    for e in ev:
        if e.device_type == torch.autograd.DeviceType.CPU and e.name in ("aten::index", "aten::nonzero", "aten::item",
                                                                           "aten::mm", "aten::copy_"):
            dur = (e.time_range.end - e.time_range.start) / 1e3
            if dur > 0.3:
                st = [s for s in e.stack if "site-packages" not in s][:6]
                print(f"{e.name} {dur:7.2f} ms at {(e.time_range.start - cpu0) / 1e3:7.2f} ms shapes "
                      f"{e.input_shapes}\n    " + "\n    ".join(st), flush=True)


if __name__ == "__main__":
    main()
