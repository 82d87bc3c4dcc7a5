"""Launch constants of the fused MoE kernels (kernels/moe.py) on one Qwen3-30B-A3B layer's experts.

    python3 benchmarks/sweep_moe.py --out benchmarks/results/moe_sweep.json

For each token count and each candidate (block_m, block_n, block_k, warps, stages): one layer's
fused_moe (sort + both grouped GEMMs) in a CUDA graph, median replay, against the bytes of the experts
its tokens reach (decode) or a balanced torch.bmm chain of the same shapes (prefill).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ab_gemv import graph_ms  # noqa: E402
from benchmarks.bench_forward import copy_bandwidth  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import fused_moe  # noqa: E402

H, I, E, K = 2048, 768, 128, 8
CANDIDATES = [(16, 32, 64, 4, 3), (16, 64, 64, 4, 3), (16, 64, 128, 4, 3), (16, 128, 64, 4, 3),
              (32, 64, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/moe_sweep.json")
    args = ap.parse_args()
    bw = copy_bandwidth("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    down = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    rows = []
    for T in (1, 8, 32, 128, 1024, 4096):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
        logits = torch.randn(T, E, device="cuda", generator=g)
        w, ids = torch.softmax(logits, -1).topk(K, -1)
        w = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)
        touched = ids.unique().numel()
        floor_us = touched * 3 * H * I * 2 / bw * 1e6
        n = max(1, T * K // E)
        xe, ae = torch.randn(E, n, H, device="cuda", dtype=torch.bfloat16), torch.randn(E, n, I, device="cuda",
                                                                                            dtype=torch.bfloat16)
        wg, wd = gate_up.transpose(1, 2), down.transpose(1, 2)
        chain_us = graph_ms(lambda: (torch.bmm(xe, wg), torch.bmm(ae, wd))) * 1e3
        for bm, bn, bk, warps, stages in CANDIDATES:
            cfg = dataclasses.replace(KernelConfig(), moe_small_pairs=1 << 30, moe_block_m=bm, moe_block_n=bn,
                                      moe_block_k=bk, moe_warps=warps, moe_stages=stages)
            try:
                us = graph_ms(lambda: fused_moe(x, w, ids, gate_up, down, cfg)) * 1e3
            except Exception as e:  # a tile that does not fit the SM's shared memory
                print(f"T={T} {bm, bn, bk, warps, stages}: {type(e).__name__}")
                continue
            rows.append(dict(tokens=T, block_m=bm, block_n=bn, block_k=bk, warps=warps, stages=stages, us=us,
                             floor_us=floor_us, chain_us=chain_us, experts_touched=touched))
            print(f"T={T:5d} {bm:4d} {bn:4d} {bk:4d} {warps} {stages}: {us:9.1f} us  bytes floor {floor_us:8.1f}"
                  f"  bmm chain {chain_us:8.1f}", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(0), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
