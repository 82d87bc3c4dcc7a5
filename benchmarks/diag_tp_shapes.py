"""Per-rank prefill GEMM shapes under TP=1 / 2 / 4, timed alone on one GPU, at several token counts:
does a shape take a slow kernel at some M (the TP=4 prefill of the FP8 models took longer at 4k
tokens than halfway to 8k, benchmarks/RESULTS.md, issue 28)?

    source .gpu/device-setup.sh && python3 benchmarks/diag_tp_shapes.py [--tokens 2048,4096,6144,8192]
    ... benchmarks/diag_tp_shapes.py --host --tokens 4096   # host vs wall us per call of the FP8 path's parts

Rows: the Llama-3-8B and Qwen3-30B-A3B attention block-FP8 projections (fp8_linear: the path it
takes, e.g. cuBLASLt's block-scaled _scaled_mm) and their bf16 counterparts (F.linear), and the
Qwen3-30B-A3B experts (fused_moe, 128 experts, top 8, random routing) in bf16 and block FP8, each
at its TP=W rank's shape (column-parallel N / W, row-parallel K / W; experts of width 768 / W).
Per row: us at each token count and us per 1k tokens; "slow" marks a count whose cost per token
is > 1.25 x the largest count's (where the GEMMs are long enough to be compute-bound, the cost
per token should fall or stay as M grows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

E4M3 = torch.float8_e4m3fn
LLAMA = dict(H=4096, q=4096, kv=1024, I=14336)
QWEN = dict(H=2048, E=128, I=768, k=8, q=4096, kv=512)


def cuda_us(fn, iters: int = 10, warmup: int = 3) -> float:
    """Median us of fn() between CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def fp8_weight(N: int, K: int, dev):
    """Random e4m3 [N, K], row scales [N, K / 128] of 128 x 128 blocks, and the compact blocks
    (Fp8Method.block_scale's layout: [K / 128, N / 128], stride(0) == 1)."""
    g = torch.Generator(device=dev).manual_seed(N * 7 + K)
    w = (torch.randn(N, K, device=dev, generator=g) * 64).clamp(-448, 448).to(E4M3)
    blocks = torch.rand(N // 128, K // 128, device=dev, generator=g) * 1e-3 + 1e-4
    return w, blocks.repeat_interleave(128, 0).contiguous(), blocks.contiguous().t()


def linear_rows(W: int, dev):
    """(name, N, K) of the Llama-3-8B projections and Qwen3-30B-A3B's attention ones at one TP=W rank."""
    c, m = LLAMA, QWEN
    return [("qkv", (c["q"] + 2 * c["kv"]) // W, c["H"]), ("o", c["H"], c["q"] // W),
            ("gate_up", 2 * c["I"] // W, c["H"]), ("down", c["H"], c["I"] // W),
            ("moe qkv", (m["q"] + 2 * m["kv"]) // W, m["H"]), ("moe o", m["H"], m["q"] // W)]


def moe_case(W: int, fp8: bool, dev):
    """fused_moe's weights at one TP=W rank: gate_up [E, 2I/W, H], down [E, H, I/W] (+ block scales)."""
    from benchmarks.bench_moe import quantize_fp8_blockwise

    c = QWEN
    inter = c["I"] // W
    g = torch.Generator(device=dev).manual_seed(W)
    gate_up = torch.randn(c["E"], 2 * inter, c["H"], device=dev, generator=g, dtype=torch.bfloat16) * 0.02
    down = torch.randn(c["E"], c["H"], inter, device=dev, generator=g, dtype=torch.bfloat16) * 0.02
    if not fp8:
        return gate_up, down, None, None
    (gu, gus), (dn, dns) = quantize_fp8_blockwise(gate_up), quantize_fp8_blockwise(down)
    return gu, dn, gus, dns


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="2048,4096,6144,8192")
    ap.add_argument("--worlds", default="1,4")
    ap.add_argument("--host", action="store_true", help="instead: the host time per call of the FP8 path's parts "
                                                        "at the TP=4 shapes (issue time of 50 calls, no sync)")
    args = ap.parse_args()
    if args.host:
        return host_costs(int(args.tokens.split(",")[0]))
    tokens = [int(v) for v in args.tokens.split(",")]
    worlds = [int(v) for v in args.worlds.split(",")]
    dev = torch.device("cuda")
    from model_wrapper.kernels import KernelConfig

    cfg = KernelConfig()
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}; us per call at tokens {tokens} "
          f"(per 1k tokens); 'slow': cost per token > 1.25 x the largest count's", flush=True)
    for W in worlds:
        try:  # a failing row is reported, the others still run (a GPU-only script, checked there only)
            run_world(W, tokens, cfg, dev)
        except Exception as e:  # noqa: BLE001
            print(f"TP={W}: failed: {e!r:.400}", flush=True)
        torch.cuda.empty_cache()


def run_world(W: int, tokens: list[int], cfg, dev) -> None:
    from model_wrapper.kernels.fp8 import fp8_linear, fp8_path
    from model_wrapper.kernels.moe import fused_moe

    for name, N, K in linear_rows(W, dev):
        w, ws, blocks = fp8_weight(N, K, dev)
        wb = (w.float() * ws.repeat_interleave(128, 1)[:, :K]).to(torch.bfloat16)
        for kind in ("fp8", "bf16"):
            res, path = [], ""
            for T in tokens:
                x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
                if kind == "fp8":
                    path = fp8_path(x, w, ws, 128, cfg, block_scale=blocks)
                    res.append(cuda_us(lambda: fp8_linear(x, w, ws, 128, None, None, cfg, blocks)))
                else:
                    res.append(cuda_us(lambda: F.linear(x, wb)))
            report(f"TP={W} {name} [{N}, {K}] {kind}{' ' + path if path else ''}", tokens, res)
    for fp8 in (False, True):
        gu, dn, gus, dns = moe_case(W, fp8, dev)
        res = []
        for T in tokens:
            g = torch.Generator(device=dev).manual_seed(T)
            x = torch.randn(T, QWEN["H"], device=dev, dtype=torch.bfloat16, generator=g)
            top = torch.randn(T, QWEN["E"], device=dev, generator=g).softmax(-1).topk(QWEN["k"], -1)
            wts, ids = top.values.to(torch.bfloat16), top.indices
            res.append(cuda_us(lambda: fused_moe(x, wts, ids, gu, dn, cfg, gus, dns)))
        report(f"TP={W} experts [{QWEN['E']} x {2 * QWEN['I'] // W} x {QWEN['H']}] {'fp8' if fp8 else 'bf16'}",
               tokens, res)


def host_us(fn, calls: int = 50) -> tuple[float, float]:
    """(host us per call: the time to issue `calls` calls, no sync between; wall us per call to the sync after)."""
    import time

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / calls * 1e6, (t2 - t0) / calls * 1e6


def host_costs(T: int) -> None:
    """Per TP=4 shape at T tokens: host / wall us per call of the quantization, the block-scaled and the
    row-wise torch._scaled_mm alone, the whole fp8_linear, and bf16 F.linear. Host > wall / calls' GPU
    time means a step of such calls is bound by the host."""
    from model_wrapper.kernels import KernelConfig
    from model_wrapper.kernels.fp8 import _quantize, fp8_linear, fp8_linear_quantized, takes_quantized_input
    from model_wrapper.kernels.fp8_act import add_rms_norm_fp8

    cfg, dev = KernelConfig(), torch.device("cuda")
    print(f"host / wall us per call at {T} tokens (50 calls issued back to back)", flush=True)
    for name, N, K in linear_rows(4, dev):
        w, ws, blocks = fp8_weight(N, K, dev)
        wb = (w.float() * ws.repeat_interleave(128, 1)[:, :K]).to(torch.bfloat16)
        x = torch.randn(T, K, device=dev, dtype=torch.bfloat16)
        q, qs = _quantize(x, 128, None, rows=-(-T // 16) * 16, outer=True)
        qr, qrs = _quantize(x, K, None)
        row_scale = ws[:, :1].reshape(1, N).contiguous()
        res, nw = torch.randn(T, K, device=dev, dtype=torch.bfloat16), torch.ones(K, device=dev, dtype=torch.bfloat16)
        act = add_rms_norm_fp8(x.clone(), res.clone(), nw, 1e-5, 128)
        parts = {
            "norm+quantize (fused)": lambda: add_rms_norm_fp8(x, res, nw, 1e-5, 128),
            "decision (takes_quantized_input)": lambda: takes_quantized_input(T, x.dtype, x.device, w, ws, blocks, cfg),
            "fp8_linear_quantized": lambda: fp8_linear_quantized(act, w, blocks),
            "quantize": lambda: _quantize(x, 128, None, rows=-(-T // 16) * 16, outer=True),
            "_scaled_mm block": lambda: torch._scaled_mm(q, w.t(), scale_a=qs, scale_b=blocks,
                                                         out_dtype=torch.bfloat16),
            "_scaled_mm rowwise": lambda: torch._scaled_mm(qr, w.t(), scale_a=qrs.contiguous(), scale_b=row_scale,
                                                           out_dtype=torch.bfloat16),
            "fp8_linear": lambda: fp8_linear(x, w, ws, 128, None, None, cfg, blocks),
            "bf16 F.linear": lambda: F.linear(x, wb),
        }
        cols = []
        for part, fn in parts.items():
            try:
                h, wall = host_us(fn)
                cols.append(f"{part} {h:.0f} / {wall:.0f}")
            except Exception as e:  # noqa: BLE001
                cols.append(f"{part} failed ({e!r:.80})")
        print(f"TP=4 {name} [{N}, {K}]: " + "; ".join(cols), flush=True)


def report(label: str, tokens: list[int], us: list[float]) -> None:
    per = [u / t * 1e3 for u, t in zip(us, tokens)]
    slow = [t for t, p in zip(tokens, per) if p > 1.25 * per[-1]]
    cols = "  ".join(f"{u:9.1f} ({p:6.1f})" for u, p in zip(us, per))
    print(f"{label:58s} {cols}" + (f"  slow at {slow}" if slow else ""), flush=True)


if __name__ == "__main__":
    main()
