"""The attention's RoPE + K/V store step of a prefill, alone, per layer: the fused Triton kernel
(kernels/kv_store.rope_store_kv, q / k norms inside it for Qwen3) at several tokens a program, against the
unfused chain the decoder runs past KernelConfig.rope_store_max_tokens (Qwen3: FlashInfer's RMSNorm on q and on
k, copies of the strided heads first; FlashInfer's RoPE; the store kernel). Each in a CUDA graph, median replay.

    source .gpu/device-setup.sh && python3 benchmarks/ab_rope_store.py --out benchmarks/results/rope_store

Shapes: Llama-3-8B (32 q / 8 kv heads, no q / k norm), Qwen3-30B-A3B (32 / 4, norms), Qwen3-8B (32 / 8, norms);
head_dim 128, bf16 cache. Each fused row's q and cache are compared with the unfused chain's (max |diff|: the
norms round in different places, so not zero with norms).
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
from model_wrapper.attention.kv_store import KVStore  # noqa: E402
from model_wrapper.forward_batch import ForwardBatch  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402

SHAPES = {"llama3-8b": (32, 8, False), "qwen3-30b-a3b": (32, 4, True), "qwen3-8b": (32, 8, True)}
D, BLOCK = 128, 16


def batch_for(T: int, slots: torch.Tensor) -> ForwardBatch:
    per = -(-T // BLOCK)
    return ForwardBatch.build(
        input_ids=torch.zeros(T, dtype=torch.int64), input_ids_cpu=torch.zeros(T, dtype=torch.int64),
        positions=torch.arange(T), slots=slots, is_prefill=True, block_size=BLOCK,
        q_lens_cpu=torch.tensor([T], dtype=torch.int32), seq_lens_cpu=torch.tensor([T], dtype=torch.int32),
        block_tables_cpu=torch.arange(per, dtype=torch.int32)[None], lm_head_indices=None, spec_mask=None,
        atten_mask=None, device=torch.device("cuda"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/rope_store")
    ap.add_argument("--tokens", default="512,1024,2048,4096,8192")
    ap.add_argument("--block-t", default="1,8:4,16:4,32:4,64:4,32:8",
                    help="the fused kernel's launches: 1 = a program a token and head (the decode kernel), "
                    "BT:WARPS = a program a head and BT tokens (rope_store_block_t, rope_rows_warps)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    from model_wrapper.layers.kernels import FlashInferKernels

    dev, dt = torch.device("cuda"), torch.bfloat16
    tokens = [int(t) for t in args.tokens.split(",")]
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, D, 2, dtype=torch.float32, device=dev) / D))
    fi = FlashInferKernels(inv_freq, dt, max(tokens), KernelConfig())
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for shape in args.shapes.split(","):
        hq, hk, norm = SHAPES[shape]
        qw, kw = (1 + 0.1 * torch.randn(D, device=dev, generator=g)).to(dt), (1 + 0.1 * torch.randn(D, device=dev, generator=g)).to(dt)
        for T in tokens:
            nb = -(-T // BLOCK)
            caches = [torch.zeros(nb, BLOCK, hk, D, device=dev, dtype=dt) for _ in range(2)]
            slots = (torch.randperm(nb, device=dev)[:, None] * BLOCK + torch.arange(BLOCK, device=dev)).flatten()[:T]
            batch = batch_for(T, slots.cpu())
            pos = torch.arange(T, device=dev)
            src = torch.randn(T, (hq + 2 * hk) * D, device=dev, generator=g).to(dt) * 3
            qkv = src.clone()

            def unfused():
                q, k, v = qkv.split([hq * D, hk * D, hk * D], dim=-1)
                q, k, v = q.reshape(T, hq, D), k.reshape(T, hk, D), v.reshape(T, hk, D)
                if norm:
                    q, k = fi.rms_norm(q, qw, 1e-6), fi.rms_norm(k, kw, 1e-6)
                q, k = fi.rope(q, k, pos)
                store.write(caches, k, v, batch)
                return q

            # the first call of each on src for the comparison; then replays in place (a rotation keeps a row's
            # norm, the q / k norms its rms: the values stay of one size)
            store = KVStore(triton=True, rope_table=fi.cos_sin_cache, config=KernelConfig())
            q_ref = unfused().clone()
            kc_ref = caches[0].clone()
            us = graph_ms(unfused) * 1e3
            rows.append(dict(shape=shape, tokens=T, variant="unfused", us=us))
            print(f"{shape:14s} T={T:5d} {'unfused':16s} {us:8.1f} us", flush=True)
            for spec in args.block_t.split(","):
                bt, warps = (int(x) for x in spec.split(":")) if ":" in spec else (int(spec), 4)
                cfg = dataclasses.replace(KernelConfig(), rope_store_max_tokens=1 << 30, rope_store_block_t=bt,
                                          rope_rows_warps=warps, rope_store_block_t_min_tokens=1 if bt > 1 else 1 << 30)
                label = "fused, a token" if bt == 1 else f"fused, {bt}x{warps}w"
                fstore = KVStore(triton=True, rope_table=fi.cos_sin_cache, config=cfg)

                def fused():
                    fstore.rope_write(caches, qkv, pos, hq, hk, D, slots, qk_norm=(qw, kw, 1e-6) if norm else None)

                qkv.copy_(src)
                fused()
                dq = (qkv[:, :hq * D].float() - q_ref.reshape(T, -1).float()).abs().max().item()
                dk = (caches[0].float() - kc_ref.float()).abs().max().item()
                us = graph_ms(fused) * 1e3
                rows.append(dict(shape=shape, tokens=T, variant=label, block_t=bt, warps=warps, us=us, max_diff_q=dq,
                                 max_diff_k_cache=dk))
                print(f"{shape:14s} T={T:5d} {label:16s} {us:8.1f} us  (|dq| {dq:.2e}, |dk| {dk:.2e})", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rope_store.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(0), rows=rows), f, indent=1)
    plot(rows, os.path.join(args.out, "rope_store.png"))


def plot(rows, path):
    from benchmarks.common import pyplot

    plt = pyplot()
    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 3.6), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for v in sorted({r["variant"] for r in rows if r["shape"] == shape}):
            rs = [r for r in rows if r["shape"] == shape and r["variant"] == v]
            ax.plot([r["tokens"] for r in rs], [r["us"] for r in rs], marker="o", label=v)
        ax.set(xscale="log", yscale="log", xlabel="prefill tokens", ylabel="us a layer", title=shape)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
