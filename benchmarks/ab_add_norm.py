"""A/B of KernelConfig.gemv_add_norm at the projection level: the residual add + RMSNorm kernel, then the
GEMV (off), against the GEMV with the add + RMSNorm in its prologue (on), at 1 and 2 tokens.

    source .gpu/device-setup.sh && python3 benchmarks/ab_add_norm.py --out $OUT
    python benchmarks/ab_add_norm.py --smoke --out /tmp/ab   # CPU, Triton's interpreter, tiny shapes

Cases, the projections a norm feeds in a decode step: Llama-3-8B's qkv (6144 x 4096) and gate_up + SiLU
(28672 x 4096) in bf16 (kernels/gemv.py) and FP8 with 128 x 128 block scales (kernels/fp8_gemv.py), and
Qwen3-30B-A3B's qkv (5120 x 2048). Each time
is bench_fp8_gemm.time_calls': the median CUDA-graph replay of calls rotating over weight copies of > 256 MB
together (no L2 reuse), per call; consecutive calls overlap through PDL as a decode step's kernels do. The
"gemv alone" row is the GEMV without any norm (what the pair would cost if the norm were free). Every fused
result is checked against the unfused pair on the same rows (max rel. error). Writes add_norm_ab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
if "--smoke" in sys.argv:  # the interpreter is set up before any kernel is defined
    sys.path.insert(0, os.path.join(HERE, "tests"))
    import triton_interpret  # noqa: F401

import torch  # noqa: E402

# name -> (rows N, K, kind): "gemv" / "silu" (bf16), "fp8" / "fp8 silu"
CASES = {"8B qkv bf16": (6144, 4096, "gemv"), "8B gate_up bf16": (28672, 4096, "silu"),
         "8B qkv fp8": (6144, 4096, "fp8"), "8B gate_up fp8": (28672, 4096, "fp8 silu"),
         "30B-A3B qkv bf16": (5120, 2048, "gemv")}
SMOKE_CASES = {"qkv": (48, 256, "gemv"), "gate_up": (64, 256, "silu"), "qkv fp8": (48, 256, "fp8")}


def make_calls(kind, N, K, M, copies, device, dt, g, cfg):
    """-> {variant: fn(i)} over `copies` weights, and (fused(0), unfused(0)) on fresh rows for the check."""
    from model_wrapper.kernels import fp8_gemv, gemv, norm

    h = torch.randn(M, K, device=device, generator=g).to(dt)
    r = torch.randn(M, K, device=device, generator=g).to(dt)
    nw = (1 + 0.1 * torch.randn(K, device=device, generator=g)).to(dt)
    r_out, x = torch.empty_like(r), h.clone()
    if kind.startswith("fp8"):
        ws = [(torch.randn(N, K, device=device, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
              for _ in range(copies)]
        ss = [(torch.rand(N, -(-K // 128), device=device, generator=g) / (64 * K**0.5)) for _ in range(copies)]
        silu = kind.endswith("silu")

        def proj(i, rows, add_norm=None):
            return fp8_gemv.fp8_gemv(rows, ws[i], ss[i], 128, silu=silu, cfg=cfg, add_norm=add_norm)
    else:
        ws = [(torch.randn(N, K, device=device, generator=g) / K**0.5).to(dt) for _ in range(copies)]

        def proj(i, rows, add_norm=None):
            return gemv.gemv(rows, ws[i], silu=kind == "silu", cfg=cfg, add_norm=add_norm)

    def unfused(i):  # in place on x and r, as the model's step (values stay bounded: x is normalized)
        norm.add_rms_norm(x, r, nw, 1e-6, cfg)
        return proj(i, x)

    calls = {"norm + gemv (off)": unfused,
             "fused (on)": lambda i: proj(i, h, (r, nw, 1e-6, r_out)),
             "gemv alone": lambda i: proj(i, h)}
    x0, r0 = h.clone(), r.clone()
    norm.add_rms_norm(x0, r0, nw, 1e-6, cfg)
    check = (proj(0, h, (r.clone(), nw, 1e-6, torch.empty_like(r))), proj(0, x0))
    return calls, check, N * K * ws[0].element_size()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(HERE, "benchmarks", "results")))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--tokens", default="1,2")
    args = ap.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("ab_add_norm needs a CUDA GPU (or --smoke)")
    from benchmarks.bench_forward import copy_bandwidth
    from benchmarks.bench_fp8_gemm import ROTATE_BYTES, time_calls
    from model_wrapper.kernels.config import KernelConfig

    device = "cpu" if args.smoke else "cuda"
    dt = torch.float16 if args.smoke else torch.bfloat16
    cases = SMOKE_CASES if args.smoke else CASES
    cfg = KernelConfig()
    bw = copy_bandwidth(device)
    res = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
           "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12, "rows": []}
    print(f"{res['device']}: copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    g = torch.Generator(device=device).manual_seed(0)
    for case, (N, K, kind) in cases.items():
        elem = 1 if kind.startswith("fp8") else 2
        copies = 2 if args.smoke else max(2, -(-ROTATE_BYTES // (N * K * elem)))
        for M in (int(t) for t in args.tokens.split(",")):
            calls, (fused, plain), wbytes = make_calls(kind, N, K, M, copies, device, dt, g, cfg)
            err = float((fused.float() - plain.float()).abs().max() / plain.float().abs().max().clamp_min(1e-30))
            for name, fn in calls.items():
                sec = time_calls(torch, fn, copies, device)
                row = dict(case=case, N=N, K=K, tokens=M, variant=name, us=sec * 1e6,
                           weight_floor_us=wbytes / bw * 1e6, fused_vs_unfused_max_rel_err=err)
                res["rows"].append(row)
                print(f"{case:20s} M={M} {name:18s} {row['us']:8.2f} us  (weights {row['weight_floor_us']:6.2f} us)"
                      f"  fused vs unfused err {err:.1e}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "add_norm_ab.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
