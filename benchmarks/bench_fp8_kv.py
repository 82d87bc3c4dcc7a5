"""FP8 (e4m3) KV-cache decode attention against the copy bandwidth, with the bf16 cache alongside.

Llama-3-8B attention shapes (32 query / 8 KV heads, head_dim 128), pages of 16 shuffled over the
cache, one query token per request, batch 1-128 and context 512-8192. Per case and kernel:
microseconds a call (median replay of one CUDA graph running the call over several layers'
caches, so that nothing stays in L2 between calls) and

    bandwidth fraction = bytes of K/V read / time / copy bandwidth (measured in the same run)

K/V bytes: batch * context * 8 heads * 128 * 2 (K and V) * element size (1 for e4m3, 2 for bf16).
Target for FP8: >= 0.85 at the bandwidth-bound sizes (issue 25). Kernels: FlashInfer's decode
wrapper (tensor cores, planned as the decode graphs plan it; FP8: kv_data_type e4m3, k_scale and
v_scale passed to run()) and the project's Triton decode kernel (kernels/decode_attention.py, FP8:
e4m3 loads, scales through pointers). The FP8 rows also give the speed-up over the bf16 cache.

    python3 benchmarks/bench_fp8_kv.py [--out DIR] [--batches 1,8,32,64,128] [--contexts 512,2048,8192]

writes fp8_kv.json and fp8_kv.png to --out (default benchmarks/results, or $OUT when set).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
MIN_BYTES = 512 << 20  # K/V bytes a graph reads per round at least (several layers at small sizes): L2 never holds them
MAX_LAYERS = 8
FP8 = torch.float8_e4m3fn
K_SCALE, V_SCALE = 0.05, 0.02


def kv_bytes(B: int, ctx: int, dtype: torch.dtype) -> int:
    return B * ctx * KV_HEADS * HEAD_DIM * 2 * torch.empty((), dtype=dtype).element_size()


def attention_case(B: int, ctx: int, dtype: torch.dtype, bw: float, sms: int, workspace) -> dict:
    """One (batch, context, cache dtype) case: FlashInfer and Triton timings and bandwidth fractions."""
    import flashinfer

    from benchmarks.ab_gemv import graph_ms
    from model_wrapper.attention.flashinfer_backend import page_metadata
    from model_wrapper.kernels.decode_attention import decode_splits, paged_decode_attention

    per_layer = kv_bytes(B, ctx, dtype)
    layers = max(1, min(MAX_LAYERS, -(-MIN_BYTES // per_layer)))
    per = -(-ctx // PAGE)
    shape = (layers * B * per, PAGE, KV_HEADS, HEAD_DIM)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    if dtype == FP8:
        k, v = (k / K_SCALE).to(FP8), (v / V_SCALE).to(FP8)
    q = torch.randn(B, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    tables = torch.randperm(shape[0], dtype=torch.int32).view(layers, B, per)
    lens = torch.full((B,), ctx, dtype=torch.int32)
    meta = [page_metadata(tables[i], lens, PAGE) for i in range(layers)]
    scale = HEAD_DIM**-0.5
    fp8 = dtype == FP8
    run_kw = {"k_scale": K_SCALE, "v_scale": V_SCALE} if fp8 else {}
    ks = torch.tensor([K_SCALE], device="cuda")
    vs = torch.tensor([V_SCALE], device="cuda")
    wrappers = []
    for indptr, indices, last in meta:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace[len(wrappers)], "NHD", use_tensor_cores=True)
        w.plan(indptr, indices.cuda(), last, HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=torch.bfloat16,
               kv_data_type=dtype, sm_scale=scale, disable_split_kv=B * KV_HEADS >= sms)
        wrappers.append(w)
    splits = decode_splits(B, KV_HEADS, sms)
    dev = [tuple(x.cuda() for x in m) for m in meta]
    tr_kw = {"k_scale": ks, "v_scale": vs} if fp8 else {}
    fi_us = graph_ms(lambda: [w.run(q, (k, v), **run_kw) for w in wrappers]) * 1e3 / layers
    tr_us = graph_ms(lambda: [paged_decode_attention(q, k, v, *m, scale, splits=splits, **tr_kw) for m in dev]) \
        * 1e3 / layers
    diff = (paged_decode_attention(q, k, v, *dev[0], scale, splits=splits, **tr_kw).float()
            - wrappers[0].run(q, (k, v), **run_kw).float()).abs().max().item()
    del k, v
    return {"batch": B, "context": ctx, "kv_dtype": str(dtype).replace("torch.", ""), "layers": layers,
            "kv_MB": per_layer / 1e6, "splits": splits, "flashinfer_us": fi_us, "triton_us": tr_us,
            "flashinfer_of_copy_bw": per_layer / (fi_us * 1e-6) / bw, "triton_of_copy_bw": per_layer / (tr_us * 1e-6) / bw,
            "max_abs_diff_triton_vs_flashinfer": diff}


def run(batches, contexts) -> dict:
    from benchmarks.bench_forward import copy_bandwidth

    bw = copy_bandwidth("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12,
           "target_of_copy_bw": 0.85, "cases": []}
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    workspace = [torch.empty(128 << 20, dtype=torch.uint8, device="cuda") for _ in range(MAX_LAYERS)]
    for B in batches:
        for ctx in contexts:
            for dtype in (torch.bfloat16, FP8):
                r = attention_case(B, ctx, dtype, bw, sms, workspace)
                res["cases"].append(r)
                print(f"B={B:3d} ctx={ctx:5d} {r['kv_dtype']:>13s} ({r['kv_MB']:8.1f} MB K/V): FlashInfer "
                      f"{r['flashinfer_us']:8.1f} us ({r['flashinfer_of_copy_bw']:.2f} of copy bw), Triton "
                      f"{r['triton_us']:8.1f} us ({r['triton_of_copy_bw']:.2f}); max |diff| "
                      f"{r['max_abs_diff_triton_vs_flashinfer']:.4f}", flush=True)
                gc.collect()
                torch.cuda.empty_cache()
    return res


def plot(res: dict, path: str) -> None:
    from benchmarks.common import pyplot

    plt = pyplot()
    if plt is None:
        return
    contexts = sorted({r["context"] for r in res["cases"]})
    fig, axes = plt.subplots(1, len(contexts), figsize=(5.5 * len(contexts), 4.5), squeeze=False)
    for ax, ctx in zip(axes[0], contexts):
        for dtype, style in (("float8_e4m3fn", "-"), ("bfloat16", ":")):
            rows = [r for r in res["cases"] if r["context"] == ctx and r["kv_dtype"] == dtype]
            for kernel, color in (("flashinfer", "C0"), ("triton", "C1")):
                ax.plot([r["batch"] for r in rows], [r[f"{kernel}_of_copy_bw"] for r in rows], "o" + style,
                        color=color, label=f"{kernel} {dtype}")
        ax.axhline(res["target_of_copy_bw"], color="gray", ls="--", lw=1, label="target (FP8)")
        ax.set(xlabel="batch", xscale="log", ylabel="K/V bytes / time / copy bandwidth", ylim=(0, 1.2),
               title=f"decode attention, context {ctx} ({res['device']})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "results")))
    p.add_argument("--batches", default="1,8,32,64,128")
    p.add_argument("--contexts", default="512,2048,8192")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fp8_kv: needs a CUDA GPU (and flashinfer-python)", file=sys.stderr)
        return 2
    from benchmarks.ab_gemv import save_results

    res = run([int(x) for x in args.batches.split(",")], [int(x) for x in args.contexts.split(",")])
    save_results(res, args.out, "fp8_kv", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
