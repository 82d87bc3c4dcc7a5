"""A/B of KernelConfig.fp8_quant_reciprocal: the activation quantize kernels (kernels/fp8_act.py) dividing by the
scale through its reciprocal (on) or div.rn a value (off), alone, at a 4k-token prefill's Llama-3-8B shapes: the
per-token SiLU-and-mul + quantize (row-wise path, n = 14336), the same per 128 columns (block path), the residual
RMSNorm + quantize (hidden 4096, per token and per 128; no residual), o's standalone per-token quantize (4096). Each: the
mean of CUDA events over back-to-back calls, its bytes against the copy bandwidth of the run, and on / off's q and
scales compared bit for bit. Writes fp8_quant_ab.json and fp8_quant_ab.png.

    source .gpu/device-setup.sh && python3 benchmarks/ab_fp8_quant.py --out $OUT
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    from benchmarks.bench_forward import copy_bandwidth
    from model_wrapper.kernels import fp8_act
    from model_wrapper.kernels.config import KernelConfig

    M, H, n = args.tokens, 4096, 14336
    bw = copy_bandwidth("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    gu = torch.randn(M, 2 * n, device="cuda", generator=g).to(torch.bfloat16)
    x = torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(H, device="cuda", generator=g)).to(torch.bfloat16)
    cases = {  # name -> (fn(cfg) -> (q, s), bytes)
        "silu per-token 14336": (lambda c: fp8_act.silu_and_mul_fp8(gu, n, cfg=c), gu.numel() * 2 + M * n),
        "silu per-128 14336": (lambda c: fp8_act.silu_and_mul_fp8(gu, 128, cfg=c), gu.numel() * 2 + M * n),
        "norm per-token 4096": (lambda c: fp8_act.add_rms_norm_fp8(x, None, w, 1e-5, H, cfg=c), M * H * 3),
        "norm per-128 4096": (lambda c: fp8_act.add_rms_norm_fp8(x, None, w, 1e-5, 128, cfg=c), M * H * 3),
        "quantize per-token 4096": (lambda c: fp8_act._quantize(x, H, None, cfg=c), M * H * 3),
    }
    res = {"device": torch.cuda.get_device_name(), "tokens": M, "copy_bw": bw, "rows": []}
    print(f"{res['device']}: copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    for name, (fn, nbytes) in cases.items():
        outs, row = {}, dict(case=name, floor_us=nbytes / bw * 1e6)
        for arm, on in (("recip", True), ("div.rn", False), ("recip again", True)):
            cfg = dataclasses.replace(KernelConfig(), fp8_quant_reciprocal=on)
            out = fn(cfg)
            outs[arm] = (out.q, out.scale) if hasattr(out, "q") else out
            for _ in range(3):
                fn(cfg)
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(args.iters):
                fn(cfg)
            t1.record()
            torch.cuda.synchronize()
            row[arm] = t0.elapsed_time(t1) * 1e3 / args.iters
        (qa, sa), (qb, sb) = outs["recip"], outs["div.rn"]
        row["bit_equal"] = bool(torch.equal(qa.view(torch.uint8), qb.view(torch.uint8)) and torch.equal(sa, sb))
        res["rows"].append(row)
        print(f"{name:26s} recip {row['recip']:7.1f} / div.rn {row['div.rn']:7.1f} / recip again "
              f"{row['recip again']:7.1f} us  floor {row['floor_us']:6.1f}  bit-equal {row['bit_equal']}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_quant_ab.json"), "w") as f:
        json.dump(res, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4))
        names = [r["case"] for r in res["rows"]]
        ys = range(len(names))
        for k, (arm, off) in enumerate((("recip", -0.25), ("div.rn", 0.0), ("floor_us", 0.25))):
            ax.barh([y + off for y in ys], [r[arm] for r in res["rows"]], height=0.25, label=arm)
        ax.set_yticks(list(ys), names)
        ax.set(xlabel="us a call", title=f"activation quantize kernels, {M} tokens ({res['device']})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "fp8_quant_ab.png"), dpi=90)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
