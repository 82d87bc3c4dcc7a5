"""A/B of the projections of 3-64-token steps: Triton's skinny tensor-core GEMM against cuBLAS
(Llama-3-8B-shaped bf16, CUDA graphs), in two parts, one run on one GPU:

1. per shape: 32 GEMMs of one of the model's shapes back to back in one graph (the 32 layers'
   own qkv / o / gate_up / down weights; lm_head 8 times), x of M = 4-64 tokens, cuBLAS vs the
   skinny GEMM: microseconds a GEMM and the weight bytes / time against the copy bandwidth;
2. the decode step (wall clock of 30 forward_tensor calls, bench_forward's measure, and the
   median CUDA-event time of 50 replays of the captured graph), batch 1-64, context 512 and
   2048, beside the floor = (weights + KV read) / copy bandwidth, for five variants, each adding
   one change to the one before: cuBLAS with FlashInfer's residual add + RMSNorm; the skinny
   GEMM; Triton's add + RMSNorm up to 64 tokens (it lets the next kernel launch at once);
   SiLU-and-mul in the gate_up GEMM's epilogue (kernels.gate_up_silu; also at batch 1, in the
   GEMV); FlashInfer's decode planned without KV splits where the bucket's (request, KV head)
   pairs fill the SMs (KernelConfig.unsplit_kv). Two interleaved rounds.

    source .gpu/device-setup.sh && python3 benchmarks/ab_skinny.py > benchmarks/results/skinny.log

writes skinny.json and skinny.png to benchmarks/results (or to $OUT when OUT is set).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ab_gemv import decode_panels, graph_ms, run_variants, save_results
from benchmarks.bench_forward import copy_bandwidth
from benchmarks.common import LLAMA3_8B, pyplot, random_text_generator
from model_wrapper.kernels import KernelConfig
from model_wrapper.kernels.gemm import skinny_gemm
from model_wrapper.layers.kernels import TorchKernels

VARIANTS = {  # name: (skinny_max_tokens, norm_max_tokens, gate_up + SiLU fused, unsplit_kv)
    "cuBLAS + FlashInfer norm": (KernelConfig.gemv_max_tokens, KernelConfig.gemv_max_tokens, False, False),
    "skinny + FlashInfer norm": (64, KernelConfig.gemv_max_tokens, False, False),
    "skinny + Triton norm": (64, 64, False, False),
    "+ SiLU in the GEMM": (64, 64, True, False),
    "+ unsplit KV (default)": (64, 64, True, True),
}
DEFAULT = (KernelConfig.skinny_max_tokens, KernelConfig.norm_max_tokens, True, KernelConfig.unsplit_kv)


def shape_us(weights, M, linear) -> float:
    """Microseconds a GEMM: median replay of one graph of linear(x, w) for every w in weights."""
    x = torch.randn(M, weights[0].shape[1], device="cuda", dtype=weights[0].dtype)

    def run():
        for w in weights:
            linear(x, w)

    return graph_ms(run) * 1e3 / len(weights)


def main():
    out = os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    gen = random_text_generator(LLAMA3_8B, device="cuda")
    mw = gen.model_wrapper
    block_size, num_blocks = 16, 8192
    kv = gen.allocate_kv_cache(num_blocks, block_size)
    perm = torch.randperm(num_blocks)
    weight_bytes = sum(p.numel() * p.element_size() for n, p in mw.model.named_parameters() if "embed_tokens" not in n)
    bw = copy_bandwidth("cuda")
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12,
           "weight_GB": weight_bytes / 1e9, "shapes": [], "cases": []}
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s, weights {weight_bytes / 1e9:.2f} GB", flush=True)

    layers = mw.model.model.layers
    shapes = {"qkv": [ly.self_attn.qkv_proj.weight for ly in layers], "o": [ly.self_attn.o_proj.weight for ly in layers],
              "gate_up": [ly.mlp.gate_up_proj.weight for ly in layers], "down": [ly.mlp.down_proj.weight for ly in layers],
              "lm_head": [mw.model.lm_head.weight] * 8}
    for name, ws in shapes.items():
        nbytes = ws[0].numel() * ws[0].element_size()
        for M in (4, 8, 16, 32, 64):
            row = {"shape": name, "N": ws[0].shape[0], "K": ws[0].shape[1], "tokens": M}
            for kernel, fn in (("cuBLAS", torch.nn.functional.linear), ("skinny", skinny_gemm)):
                us = shape_us(ws, M, fn)
                row[kernel + "_us"], row[kernel + "_TBps"] = us, nbytes / us / 1e6
            res["shapes"].append(row)
            print(f"{name:8s} M={M:2d}: cuBLAS {row['cuBLAS_us']:7.2f} us ({row['cuBLAS_TBps']:.2f} TB/s), skinny "
                  f"{row['skinny_us']:7.2f} us ({row['skinny_TBps']:.2f} TB/s)", flush=True)

    kernels = mw.kernels
    fused, unfused = kernels.gate_up_silu, functools.partial(TorchKernels.gate_up_silu, kernels)  # GEMM, silu_mul

    def configure(skinny_max, norm_max, silu, unsplit):
        mw.set_kernel_config(dataclasses.replace(mw.kernel_config, skinny_max_tokens=skinny_max,
                                                 norm_max_tokens=norm_max, unsplit_kv=unsplit))
        kernels.gate_up_silu = fused if silu else unfused

    res["cases"] = run_variants(gen, kv, perm, VARIANTS, configure, (1, 4, 8, 16, 32, 64), (512, 2048), weight_bytes,
                                bw, block_size)
    configure(*DEFAULT)
    save_results(res, out, "skinny", plot)


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    ax = axes[0]
    for name in ("qkv", "o", "gate_up", "down", "lm_head"):
        rows = [r for r in res["shapes"] if r["shape"] == name]
        ax.plot([r["tokens"] for r in rows], [r["cuBLAS_us"] / r["skinny_us"] for r in rows], "o-", label=name)
    ax.axhline(1.0, color="gray", ls="--", lw=1)
    ax.set(xlabel="tokens (M)", xscale="log", ylabel="cuBLAS time / skinny time",
           title="one GEMM (32 back to back in a graph)")
    ax.legend(fontsize=8)
    decode_panels(fig, axes[1:], res, VARIANTS, "replay_ratio", "graph replay / floor (best of 2 rounds)", path)


if __name__ == "__main__":
    main()
