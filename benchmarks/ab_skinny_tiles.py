"""The bf16 skinny GEMM's tile classes (kernels/gemm._skinny_config) for steps of 3-64 tokens, on one GPU:

1. --sweep: per projection shape (Qwen3-30B-A3B's qkv / o / router, Llama-3-8B's qkv / o), tokens 8 / 16 / 32 / 64:
   one GEMM per layer (distinct weights) back to back in a CUDA graph, us a GEMM for the default tile and every
   candidate (rows a program, K step, stages), cuBLAS beside, against the weight bytes' floor.
2. --steps: whole decode steps (graph replay, context 512, bench_forward's timing) with the tile rule before
   session 42 (PREVIOUS_RULE, patched in) and the current one, in alternating rounds: Qwen3-30B-A3B with bf16
   experts, then FP8 experts, then Llama-3-8B, random weights, batches 8 / 16 / 32 / 64.

    source .gpu/device-setup.sh && python3 benchmarks/ab_skinny_tiles.py --sweep --steps --out DIR

writes DIR/skinny_tiles.json and DIR/skinny_tiles.png.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import model_wrapper.kernels.gemm as gemm  # noqa: E402
from benchmarks.ab_gemv import graph_ms, save_results  # noqa: E402
from benchmarks.bench_forward import copy_bandwidth, decode_case  # noqa: E402
from benchmarks.bench_moe import QWEN3_30B_A3B, decode_floor_bytes, fill_kv, quantize_experts  # noqa: E402
from benchmarks.common import LLAMA3_8B, pyplot, random_text_generator  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402

SHAPES = {"qwen3-moe qkv": (5120, 2048, 48), "qwen3-moe o": (2048, 4096, 48), "qwen3-moe router": (128, 2048, 48),
          "llama-8b qkv": (6144, 4096, 32), "llama-8b o": (4096, 4096, 32)}  # (N, K, layers)
CANDIDATES = list(itertools.product((16, 32, 64, 128), (128, 256, 512), (3, 4), (4,)))
CURRENT_RULE = gemm._skinny_config


def PREVIOUS_RULE(BM: int, N: int, K: int) -> tuple[int, int, int, int]:
    """_skinny_config before session 42 (Llama-3-8B's sweep alone)."""
    if BM <= 16:
        return (16, 256, 6, 2) if N < 96 * 64 and K > 8192 else (64, 256, 3, 4)
    if N >= 96 * 128:
        return 128, 128, 3, 8
    if N >= 96 * 64:
        return 64, 256, 3, 4
    return (32, 512, 3, 4) if BM <= 32 else (32, 256, 4, 4)


def sweep(bw: float) -> list:
    rows = []
    for name, (N, K, L) in SHAPES.items():
        ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(L)]
        floor_us = N * K * 2 / bw * 1e6
        for M in (8, 16, 32, 64):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            bm = max(16, 1 << (M - 1).bit_length())
            row = dict(shape=name, M=M, N=N, K=K, floor_us=floor_us, current=CURRENT_RULE(bm, N, K),
                       previous=PREVIOUS_RULE(bm, N, K),
                       cublas_us=graph_ms(lambda: [F.linear(x, w) for w in ws]) * 1e3 / L, tiles=[])
            for tile in CANDIDATES:
                if tile[0] > max(16, N):
                    continue
                gemm._skinny_config = lambda *a, t=tile: t
                try:
                    us = graph_ms(lambda: [gemm.skinny_gemm(x, w) for w in ws]) * 1e3 / L
                except Exception as e:  # (a tile past the shared memory)
                    us = float("inf")
                    print(f"  {name} M={M} {tile}: {type(e).__name__}", flush=True)
                finally:
                    gemm._skinny_config = CURRENT_RULE
                row["tiles"].append(dict(tile=tile, us=us))
            us_of = {tuple(t["tile"]): t["us"] for t in row["tiles"]}
            row["current_us"], row["previous_us"] = us_of.get(row["current"]), us_of.get(row["previous"])
            best = min(row["tiles"], key=lambda t: t["us"])
            print(f"{name:17s} M={M:3d} floor {floor_us:6.2f} us  cuBLAS {row['cublas_us']:6.2f}  previous "
                  f"{row['previous']} {row['previous_us']:6.2f}  current {row['current']} {row['current_us']:6.2f}  "
                  f"best {tuple(best['tile'])} {best['us']:6.2f}", flush=True)
            rows.append(row)
        del ws
        torch.cuda.empty_cache()
    return rows


def steps(bw: float, batches=(8, 16, 32, 64), rounds: int = 2) -> list:
    out = []
    for model in ("qwen3-30b-a3b", "qwen3-30b-a3b fp8 experts", "llama-3-8b"):
        if model != "qwen3-30b-a3b fp8 experts":
            gen = kv = None
            gc.collect()
            torch.cuda.empty_cache()
            gen = random_text_generator(QWEN3_30B_A3B if model.startswith("qwen3") else LLAMA3_8B)
            kv = gen.allocate_kv_cache(int(1.1 * max(batches) * 32) + 16, 16)
            perm = torch.randperm(kv[0][0].shape[0])
        else:
            quantize_experts(gen.model_wrapper.model)
        for r in range(rounds):
            for arm, rule in (("previous", PREVIOUS_RULE), ("current", CURRENT_RULE)):
                gemm._skinny_config = rule
                gen.model_wrapper.set_kernel_config(KernelConfig())  # drops the graphs: captured under the rule
                fill_kv(kv)
                for B in batches:
                    t = decode_case(gen, kv, 16, B, 512, perm, 30) * 1e3
                    floor = (decode_floor_bytes(QWEN3_30B_A3B, B, 512, fp8_experts="fp8" in model) / bw * 1e3
                             if model.startswith("qwen3") else None)
                    out.append(dict(model=model, round=r, arm=arm, batch=B, step_ms=t, floor_ms=floor))
                    print(f"{model:26s} round {r} {arm:8s} B={B:3d}: {t:7.3f} ms"
                          + (f"  x{t / floor:.3f} floor" if floor else ""), flush=True)
        gemm._skinny_config = CURRENT_RULE
    return out


def plot(res: dict, path: str) -> None:
    plt = pyplot()
    parts = [k for k in ("sweep", "steps") if res.get(k)]
    fig, axes = plt.subplots(1, len(parts), figsize=(7 * len(parts), 4.5), squeeze=False)
    axes = dict(zip(parts, axes[0]))
    if res.get("sweep"):
        ax = axes["sweep"]
        names = [f"{r['shape']}\n{r['M']}" for r in res["sweep"]]
        for key, label in (("previous_us", "previous rule"), ("current_us", "current rule"), ("cublas_us", "cuBLAS")):
            ax.plot(range(len(names)), [r[key] / r["floor_us"] for r in res["sweep"]], "o", label=label)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set(ylabel="us / bytes floor", yscale="log", title="one GEMM (graph of one a layer)")
        ax.legend()
    if res.get("steps"):
        ax = axes["steps"]
        for model in dict.fromkeys(r["model"] for r in res["steps"]):
            rows = [r for r in res["steps"] if r["model"] == model]
            bs = sorted({r["batch"] for r in rows})
            ratio = [min(r["step_ms"] for r in rows if r["batch"] == b and r["arm"] == "current")
                     / min(r["step_ms"] for r in rows if r["batch"] == b and r["arm"] == "previous") for b in bs]
            ax.plot(bs, ratio, "o-", label=model)
        ax.axhline(1.0, color="gray", lw=1)
        ax.set(xlabel="batch", xscale="log", ylabel="step time, current / previous rule (best of rounds)",
               title="decode steps, context 512")
        ax.legend()
    fig.suptitle(f"skinny GEMM tiles on {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--steps", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    args = ap.parse_args()
    bw = copy_bandwidth("cuda")
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    res = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, copy_bandwidth_TBps=bw / 1e12)
    if args.sweep:
        res["sweep"] = sweep(bw)
    if args.steps:
        res["steps"] = steps(bw)
    save_results(res, args.out, "skinny_tiles", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
