"""FP8 (e4m3) linears (model_wrapper/kernels/fp8.py) against bf16 and cuBLASLt, per Llama-3-8B
projection shape and token count, beside the floor of the bytes each must read.

    source .gpu/device-setup.sh && python3 benchmarks/bench_fp8_gemm.py --out benchmarks/results
    python benchmarks/bench_fp8_gemm.py --smoke --out /tmp/fp8   # CPU, Triton's interpreter, tiny shapes

For qkv 6144x4096, o 4096x4096, gate_up 28672x4096 (also with its SiLU epilogue), down 4096x14336,
at M = 1, 4, 8, 16, 32, 64, 128, 256, 4096 tokens, with block-wise (128 x 128 blocks) and
per-channel weight scales (--scales, --shapes pick a subset):
- "fp8": fp8_linear as the model calls it (its path named), and each path forced where it
  applies ("gemv" up to 16 tokens, "skinny" up to 128, "skinny_mma" up to 16, "gemm" always, "scaled_mm" per-channel,
  "scaled_mm_block" block-wise where torch._scaled_mm takes block scales), so KernelConfig's
  fp8_* thresholds can be read off the table;
- "bf16": the project's bf16 projection (FlashInferKernels.linear / gate_up_silu: GEMV, skinny
  GEMM or cuBLAS) on the dequantized weight;
- "scaled_mm_only": torch._scaled_mm on activations quantized beforehand (cuBLASLt's GEMM alone).
Each time is the median CUDA-graph replay of calls rotating over weight copies of > 256 MB
together (no L2 reuse between calls) divided by the calls; floor = (e4m3 weight + scales + x + y
bytes) / the copy bandwidth measured here (a 1 GiB device copy); TB/s = the e4m3 weight bytes
over the time. Every fp8 result is checked against the dequantized product (max rel. error in the
JSON). Writes fp8_gemm.json and fp8_gemm.png to --out. --sweep adds the weight-only kernels'
KernelConfig values (the skinny kernel's K step, dequant mode and stages at 16, 64 and 128
tokens; block-wise scales), beside cuBLASLt's block-scaled GEMM and bf16 at the same token counts,
under "sweep" in the JSON, to tune them from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
TOKENS = (1, 4, 8, 16, 32, 64, 128, 256, 4096)
SWEEP_TOKENS = (16, 64, 128)  # skinny token tiles 16 (3-16 tokens), 64, 128
SMOKE_SHAPES = {"gate_up": (128, 256), "down": (64, 320)}
SMOKE_TOKENS = (1, 8, 17)
ROTATE_BYTES = 256 << 20  # weight copies per case: > 50 MB of L2 many times over


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "benchmarks", "results"))
    ap.add_argument("--sweep", action="store_true", help="also time the weight-only kernels' launch configs")
    ap.add_argument("--sweep-only", action="store_true", help="the sweep alone (block scales), no cases")
    ap.add_argument("--scales", default="block128,channel", help="comma-separated: block128, channel")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ",".join(SHAPES))
    ap.add_argument("--smoke", action="store_true", help="CPU under Triton's interpreter, tiny shapes (plumbing only)")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts of the cases (default: %s)"
                    % ",".join(map(str, TOKENS)))
    ap.add_argument("--kernel-config", default=None,
                    help="JSON file of KernelConfig fields to override (benchmarks/pick_fp8_config.py writes one)")
    return ap.parse_args()


def main():
    args = parse()
    if args.smoke:
        sys.path.insert(0, os.path.join(HERE, "tests"))
        import triton_interpret  # noqa: F401 (the interpreter and its fixes, before the kernels import)
    import torch

    if not args.smoke and not torch.cuda.is_available():
        sys.exit("bench_fp8_gemm needs a CUDA GPU (or --smoke for a CPU run of the plumbing)")
    from benchmarks.bench_forward import copy_bandwidth
    from model_wrapper.kernels import fp8
    from model_wrapper.kernels.config import KernelConfig
    from model_wrapper.kernels.fp8_reference import dequantize_fp8_weight

    device = "cpu" if args.smoke else "cuda"
    shapes, tokens = (SMOKE_SHAPES, SMOKE_TOKENS) if args.smoke else (SHAPES, TOKENS)
    if not args.smoke:
        shapes = {k: v for k, v in shapes.items() if k in args.shapes.split(",")}
    cfg = KernelConfig()
    if args.kernel_config:
        with open(args.kernel_config) as f:
            cfg = dataclasses.replace(cfg, **json.load(f))
    if args.tokens:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    bw = copy_bandwidth(device)
    bf16 = bf16_projections(device, cfg)
    res = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
           "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12, "bf16_kernels": bf16["name"],
           "config": dataclasses.asdict(cfg), "cases": []}
    print(f"{res['device']}: copy bandwidth {bw / 1e12:.3f} TB/s; bf16 through {bf16['name']}", flush=True)
    g = torch.Generator(device=device).manual_seed(0)
    dt = torch.float16 if args.smoke else torch.bfloat16  # the interpreter's bf16 dot is wrong
    for shape, (N, K) in shapes.items():
        for scales in (("block128",) if args.sweep_only else args.scales.split(",")):
            group = 128 if scales == "block128" else K
            kg = -(-K // group)
            copies = 2 if args.smoke else max(2, -(-ROTATE_BYTES // (N * K)))
            ws = [(torch.randn(N, K, device=device, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
                  for _ in range(copies)]
            # block128: a scale per 128 x 128 block, kept per row as the loader does (each 128-row band one row)
            bands = -(-N // 128) if scales == "block128" else N
            ss = [(torch.rand(bands, kg, device=device, generator=g) / (64 * K**0.5)).repeat_interleave(
                N // bands, 0)[:N].contiguous() for _ in range(copies)]
            bls = [block_scale(s, ws[0], group) for s in ss]
            wb = [dequantize_fp8_weight(w, s, group, dt) for w, s in zip(ws, ss)]
            silu_cases = (False, True) if shape == "gate_up" else (False,)
            if args.sweep_only:
                silu_cases = ()
                args.sweep = True
            for silu in silu_cases:
                for M in tokens:
                    x = torch.randn(M, K, device=device, generator=g).to(dt)
                    res["cases"] += run_case(fp8, torch, shape, scales, silu, M, x, ws, ss, bls, wb, group, cfg,
                                             bf16, bw, device)
            if args.sweep and scales == "block128":
                res.setdefault("sweep", []).extend(sweep(fp8, torch, shape, ws, ss, bls, wb, group, cfg, bf16,
                                                         device, g, dt))
            del ws, ss, wb, bls
            save(res, args.out)  # after each shape: a run cut short keeps what it measured
    save(res, args.out)
    if res["cases"]:
        plot(res, os.path.join(args.out, "fp8_gemm.png"))
    print(f"wrote {args.out}/fp8_gemm.json (and fp8_gemm.png with matplotlib)")


def save(res, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "fp8_gemm.json"), "w") as f:
        json.dump(res, f, indent=1)


def bf16_projections(device, cfg):
    """The project's bf16 projections: FlashInferKernels' linear and gate_up_silu where FlashInfer
    imports, else the same Triton dispatch (GEMV, skinny GEMM, cuBLAS) without it."""
    import torch
    import torch.nn.functional as F

    if device == "cuda":
        try:
            from model_wrapper.layers.kernels import FlashInferKernels

            k = FlashInferKernels(torch.ones(64, device=device), torch.bfloat16, 16, cfg)
            return {"name": "FlashInferKernels", "linear": k.linear, "silu": k.gate_up_silu}
        except ImportError:
            pass
    from model_wrapper.kernels import ops

    def linear(x, w):
        if ops.gemv_fits(x, w, cfg):
            return ops.gemv(x, w, cfg=cfg)
        if ops.skinny_fits(x, w, cfg):
            return ops.skinny_gemm(x, w, cfg=cfg)
        return F.linear(x, w)

    def silu(x, w):
        if ops.gemv_fits(x, w, cfg) and x.shape[1] <= cfg.gemv_max_k // 2:
            return ops.gemv(x, w, silu=True, cfg=cfg)
        if ops.skinny_fits(x, w, cfg):
            return ops.skinny_gemm(x, w, silu=True, cfg=cfg)
        return ops.silu_and_mul(F.linear(x, w), cfg)

    return {"name": "Triton GEMV / skinny + cuBLAS (no FlashInfer)", "linear": linear, "silu": silu}


def block_scale(s, w, group):
    """The compact block scales Fp8Method keeps for (w, s) (None for per-channel scales)."""
    import torch
    from model_wrapper.layers.fp8_linear import Fp8Method

    lin = torch.nn.Module()
    lin.weight, lin.weight_scale = w, s
    return Fp8Method(group).block_scale(lin)


def run_case(fp8, torch, shape, scales, silu, M, x, ws, ss, bls, wb, group, cfg, bf16, bw, device) -> list[dict]:
    """Every variant of one (shape, scales, silu, M): a result row each, printed."""
    from model_wrapper.kernels.activation import silu_and_mul

    N, K = ws[0].shape
    kg = ss[0].shape[1]
    n_out = N // 2 if silu else N
    floor_bytes = N * K + N * kg * 4 + M * K * 2 + M * n_out * 2
    floor_s = floor_bytes / bw
    entry = fp8.fp8_gate_up_silu if silu else fp8.fp8_linear
    path = fp8.fp8_path(x, ws[0], ss[0], group, cfg, silu, bls[0]) if device == "cuda" else "reference"
    if silu and path in ("gemm", "scaled_mm") and fp8.scaled_mm_block_fits(x, ws[0], bls[0]):
        path = "scaled_mm_block"  # gate_up's prefill: the GEMM fp8_linear picks, then silu_and_mul
    variants = {f"fp8 ({path})": lambda i: entry(x, ws[i], ss[i], group, cfg=cfg, block_scale=bls[i])}
    if M <= 16:
        variants["fp8 gemv"] = lambda i: fp8.fp8_gemv(x, ws[i], ss[i], group, silu=silu, cfg=cfg)
    if M <= 128:
        variants["fp8 skinny"] = lambda i: fp8.fp8_skinny(x, ws[i], ss[i], group, silu=silu, cfg=cfg)
    if M <= 16 and fp8.skinny_mma_fits(K, group):  # W8A8 (kernels/fp8_skinny_mma.py)
        variants["fp8 skinny_mma"] = lambda i: fp8.fp8_skinny_mma(x, ws[i], ss[i], group, silu=silu, cfg=cfg)
    if not silu and M > 1 and device == "cuda" and fp8.scaled_mm_block_fits(x, ws[0], bls[0]):
        variants["fp8 scaled_mm_block"] = lambda i: fp8.fp8_scaled_mm_block(x, ws[i], bls[i])
    if silu:
        variants["fp8 gemm"] = lambda i: silu_and_mul(fp8.fp8_gemm(x, ws[i], ss[i], group, cfg=cfg), cfg)
    else:
        variants["fp8 gemm"] = lambda i: fp8.fp8_gemm(x, ws[i], ss[i], group, cfg=cfg)
    per_channel_mm = scales == "channel" and device == "cuda" and fp8._scaled_mm_fits(x, ws[0])
    if per_channel_mm and not silu:
        variants["fp8 scaled_mm"] = lambda i: fp8.fp8_scaled_mm(x, ws[i], ss[i])
        a, a_s = fp8.quantize_fp8_per_token_group(x, K)
        variants["scaled_mm_only"] = lambda i: torch._scaled_mm(a, ws[i].t(), scale_a=a_s, scale_b=ss[i].reshape(1, N),
                                                                out_dtype=x.dtype)
    variants["bf16"] = (lambda i: bf16["silu"](x, wb[i])) if silu else (lambda i: bf16["linear"](x, wb[i]))
    want = wb[0].float()
    want = x.float() @ want.t()
    if silu:
        gate, up = want.to(x.dtype).float().chunk(2, dim=-1)
        want = torch.nn.functional.silu(gate) * up
    rows = []
    for name, fn in variants.items():
        sec = time_calls(torch, fn, len(ws), device)
        row = {"shape": shape + ("+silu" if silu else ""), "N": N, "K": K, "scales": scales, "tokens": M,
               "variant": name, "us": sec * 1e6, "floor_us": floor_s * 1e6, "x_floor": sec / floor_s,
               "weight_TBps": N * K / sec / 1e12, "TFLOPs": 2 * M * N * K / sec / 1e12}
        if name != "bf16":  # against the unquantized x: the prefill paths add their e4m3 rounding of x
            y = fn(0).float()
            row["max_rel_err"] = float((y - want).abs().max() / want.abs().max())
        rows.append(row)
        print(f"{row['shape']:12s} {scales:8s} M={M:5d} {name:22s} {row['us']:9.2f} us  x{row['x_floor']:6.2f} floor  "
              f"{row['weight_TBps']:5.2f} TB/s  {row['TFLOPs']:7.1f} TFLOP/s  err {row.get('max_rel_err', 0):.1e}",
              flush=True)
    base = next(r["us"] for r in rows if r["variant"] == "bf16")
    for r in rows:
        r["speedup_vs_bf16"] = base / r["us"]
    return rows


def sweep(fp8, torch, shape, ws, ss, bls, wb, group, cfg, bf16, device, g, dt) -> list[dict]:
    """The weight-only kernels under other KernelConfig values, beside the block-scaled cuBLASLt
    GEMM and bf16 at the same token counts: a row per (variant, tokens), printed."""
    N, K = ws[0].shape
    rows = []
    variants = []  # (the GEMV's tile and warps: results/fp8_sweep.json)
    # M 3..16 pad to the same 16-token tile: M = 16 times them all. The K step: one product a scale
    # group ("exact") or the tile scaled in registers, one product a step ("dequant")
    for M in SWEEP_TOKENS:
        wide = M > 16
        grid = ((False, 128), (False, 256), (False, 512), (True, 256), (True, 512))
        for dq, bk in grid if M < 128 else grid[:2] + grid[3:4]:  # 128 tokens: 512-column x tiles overflow
            c = dataclasses.replace(cfg, fp8_skinny_block_k=bk, fp8_skinny_wide_block_k=bk, fp8_skinny_dequant=dq,
                                    fp8_skinny_wide_dequant=dq)
            variants.append(("skinny", M, c))
    keys_of = {"gemv": ("fp8_gemv_tile", "fp8_gemv_warps"),
               "skinny": ("fp8_skinny_block_k", "fp8_skinny_dequant")}
    xs = {M: torch.randn(M, K, device=device, generator=g).to(dt) for M in SWEEP_TOKENS}
    for kernel, M, c in variants:
        x = xs[M]
        fn = fp8.fp8_gemv if kernel == "gemv" else fp8.fp8_skinny
        keys = keys_of[kernel]
        try:
            sec = time_calls(torch, lambda i: fn(x, ws[i], ss[i], group, cfg=c), len(ws), device)
        except Exception as e:  # a K step whose tiles exceed shared memory at this token tile: noted, skipped
            rows.append({"shape": shape, "kernel": kernel, "tokens": M, **{k: getattr(c, k) for k in keys},
                         "error": repr(e)[:200]})
            print(f"sweep {shape:8s} {kernel:6s} M={M:3d} " + " ".join(f"{k[4:]}={getattr(c, k)}" for k in keys)
                  + f": {type(e).__name__}", flush=True)
            continue
        row = {"shape": shape, "kernel": kernel, "tokens": M, **{k: getattr(c, k) for k in keys}, "us": sec * 1e6,
               "weight_TBps": N * K / sec / 1e12}
        print(f"sweep {shape:8s} {kernel:6s} M={M:3d} " + " ".join(f"{k[4:]}={row[k]}" for k in keys)
              + f": {row['us']:.2f} us ({row['weight_TBps']:.2f} TB/s)", flush=True)
        rows.append(row)
    for M in SWEEP_TOKENS:
        x = xs[M]
        others = {"bf16": lambda i: bf16["linear"](x, wb[i])}
        if device == "cuda" and fp8.scaled_mm_block_fits(x, ws[0], bls[0]):
            others["scaled_mm_block"] = lambda i: fp8.fp8_scaled_mm_block(x, ws[i], bls[i])
        for name, fn in others.items():
            sec = time_calls(torch, fn, len(ws), device)
            rows.append({"shape": shape, "kernel": name, "tokens": M, "us": sec * 1e6, "weight_TBps": N * K / sec / 1e12})
            print(f"sweep {shape:8s} {name:15s} M={M:3d}: {sec * 1e6:.2f} us", flush=True)
    return rows


def time_calls(torch, fn, copies, device, replays=30) -> float:
    """Seconds per call: a graph of `copies` calls (one per weight copy), median of its replays / copies."""
    if device != "cuda":
        t0 = time.perf_counter()
        for i in range(copies):
            fn(i)
        return (time.perf_counter() - t0) / copies
    reps = max(1, 8 // copies)  # at least 8 calls a graph
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn(i)  # compile and warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            for i in range(copies):
                fn(i)
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del graph
    return statistics.median(times) / (reps * copies)


def plot(res, path):
    from benchmarks.common import pyplot

    plt = pyplot()
    if plt is None:
        return
    shapes = list(dict.fromkeys(c["shape"] for c in res["cases"]))
    fig, axes = plt.subplots(2, len(shapes), figsize=(4.2 * len(shapes), 8), squeeze=False)
    for col, shape in enumerate(shapes):
        for scales, ls in (("block128", "-"), ("channel", "--")):
            rows = [c for c in res["cases"] if c["shape"] == shape and c["scales"] == scales]
            for variant in ("fp8", "bf16", "scaled_mm_only"):
                pts = sorted((c["tokens"], c) for c in rows if c["variant"].split(" (")[0] == variant)
                if not pts:
                    continue
                label = f"{variant} {scales}" if variant != "bf16" else "bf16" if scales == "block128" else None
                if variant == "bf16" and scales != "block128":
                    continue
                xs = [m for m, _ in pts]
                axes[0][col].plot(xs, [c["us"] for _, c in pts], "o" + ls, label=label)
                axes[1][col].plot(xs, [c["x_floor"] for _, c in pts], "o" + ls, label=label)
        axes[0][col].set(title=shape, xscale="log", yscale="log", xlabel="tokens", ylabel="us per call")
        axes[1][col].axhline(1.0, color="gray", lw=1)
        axes[1][col].set(xscale="log", yscale="log", xlabel="tokens", ylabel="time / fp8 byte floor")
        axes[0][col].legend(fontsize=7)
    fig.suptitle(f"FP8 linears vs bf16 on {res['device']} (copy {res['copy_bandwidth_TBps']:.2f} TB/s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
