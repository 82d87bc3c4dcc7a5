"""The e4m3 decode attention in CUDA (kernels/e4m3_decode_cuda.py) against the Triton kernel, same run.

(Accuracy: tests/kernels/test_e4m3_decode_cuda.py, against float64 attention over the dequantized cache.)
Speed: bench_fp8_kv's cases (Llama-3-8B attention shapes, shuffled pages, a CUDA graph of one call per
   layer's cache so that nothing stays in L2), us a call and K/V bytes / time / copy bandwidth, for the Triton
   kernel at its default launch and the CUDA kernel's variants (V by cvt or bit moves, the next chunk's loads
   ahead, the splits).

    python3 benchmarks/ab_e4m3_cuda_attention.py [--out DIR] [--cases 32x2048,...]

writes e4m3_cuda_ab.json / .png to --out (default $OUT or benchmarks/results).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FP8 = torch.float8_e4m3fn
CASES = ((1, 8192), (4, 8192), (8, 8192), (16, 8192), (32, 2048), (32, 8192), (64, 2048), (64, 8192), (128, 2048),
         (128, 8192))
# paged_decode_attention_e4m3's launch arguments (default: what paged_decode_attention(cuda=True) launches, num_warps
# by launch_warps), and split_factor: times decode_splits(cuda=True)'s splits ("w4-2x": 4 warps at twice the splits,
# the launch of sessions 50 c1-c10 where the pairs do not fill the SMs)
# (session 50 also measured K / V through cp.async stages in shared memory, c5: 0.22-0.49 of copy bandwidth at every
# case; and the split merge inside the kernel by its last program, c6: slower than the merge kernel at every split
# batch, 0.66 against 0.71 at 32 x 2k; their patches in results/session50/scripts/s50c5_stages.patch.xz and
# s50c6_fused_merge.patch.xz)
VARIANTS = {"default": {}, "w4-2x": {"num_warps": 4, "split_factor": 2}, "2x": {"split_factor": 2},
            "pdl": {"pdl": True}, "bits": {"vbits": True}, "default-again": {}}


def speed(cases) -> dict:
    from benchmarks.ab_gemv import graph_ms
    from benchmarks.bench_forward import copy_bandwidth
    from benchmarks.bench_fp8_kv import HEAD_DIM, KV_HEADS, MAX_LAYERS, make_case
    from model_wrapper.kernels.decode_attention import decode_splits, paged_decode_attention
    from model_wrapper.kernels.e4m3_decode_cuda import launch_warps, paged_decode_attention_e4m3

    bw = copy_bandwidth("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    workspace = [torch.empty(128 << 20, dtype=torch.uint8, device="cuda") for _ in range(MAX_LAYERS)]
    res = {"device": torch.cuda.get_device_name(0), "copy_bandwidth_TBps": bw / 1e12, "cases": []}
    for B, ctx in cases:
        c = make_case(B, ctx, FP8, sms, workspace)
        splits = decode_splits(B, KV_HEADS, sms, FP8)
        per = c["per_layer"]
        row = {"batch": B, "context": ctx, "splits": splits}
        us = graph_ms(lambda: [paged_decode_attention(c["q"], c["k"], c["v"], *m, HEAD_DIM ** -0.5, splits=splits,
                                                      **c["tr_kw"]) for m in c["dev"]]) * 1e3 / c["layers"]
        row["triton"] = {"us": us, "of_copy_bw": per / (us * 1e-6) / bw}
        ref = paged_decode_attention(c["q"], c["k"], c["v"], *c["dev"][0], HEAD_DIM ** -0.5, splits=splits, **c["tr_kw"])
        row["cuda"] = {}
        cs = decode_splits(B, KV_HEADS, sms, FP8, cuda=True)
        for name, var in VARIANTS.items():
            kw = {"num_warps": launch_warps(B * KV_HEADS, torch.device("cuda")),
                  **{k: x for k, x in var.items() if k != "split_factor"}}
            kw["splits"] = max(1, min(16, int(cs * var.get("split_factor", 1))))
            try:
                us = graph_ms(lambda: [paged_decode_attention_e4m3(c["q"], c["k"], c["v"], *m, HEAD_DIM ** -0.5,
                                                                   c["tr_kw"]["k_scale"], c["tr_kw"]["v_scale"], **kw)
                                       for m in c["dev"]]) * 1e3 / c["layers"]
                out = paged_decode_attention_e4m3(c["q"], c["k"], c["v"], *c["dev"][0], HEAD_DIM ** -0.5,
                                                  c["tr_kw"]["k_scale"], c["tr_kw"]["v_scale"], **kw)
                row["cuda"][name] = {"us": us, "of_copy_bw": per / (us * 1e-6) / bw, "splits": kw["splits"],
                                     "max_diff_vs_triton": (out.float() - ref.float()).abs().max().item()}
            except Exception as e:  # noqa: BLE001 (reported; the other variants stand)
                row["cuda"][name] = {"error": repr(e)[:300]}
        best = max((v["of_copy_bw"], k) for k, v in row["cuda"].items() if "us" in v)
        print(f"B={B:3d} ctx={ctx:5d}: triton {row['triton']['of_copy_bw']:.3f} | best cuda {best[1]} {best[0]:.3f} | "
              + " ".join(f"{k}:{v.get('of_copy_bw', float('nan')):.3f}" for k, v in row["cuda"].items()), flush=True)
        res["cases"].append(row)
        c = None  # (frees the case before the next one)
        gc.collect()
        torch.cuda.empty_cache()
    return res


def plot(res: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = res["speed"]["cases"]
    labels = [f"{r['batch']}x{r['context']}" for r in cases]
    x = range(len(cases))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(x, [r["triton"]["of_copy_bw"] for r in cases], "o-", label="Triton (default launch)")
    ax.plot(x, [max(v.get("of_copy_bw", 0) for v in r["cuda"].values()) for r in cases], "s-", label="CUDA (best variant)")
    ax.axhline(0.85, ls="--", c="gray", label="target 0.85")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("K/V bytes / time / copy bandwidth")
    ax.set_title(f"e4m3 decode attention, {res['speed']['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--cases", default=None)
    args = ap.parse_args()
    cases = CASES if not args.cases else [tuple(int(v) for v in c.split("x")) for c in args.cases.split(",")]
    res = {"speed": speed(cases)}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "e4m3_cuda_ab.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(args.out, "e4m3_cuda_ab.png"))


if __name__ == "__main__":
    main()
