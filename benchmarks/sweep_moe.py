"""Launch constants of the fused MoE kernels (kernels/moe*.py) on one Qwen3-30B-A3B layer's experts, the
previous path beside the current one in the same run.

    python3 benchmarks/sweep_moe.py --out benchmarks/results/moe_sweep.json

For each token count: one layer's fused_moe in a CUDA graph, median replay, against the bytes of the experts
its tokens reach (bf16, and e4m3 + scales) and a balanced torch.bmm chain of the same shapes. Rows:
  old          the previous path: torch-ops sort (about eight kernels) and the grouped GEMMs at every size
  new          KernelConfig() as it stands (decode path at few pairs, fused align above)
  new-fp8      the same on e4m3 experts with per-row, 128-column scales
  decode       the decode path forced (every token count up to 32: where it stops paying)
  tile         candidate tilings of the path the default takes at that size (decode tiles up to 8 tokens,
               grouped-GEMM tiles above, with the fused align)
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
from benchmarks.bench_moe import OLD_MOE, quantize_fp8_blockwise  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import fused_moe, takes_decode_path  # noqa: E402

H, I, E, K = 2048, 768, 128, 8
# grouped GEMM: (block_m, block_n, block_k, warps, stages)
CANDIDATES = [(16, 32, 64, 4, 3), (16, 64, 64, 4, 3), (16, 64, 128, 4, 3), (16, 128, 64, 4, 3),
              (32, 64, 64, 4, 3), (64, 64, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4)]
# decode path: (gate_up block_n, block_k, down block_n, down block_k, warps, stages)
DECODE_CANDIDATES = [(16, 256, 8, 128, 4, 3), (8, 256, 8, 128, 4, 3), (16, 128, 16, 64, 4, 3),
                     (32, 256, 8, 128, 4, 3), (16, 512, 8, 256, 8, 2), (8, 512, 4, 256, 4, 2),
                     (16, 256, 8, 128, 2, 3), (16, 256, 8, 128, 8, 4), (32, 128, 4, 128, 4, 4)]
FORCE_DECODE = dict(moe_decode_pairs=1 << 30, moe_decode_pairs_per_expert=1 << 30)


def expert_bytes(fp8: bool) -> float:
    """Bytes of one expert: its weights (2 or 1 a weight) and, for FP8, the float32 scales."""
    if not fp8:
        return 3 * H * I * 2
    return 3 * H * I + (2 * I * -(-H // 128) + H * -(-I // 128)) * 4


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/moe_sweep.json")
    args = ap.parse_args()
    bw = copy_bandwidth("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    down = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    (gq, gs), (dq, ds) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    default = KernelConfig()
    rows = []

    def measure(T, name, cfg, floor_us, chain_us, touched, fp8=False, **extra):
        wts = dict(gate_up_scale=gs, down_scale=ds) if fp8 else {}
        gu, dn = (gq, dq) if fp8 else (gate_up, down)
        try:
            us = graph_ms(lambda: fused_moe(x, w, ids, gu, dn, cfg, **wts)) * 1e3
        except Exception as e:  # a tile that does not fit the SM's shared memory or registers
            print(f"T={T} {name} {extra}: {type(e).__name__}")
            return
        rows.append(dict(tokens=T, variant=name, us=us, floor_us=floor_us, ratio=us / floor_us, chain_us=chain_us,
                         experts_touched=touched, **extra))
        print(f"T={T:5d} {name:8s} {us:9.1f} us  floor {floor_us:8.1f}  x{us / floor_us:5.2f}  bmm chain "
              f"{chain_us:8.1f}  {extra if extra else ''}", flush=True)

    for T in (1, 2, 4, 8, 16, 32, 128, 1024, 4096):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
        logits = torch.randn(T, E, device="cuda", generator=g)
        w, ids = torch.softmax(logits, -1).topk(K, -1)
        w = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)
        touched = ids.unique().numel()
        floor, floor8 = (touched * expert_bytes(f) / bw * 1e6 for f in (False, True))
        n = max(1, T * K // E)
        xe = torch.randn(E, n, H, device="cuda", dtype=torch.bfloat16)
        ae = torch.randn(E, n, I, device="cuda", dtype=torch.bfloat16)
        wg, wd = gate_up.transpose(1, 2), down.transpose(1, 2)
        chain_us = graph_ms(lambda: (torch.bmm(xe, wg), torch.bmm(ae, wd))) * 1e3
        measure(T, "old", OLD_MOE, floor, chain_us, touched)
        measure(T, "new", default, floor, chain_us, touched)
        measure(T, "new-fp8", default, floor8, chain_us, touched, fp8=True)
        if T <= 32 and not takes_decode_path(T * K, E, default):
            measure(T, "decode", dataclasses.replace(default, **FORCE_DECODE), floor, chain_us, touched)
        if takes_decode_path(T * K, E, default):
            for bn, bk, dbn, dbk, warps, stages in DECODE_CANDIDATES:
                cfg = dataclasses.replace(default, moe_decode_block_n=bn, moe_decode_block_k=bk,
                                          moe_decode_down_block_n=dbn, moe_decode_down_block_k=dbk,
                                          moe_decode_warps=warps, moe_decode_stages=stages)
                tile = dict(block_n=bn, block_k=bk, down_block_n=dbn, down_block_k=dbk, warps=warps, stages=stages)
                measure(T, "tile", cfg, floor, chain_us, touched, **tile)
                measure(T, "tile-fp8", cfg, floor8, chain_us, touched, fp8=True, **tile)
        else:
            for bm, bn, bk, warps, stages in CANDIDATES:
                cfg = dataclasses.replace(default, moe_small_pairs=1 << 30, moe_block_m=bm, moe_block_n=bn,
                                          moe_block_k=bk, moe_warps=warps, moe_stages=stages)
                tile = dict(block_m=bm, block_n=bn, block_k=bk, warps=warps, stages=stages)
                measure(T, "tile", cfg, floor, chain_us, touched, **tile)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(0), bandwidth_TBps=bw / 1e12, rows=rows), f, indent=1)
    print("\nold -> new (us), one layer's experts:")
    for T in sorted({r["tokens"] for r in rows}):
        by = {r["variant"]: r for r in rows if r["tokens"] == T and r["variant"] in ("old", "new", "new-fp8")}
        if len(by) == 3:
            print(f"T={T:5d}  old {by['old']['us']:8.1f}  new {by['new']['us']:8.1f} (x{by['new']['ratio']:.2f} floor)"
                  f"  fp8 {by['new-fp8']['us']:8.1f} (x{by['new-fp8']['ratio']:.2f} its floor)")


if __name__ == "__main__":
    main()
