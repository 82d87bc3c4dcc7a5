"""A/B of the decode CUDA graphs' attention: the Triton split-KV kernel (kernels/decode_attention.py,
the default) against FlashInfer's tensor-core decode wrapper (KernelConfig.triton_decode = False).
Llama-3-8B-shaped bf16 (32 / 8 heads, head_dim 128), pages of 16 shuffled, one run on one GPU:

1. the attention alone: 8 layers' caches (distinct pages), their 8 calls 4 times over in one
   graph, batch 1-128 and context 512-4096; microseconds a call and the K/V bytes read / time
   against the copy bandwidth. FlashInfer is planned as the graphs plan it (KV split only where
   the (request, KV head) pairs do not fill the SMs), Triton with cuda_graph's split rule;
2. the decode step with each (bench_forward's wall clock of 30 forward_tensor calls and the
   median replay of the captured graph), batch 1-128 at context 512 and 2048, beside the floor =
   (weights + KV read) / copy bandwidth of this run. Two interleaved rounds.

    source .gpu/device-setup.sh && python3 benchmarks/ab_decode_attention.py > benchmarks/results/decode_attention.log

writes decode_attention.json and decode_attention.png to benchmarks/results (or to $OUT when set).
"""
from __future__ import annotations

import dataclasses
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ab_gemv import decode_panels, graph_ms, run_variants, save_results
from benchmarks.bench_forward import copy_bandwidth
from benchmarks.common import LLAMA3_8B, pyplot, random_text_generator
from model_wrapper.attention.flashinfer_backend import page_metadata
from model_wrapper.kernels.decode_attention import decode_splits, paged_decode_attention

VARIANTS = {"FlashInfer decode": (False,), "Triton decode (default)": (True,)}
HEADS, KV_HEADS, HEAD_DIM, PAGE, LAYERS = 32, 8, 128, 16, 8


def graph_us(calls, reps=4) -> float:
    """Microseconds a call: median replay of one graph running calls reps times over."""
    def run():
        for _ in range(reps):
            for c in calls:
                c()

    return graph_ms(run) * 1e3 / (reps * len(calls))


def kernel_case(B, ctx, bw, sms, workspace) -> dict:
    import flashinfer

    per = -(-ctx // PAGE)
    k = torch.randn(LAYERS * B * per, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(B, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    tables = torch.randperm(k.shape[0], dtype=torch.int32).view(LAYERS, B, per)
    lens = torch.full((B,), ctx, dtype=torch.int32)
    meta = [page_metadata(tables[i], lens, PAGE) for i in range(LAYERS)]
    scale = HEAD_DIM**-0.5
    wrappers = []
    for indptr, indices, last in meta:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace[len(wrappers)], "NHD", use_tensor_cores=True)
        w.plan(indptr, indices.cuda(), last, HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=torch.bfloat16,
               kv_data_type=torch.bfloat16, sm_scale=scale, disable_split_kv=B * KV_HEADS >= sms)
        wrappers.append(w)
    splits = decode_splits(B, KV_HEADS, sms)
    dev = [tuple(x.cuda() for x in m) for m in meta]
    fi = graph_us([lambda w=w: w.run(q, (k, v)) for w in wrappers])
    tr = graph_us([lambda m=m: paged_decode_attention(q, k, v, *m, scale, splits=splits) for m in dev])
    diff = (paged_decode_attention(q, k, v, *dev[0], scale, splits=splits).float()
            - wrappers[0].run(q, (k, v)).float()).abs().max().item()
    kv_bytes = B * ctx * KV_HEADS * HEAD_DIM * 2 * 2
    return {"batch": B, "context": ctx, "splits": splits, "kv_MB": kv_bytes / 1e6, "flashinfer_us": fi,
            "triton_us": tr, "flashinfer_of_copy_bw": kv_bytes / (fi * 1e-6) / bw,
            "triton_of_copy_bw": kv_bytes / (tr * 1e-6) / bw, "max_abs_diff": diff}


def main():
    out = os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    bw = copy_bandwidth("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12,
           "kernels": [], "cases": []}
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    workspace = [torch.empty(128 << 20, dtype=torch.uint8, device="cuda") for _ in range(LAYERS)]
    for B in (1, 8, 32, 64, 128):
        for ctx in (512, 2048, 4096):
            r = kernel_case(B, ctx, bw, sms, workspace)
            res["kernels"].append(r)
            print(f"attention B={B:3d} ctx={ctx:4d} ({r['kv_MB']:7.1f} MB of K/V, {r['splits']:2d} splits): FlashInfer "
                  f"{r['flashinfer_us']:7.1f} us ({r['flashinfer_of_copy_bw']:.2f} of copy bw), Triton "
                  f"{r['triton_us']:7.1f} us ({r['triton_of_copy_bw']:.2f}); max |diff| {r['max_abs_diff']:.4f}",
                  flush=True)
            gc.collect()
            torch.cuda.empty_cache()
    del workspace

    gen = random_text_generator(LLAMA3_8B, device="cuda")
    mw = gen.model_wrapper
    block_size, num_blocks = 16, 16384
    kv = gen.allocate_kv_cache(num_blocks, block_size)
    perm = torch.randperm(num_blocks)
    weight_bytes = sum(p.numel() * p.element_size() for n, p in mw.model.named_parameters() if "embed_tokens" not in n)

    def configure(triton):
        mw.set_kernel_config(dataclasses.replace(mw.kernel_config, triton_decode=triton))

    res["cases"] = run_variants(gen, kv, perm, VARIANTS, configure, (1, 8, 32, 64, 128), (512, 2048), weight_bytes,
                                bw, block_size)
    configure(True)
    save_results(res, out, "decode_attention", plot)


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    ax = axes[0]
    for ctx in (512, 2048, 4096):
        rows = [r for r in res["kernels"] if r["context"] == ctx]
        ax.plot([r["batch"] for r in rows], [r["flashinfer_us"] / r["triton_us"] for r in rows], "o-",
                label=f"context {ctx}")
    ax.axhline(1.0, color="gray", ls="--", lw=1)
    ax.set(xlabel="batch", xscale="log", ylabel="FlashInfer time / Triton time",
           title="decode attention alone (8 layers x 4 in a graph)")
    ax.legend(fontsize=8)
    decode_panels(fig, axes[1:], res, VARIANTS, "wall_ratio", "step (30 calls) / floor (best of 2 rounds)", path)


if __name__ == "__main__":
    main()
