"""Host cost of one forward_tensor call (validation, metadata, FlashInfer plan, graph inputs),
by function, for a batch-256 decode step on a Llama-3-8B-shaped model with 2 layers (the host
work does not depend on the layer count under CUDA graphs):

    source .gpu/device-setup.sh && python3 benchmarks/profile_host.py [batch] [context]
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import LLAMA3_8B, random_text_generator  # noqa: E402


def main():
    B = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 544
    bs = 16
    gen = random_text_generator(dict(LLAMA3_8B, num_hidden_layers=2), device="cuda", max_graph_batch=256)
    per = -(-ctx // bs)
    kv = gen.allocate_kv_cache(B * per + 1, bs)
    tables = torch.arange(B * per, dtype=torch.int32).view(B, per)
    pos = torch.full((B,), ctx - 1)
    slots = tables[:, (ctx - 1) // bs].to(torch.int64) * bs + (ctx - 1) % bs
    args = (torch.randint(0, gen.vocab_size, (B,)), pos, False, kv, tables, slots,
            torch.full((B,), ctx, dtype=torch.int32), ctx + 1)
    for _ in range(5):
        gen.forward_tensor(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        t = time.perf_counter()
        gen.forward_tensor(*args)
        times.append(time.perf_counter() - t)
    times.sort()
    print(f"host ms per forward_tensor, B={B} ctx={ctx}: median {times[10] * 1e3:.2f}, min {times[0] * 1e3:.2f}")
    pr = cProfile.Profile()
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(20):
        gen.forward_tensor(*args)
        torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("cumulative").print_stats(40)
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
