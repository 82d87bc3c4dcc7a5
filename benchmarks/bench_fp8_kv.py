"""FP8 (e4m3) KV-cache decode attention against the copy bandwidth, with the bf16 cache alongside.

Llama-3-8B attention shapes (32 query / 8 KV heads, head_dim 128), pages of 16 shuffled over the
cache, one query token per request, batch 1-128 and context 512-8192. Per case and kernel:
microseconds a call (median replay of one CUDA graph running the call over several layers'
caches, so that nothing stays in L2 between calls) and

    bandwidth fraction = bytes of K/V read / time / copy bandwidth (measured in the same run)

K/V bytes: batch * context * 8 heads * 128 * 2 (K and V) * element size (1 for e4m3, 2 for bf16).
Target for FP8: >= 0.85 at the bandwidth-bound sizes (issue 25). Kernels: FlashInfer's decode
wrapper (tensor cores, planned as the decode graphs plan it; FP8: kv_data_type e4m3, k_scale and
v_scale passed to run()), the project's Triton decode kernel (kernels/decode_attention.py, FP8:
e4m3 loads, scales through pointers) and, for e4m3, the project's CUDA kernel (kernels/e4m3_decode_cuda.py,
the default of the decode graphs from batch 3). The FP8 rows also give the speed-up over the bf16 cache.

    python3 benchmarks/bench_fp8_kv.py [--out DIR] [--batches 1,8,32,64,128] [--contexts 512,2048,8192]
    python3 benchmarks/bench_fp8_kv.py --sweep [--occupancy] [--out DIR]   # the Triton e4m3 launch sweep
    python3 benchmarks/bench_fp8_kv.py --sweep --by-batch   # the candidates per batch (E4M3_BY_BATCH)
    python3 benchmarks/bench_fp8_kv.py --sweep --variants '[{"fp8_math": "bits_vreg", "num_stages": 5}]' [--cases 64x2048,128x8192]

writes fp8_kv.json and fp8_kv.png (--sweep: fp8_kv_sweep.json / .png) to --out (default benchmarks/results, or $OUT when set).
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


def make_case(B: int, ctx: int, dtype: torch.dtype, sms: int, workspace) -> dict:
    """One (batch, context, cache dtype) case's tensors: enough layers' caches (pages shuffled) that
    a graph of one call per layer reads >= MIN_BYTES, their device page metadata and FlashInfer
    decode wrappers planned as the decode graphs plan them."""
    import flashinfer

    from model_wrapper.attention.flashinfer_backend import page_metadata

    per_layer = kv_bytes(B, ctx, dtype)
    layers = kv_layers(per_layer)
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
    wrappers = []
    for indptr, indices, last in meta:
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace[len(wrappers)], "NHD", use_tensor_cores=True)
        w.plan(indptr, indices.cuda(), last, HEADS, KV_HEADS, HEAD_DIM, PAGE, q_data_type=torch.bfloat16,
               kv_data_type=dtype, sm_scale=HEAD_DIM**-0.5, disable_split_kv=B * KV_HEADS >= sms)
        wrappers.append(w)
    fp8 = dtype == FP8
    return {"q": q, "k": k, "v": v, "layers": layers, "per_layer": per_layer, "wrappers": wrappers,
            "dev": [tuple(x.cuda() for x in m) for m in meta],
            "fi_kw": {"k_scale": K_SCALE, "v_scale": V_SCALE} if fp8 else {},
            "tr_kw": {"k_scale": torch.tensor([K_SCALE], device="cuda"),
                      "v_scale": torch.tensor([V_SCALE], device="cuda")} if fp8 else {}}


def flashinfer_us(c: dict) -> float:
    """Microseconds a call of FlashInfer's decode over case c (median graph replay / layers)."""
    from benchmarks.ab_gemv import graph_ms

    return graph_ms(lambda: [w.run(c["q"], (c["k"], c["v"]), **c["fi_kw"]) for w in c["wrappers"]]) * 1e3 / c["layers"]


def triton_us(c: dict, **launch) -> float:
    """Microseconds a call of the Triton kernel over case c with launch (paged_decode_attention's)."""
    from benchmarks.ab_gemv import graph_ms
    from model_wrapper.kernels.decode_attention import paged_decode_attention

    return graph_ms(lambda: [paged_decode_attention(c["q"], c["k"], c["v"], *m, HEAD_DIM**-0.5, **c["tr_kw"], **launch)
                             for m in c["dev"]]) * 1e3 / c["layers"]


def triton_out(c: dict, **launch) -> torch.Tensor:
    from model_wrapper.kernels.decode_attention import paged_decode_attention

    return paged_decode_attention(c["q"], c["k"], c["v"], *c["dev"][0], HEAD_DIM**-0.5, **c["tr_kw"], **launch)


def attention_case(B: int, ctx: int, dtype: torch.dtype, bw: float, sms: int, workspace) -> dict:
    """One (batch, context, cache dtype) case: FlashInfer and Triton timings and bandwidth fractions; an e4m3
    cache also on the CUDA kernel (kernels/e4m3_decode_cuda.py: paged_decode_attention(cuda=True) at its splits,
    what the decode graphs run from batch 3 on)."""
    from model_wrapper.kernels.decode_attention import decode_splits

    c = make_case(B, ctx, dtype, sms, workspace)
    splits = decode_splits(B, KV_HEADS, sms, dtype)  # the launch by batch's splits (an e4m3 cache)
    fi_us = flashinfer_us(c)
    tr_us = triton_us(c, splits=splits)
    fi_out = c["wrappers"][0].run(c["q"], (c["k"], c["v"]), **c["fi_kw"]).float()
    diff = (triton_out(c, splits=splits).float() - fi_out).abs().max().item()
    per_layer = c["per_layer"]
    row = {"batch": B, "context": ctx, "kv_dtype": str(dtype).replace("torch.", ""), "layers": kv_layers(per_layer),
           "kv_MB": per_layer / 1e6, "splits": splits, "flashinfer_us": fi_us, "triton_us": tr_us,
           "flashinfer_of_copy_bw": per_layer / (fi_us * 1e-6) / bw, "triton_of_copy_bw": per_layer / (tr_us * 1e-6) / bw,
           "max_abs_diff_triton_vs_flashinfer": diff}
    if dtype == FP8:
        cs = decode_splits(B, KV_HEADS, sms, dtype, cuda=True)
        cu_us = triton_us(c, splits=cs, cuda=True)
        row.update(cuda_splits=cs, cuda_us=cu_us, cuda_of_copy_bw=per_layer / (cu_us * 1e-6) / bw,
                   max_abs_diff_cuda_vs_flashinfer=(triton_out(c, splits=cs, cuda=True).float() - fi_out).abs().max().item())
    del c
    return row


def kv_layers(per_layer: int) -> int:
    return max(1, min(MAX_LAYERS, -(-MIN_BYTES // per_layer)))


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
                cu = (f", CUDA {r['cuda_us']:8.1f} us ({r['cuda_of_copy_bw']:.2f}; max |diff| "
                      f"{r['max_abs_diff_cuda_vs_flashinfer']:.4f})") if "cuda_us" in r else ""
                print(f"B={B:3d} ctx={ctx:5d} {r['kv_dtype']:>13s} ({r['kv_MB']:8.1f} MB K/V): FlashInfer "
                      f"{r['flashinfer_us']:8.1f} us ({r['flashinfer_of_copy_bw']:.2f} of copy bw), Triton "
                      f"{r['triton_us']:8.1f} us ({r['triton_of_copy_bw']:.2f}; max |diff| "
                      f"{r['max_abs_diff_triton_vs_flashinfer']:.4f}){cu}", flush=True)
                gc.collect()
                torch.cuda.empty_cache()
    return res


SWEEP_CASES = ((32, 2048), (64, 512), (64, 2048), (64, 8192), (128, 512), (128, 2048), (128, 8192))
SWEEP_TARGET = ((64, 2048), (64, 8192), (128, 2048), (128, 8192))  # the bandwidth-bound sizes
SWEEP_TILES = ((64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3), (128, 4, 4), (128, 8, 3),
               (256, 8, 3))  # (block_n, num_warps, num_stages)


# the register cap (maxnreg) against occupancy: at 128 keys the e4m3 kernel takes 195 registers
# (2 programs a SM; the bf16 kernel's 128 allow 4): 168 fits 3, 128 fits 3 (shared memory) or 4 at 64 keys
OCCUPANCY_VARIANTS = [dict(fp8_math="q_dtype", block_n=64, num_warps=4, num_stages=3)] + [
    dict(fp8_math=m, block_n=b, num_warps=4, num_stages=3, maxnreg=r, **({"split_factor": 2} if f else {}))
    for m, b, r, f in (("bits_vreg", 128, None, 0), ("bits_vreg", 128, 168, 0), ("bits_vreg", 128, 128, 0),
                       ("fp16_vreg", 128, 168, 0), ("bits_vreg", 64, 128, 0), ("fp16_vreg", 64, 128, 0),
                       ("bits_vreg", 64, 128, 1), ("bits_vreg", 128, 168, 1))]


# the launch by batch (decode_attention.E4M3_BY_BATCH): the candidates at every batch of the decode
# graphs' range, each context a graph may replay; the choice may follow the batch only
BY_BATCH_CASES = ((1, 8192), (4, 8192), (8, 2048), (8, 8192), (16, 2048), (16, 8192), (32, 2048), (32, 8192),
                  (64, 2048), (64, 8192), (128, 2048), (128, 8192))
# (session 40's candidates: 3 stages give K / V one shared-memory buffer, 5 two; 64 or 128 keys, the two
# fastest e4m3 maths, the decode rule's splits or twice them)
BY_BATCH_VARIANTS = [
    dict(fp8_math=m, block_n=b, num_warps=4, num_stages=st, maxnreg=128, **({"split_factor": f} if f > 1 else {}))
    for m, b, st, f in (("bits_vreg", 64, 3, 1), ("bits_vreg", 64, 3, 2), ("bits_vreg", 64, 5, 1), ("bits_vreg", 64, 5, 2),
                        ("fp16_vreg", 64, 5, 1), ("fp16_vreg", 64, 5, 2), ("bits_vreg", 128, 5, 1),
                        ("bits_vreg", 128, 5, 2), ("fp16_vreg", 128, 5, 1))] + [
    # (session 42: for the H200, where the e4m3 kernel stays near 2.8 TB/s as on an H100: 8 warps a program; offline
    # sm90 builds: 128 keys at 5 stages 96 registers, two programs and 16 warps a SM as the default's four of 4 warps;
    # 64 keys at 3 stages capped at 80 registers (78, no spill): three programs, 24 warps a SM, one K / V buffer)
    dict(fp8_math="bits_vreg", block_n=128, num_warps=8, num_stages=5, maxnreg=128, **({"split_factor": f} if f > 1 else {}))
    for f in (1, 2)] + [dict(fp8_math="fp16_vreg", block_n=64, num_warps=8, num_stages=3, maxnreg=80)]


# (session 44) the 16-bit cache's launch by batch: LAUNCH["16-bit"] is one launch for every batch (64 keys, 4 warps,
# 3 stages: one K / V buffer, so a program's second tile is read only after its first is used); candidates with
# two buffers (5 stages), 128 keys, 8 warps, twice the splits
BF16_BY_BATCH_VARIANTS = [dict(block_n=b, num_warps=w, num_stages=st, **({"split_factor": f} if f > 1 else {}))
                          for b, w, st, f in ((64, 4, 3, 1), (64, 4, 3, 2), (64, 4, 5, 1), (64, 4, 5, 2), (128, 4, 3, 1),
                                              (128, 4, 5, 1), (128, 8, 3, 1), (128, 8, 5, 1), (64, 8, 5, 1),
                                              (128, 4, 3, 2))]
BF16_BY_BATCH_CASES = ((1, 512), (1, 8192), (8, 512), (8, 2048), (16, 512), (16, 2048), (32, 512), (32, 2048),
                       (64, 512), (64, 2048), (128, 512), (128, 2048))


def best_by_batch(res: dict) -> dict:
    """{batch: (geomean fraction of copy bw over that batch's contexts, variant)} of the best variant."""
    import math

    out = {}
    for B in sorted({r["batch"] for r in res["cases"]}):
        rows = [r for r in res["cases"] if r["batch"] == B]
        scores = []
        for i in range(len(rows[0]["triton"])):
            fr = [r["triton"][i]["of_copy_bw"] for r in rows]
            scores.append((math.exp(sum(map(math.log, fr)) / len(fr)), i))
        g, i = max(scores)
        var = {k: x for k, x in rows[0]["triton"][i].items()
               if k not in ("us", "of_copy_bw", "max_abs_diff_vs_q_dtype")}
        var["split_factor"] = var.pop("splits") // rows[0]["splits"]
        out[B] = (g, var)
    return out


def sweep(bw: float, sms: int, workspace, variants: list | None = None, cases=SWEEP_CASES, dtype=FP8) -> dict:
    """The e4m3 path's launch space: every fp8_math x SWEEP_TILES at the decode rule's splits (and
    the "_vreg" modes at 64 and 128 keys, 4 warps, 3 stages with twice the splits) over SWEEP_CASES,
    FlashInfer alongside; or the given variants (paged_decode_attention's launch arguments, and
    split_factor: that many times the decode rule's splits).
    Per variant and case: us, fraction of copy bandwidth, max |out - the q_dtype default's out| (the
    modes compute the same attention: a GPU-only defect of one shows there). Then per variant the
    geometric mean fraction over SWEEP_TARGET, best first. dtype: the cache's (bf16: the 16-bit launches, the
    reference LAUNCH["16-bit"]'s, FlashInfer's bf16 decode alongside)."""
    import math

    from model_wrapper.kernels.decode_attention import FP8_MATHS, decode_splits

    if variants is None:
        variants = [dict(fp8_math=m, block_n=b, num_warps=w, num_stages=st) for m in FP8_MATHS for b, w, st in SWEEP_TILES]
        variants += [dict(fp8_math=m, block_n=b, num_warps=4, num_stages=3, split_factor=2)
                     for m in ("fp16_vreg", "bits_vreg") for b in (64, 128)]
    res = {"cases": [], "variants": []}
    for B, ctx in cases:
        c = make_case(B, ctx, dtype, sms, workspace)
        splits = decode_splits(B, KV_HEADS, sms)
        fi = flashinfer_us(c)
        base = dict(fp8_math="q_dtype") if dtype == FP8 else {}
        ref = triton_out(c, splits=splits, block_n=64, num_warps=4, num_stages=3, **base).float()
        fi_out = c["wrappers"][0].run(c["q"], (c["k"], c["v"]), **c["fi_kw"]).float()
        row = {"batch": B, "context": ctx, "splits": splits, "flashinfer_us": fi,
               "flashinfer_of_copy_bw": c["per_layer"] / (fi * 1e-6) / bw, "triton": []}
        print(f"B={B:3d} ctx={ctx:5d} kv heads {KV_HEADS}: FlashInfer {str(dtype)[6:]} {fi:8.1f} us ({row['flashinfer_of_copy_bw']:.2f}); "
              f"Triton q_dtype vs FlashInfer max |diff| {(ref - fi_out).abs().max().item():.4f}", flush=True)
        for var in variants:
            launch = {k: x for k, x in var.items() if k != "split_factor"}
            launch["splits"] = max(1, int(splits * var.get("split_factor", 1)))  # (a factor below 1: fewer splits)
            try:
                us = triton_us(c, **launch)
                diff = (triton_out(c, **launch).float() - ref).abs().max().item()
            except Exception as e:  # a launch that does not build (shared memory): recorded, not fatal
                print(f"   {launch}: failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                row["triton"].append({**launch, "us": float("inf"), "of_copy_bw": 1e-9, "error": str(e)[:500]})
                continue
            frac = c["per_layer"] / (us * 1e-6) / bw
            row["triton"].append({**launch, "us": us, "of_copy_bw": frac, "max_abs_diff_vs_q_dtype": diff})
            print(f"   {launch}: {us:8.1f} us ({frac:.2f}) diff {diff:.2e}", flush=True)
        res["cases"].append(row)
        del c, ref, fi_out
        gc.collect()
        torch.cuda.empty_cache()
    def geomean(v):
        return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")

    for i, var in enumerate(variants):
        fr = [r["triton"][i]["of_copy_bw"] for r in res["cases"] if (r["batch"], r["context"]) in SWEEP_TARGET]
        low = [r["triton"][i]["of_copy_bw"] for r in res["cases"] if (r["batch"], r["context"]) not in SWEEP_TARGET]
        res["variants"].append({**var, "geomean_target": geomean(fr), "min_target": min(fr or [float("nan")]),
                                "geomean_other": geomean(low)})
    res["variants"].sort(key=lambda r: -r["geomean_target"])
    fi = [r["flashinfer_of_copy_bw"] for r in res["cases"] if (r["batch"], r["context"]) in SWEEP_TARGET] or [1.0]
    res["flashinfer_geomean_target"] = math.exp(sum(map(math.log, fi)) / len(fi))
    print(f"FlashInfer: geomean {res['flashinfer_geomean_target']:.3f} of copy bw over {SWEEP_TARGET}")
    for r in res["variants"][:12]:
        print(f"  {r['geomean_target']:.3f} (min {r['min_target']:.3f}; other sizes {r['geomean_other']:.3f}): "
              f"{ {k: x for k, x in r.items() if not k.endswith(('target', 'other'))} }")
    return res


def plot_sweep(res: dict, path: str) -> None:
    """The best variant of each fp8_math and FlashInfer: fraction of copy bandwidth per case."""
    from benchmarks.common import pyplot

    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [f"{r['batch']}x{r['context']}" for r in res["cases"]]
    ax.plot(names, [r["flashinfer_of_copy_bw"] for r in res["cases"]], "o-", label="FlashInfer e4m3")
    seen = set()
    for v in res["variants"]:
        if v.get("fp8_math") in seen:
            continue
        seen.add(v.get("fp8_math"))
        key = {k: x for k, x in v.items() if not k.endswith(("target", "other"))}
        i = [j for j, t in enumerate(res["cases"][0]["triton"])
             if all(t.get(k) == x for k, x in key.items() if k != "split_factor")][0]
        ax.plot(names, [r["triton"][i]["of_copy_bw"] for r in res["cases"]], "o-", label=f"Triton {key}")
    ax.axhline(0.85, color="gray", ls="--", lw=1, label="target")
    ax.set(ylabel="K/V bytes / time / copy bandwidth", ylim=(0, 1.2), title=f"e4m3 decode attention ({res['device']})")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
            for kernel, color in (("flashinfer", "C0"), ("triton", "C1"), ("cuda", "C2")):
                got = [r for r in rows if f"{kernel}_of_copy_bw" in r]
                if got:
                    ax.plot([r["batch"] for r in got], [r[f"{kernel}_of_copy_bw"] for r in got], "o" + style,
                            color=color, label=f"{kernel} {dtype}")
        ax.axhline(res["target_of_copy_bw"], color="gray", ls="--", lw=1, label="target (FP8)")
        ax.set(xlabel="batch", xscale="log", ylabel="K/V bytes / time / copy bandwidth", ylim=(0, 1.2),
               title=f"decode attention, context {ctx} ({res['device']})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    global KV_HEADS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        "results")))
    p.add_argument("--batches", default="1,8,32,64,128")
    p.add_argument("--contexts", default="512,2048,8192")
    p.add_argument("--sweep", action="store_true", help="the e4m3 Triton launch sweep instead (fp8_kv_sweep.json)")
    p.add_argument("--occupancy", action="store_true",
                   help="with --sweep: the register-cap variants only (fp8_kv_occupancy.json)")
    p.add_argument("--by-batch", action="store_true",
                   help="with --sweep: the launch candidates per batch, batch 1-128 x 2k / 8k (fp8_kv_by_batch.json; with --variants: those)")
    p.add_argument("--variants", help="with --sweep: a JSON list of launches (paged_decode_attention's arguments and "
                   "split_factor) instead of the built-in ones (fp8_kv_variants.json)")
    p.add_argument("--cases", help="with --sweep: batch x context cases, e.g. 64x2048,128x8192")
    p.add_argument("--kv-dtype", default="e4m3", choices=["e4m3", "bf16"],
                   help="with --sweep: the cache's dtype (bf16 --by-batch: BF16_BY_BATCH_VARIANTS over BF16_BY_BATCH_CASES)")
    p.add_argument("--kv-heads", type=int, default=KV_HEADS,
                   help="KV heads of the shape (32 query heads; 8: Llama-3-8B, 4: Qwen3-30B-A3B)")
    args = p.parse_args(argv)
    KV_HEADS = args.kv_heads
    if not torch.cuda.is_available():
        print("bench_fp8_kv: needs a CUDA GPU (and flashinfer-python)", file=sys.stderr)
        return 2
    from benchmarks.ab_gemv import save_results

    if args.sweep:
        from benchmarks.bench_forward import copy_bandwidth

        bw = copy_bandwidth("cuda")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
        workspace = [torch.empty(128 << 20, dtype=torch.uint8, device="cuda") for _ in range(MAX_LAYERS)]
        if args.variants:
            import json

            variants, cases, name = json.loads(args.variants), SWEEP_CASES, "fp8_kv_variants"
        elif args.by_batch and args.kv_dtype == "bf16":
            variants, cases, name = BF16_BY_BATCH_VARIANTS, BF16_BY_BATCH_CASES, f"bf16_kv_by_batch_h{KV_HEADS}"
        elif args.by_batch:
            variants, cases, name = BY_BATCH_VARIANTS, BY_BATCH_CASES, "fp8_kv_by_batch"
        else:
            variants = OCCUPANCY_VARIANTS if args.occupancy else None
            cases, name = SWEEP_CASES, "fp8_kv_occupancy" if args.occupancy else "fp8_kv_sweep"
        if args.cases:
            cases = tuple(tuple(int(x) for x in c.split("x")) for c in args.cases.split(","))
        res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12,
               "kv_heads": KV_HEADS, **sweep(bw, sms, workspace, variants, cases,
                                             FP8 if args.kv_dtype == "e4m3" else torch.bfloat16)}
        if args.by_batch:
            res["best_by_batch"] = {B: {"geomean": g, **v} for B, (g, v) in best_by_batch(res).items()}
            for B, row in res["best_by_batch"].items():
                print(f"best at batch {B}: geomean {row['geomean']:.3f} of copy bw: "
                      f"{ {k: x for k, x in row.items() if k != 'geomean'} }", flush=True)
        save_results(res, args.out, name, plot_sweep)
        return 0
    res = run([int(x) for x in args.batches.split(",")], [int(x) for x in args.contexts.split(",")])
    save_results(res, args.out, "fp8_kv", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
