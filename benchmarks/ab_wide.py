"""A/B of the gate_up projection of long prefills: Triton's wide GEMM with SiLU-and-mul in its
epilogue (kernels/gemm.wide_gate_up_silu) against cuBLAS + silu_and_mul (Llama-3-8B-shaped bf16,
one H100 run), in two parts:

1. the MLP's first half alone, x of T = 512-8192 tokens: cuBLAS's GEMM, then silu_and_mul,
   against the one wide kernel; microseconds (best of 3 loops of 10 calls, CUDA events) and
   TFLOP/s of the GEMM's work;
2. a batch-1 prefill of T tokens end to end (wall clock of back-to-back forward_tensor calls,
   bench_forward's measure) with the wide kernel off and on, beside the bare GEMM chain of the
   same shapes measured in the same run (bench_forward.gemm_chain). Two interleaved rounds.

    source .gpu/device-setup.sh && python3 benchmarks/ab_wide.py > benchmarks/results/wide.log

writes wide.json and wide.png to benchmarks/results (or to $OUT when OUT is set).
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ab_gemv import save_results
from benchmarks.bench_forward import gemm_chain, prefill_step, timed
from benchmarks.common import LLAMA3_8B, pyplot, random_text_generator
from model_wrapper.kernels.activation import silu_and_mul
from model_wrapper.kernels.gemm import wide_gate_up_silu


def events_us(fn, n=10, rounds=3) -> float:
    """Microseconds a call: the best of `rounds` loops of n calls, timed with CUDA events."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / n)
    return best * 1e3


def kernel_cases(cfg) -> list[dict]:
    h, n = cfg["hidden_size"], cfg["intermediate_size"]
    w = torch.randn(2 * n, h, device="cuda", dtype=torch.bfloat16) / h**0.5
    rows = []
    for T in (512, 1024, 2048, 4096, 8192):
        x = torch.randn(T, h, device="cuda", dtype=torch.bfloat16)
        gemm = events_us(lambda x=x: F.linear(x, w))
        pair = events_us(lambda x=x: silu_and_mul(F.linear(x, w)))
        wide = events_us(lambda x=x: wide_gate_up_silu(x, w))
        flop = 2 * T * 2 * n * h
        rows.append({"tokens": T, "cublas_gemm_us": gemm, "cublas_silu_us": pair, "wide_us": wide,
                     "cublas_TFLOPs": flop / gemm / 1e6, "wide_TFLOPs": flop / wide / 1e6})
        print(f"T={T:5d}: cuBLAS GEMM {gemm:7.1f} us ({flop / gemm / 1e6:.0f} TFLOP/s), + silu_and_mul "
              f"{pair:7.1f} us | wide GEMM + SiLU {wide:7.1f} us ({flop / wide / 1e6:.0f} TFLOP/s) x{wide / pair:.3f}",
              flush=True)
    return rows


def prefill_cases(cfg) -> list[dict]:
    gen = random_text_generator(cfg, device="cuda", dtype=torch.bfloat16)
    kv = gen.allocate_kv_cache(8192, 16)
    perm = torch.randperm(8192)
    mw = gen.model_wrapper
    on, rows = mw.kernel_config, []
    for T in (1024, 2048, 4096, 8192):
        step = prefill_step(gen, kv, 16, T, perm)
        iters = max(4, 32768 // T)
        chain = min(gemm_chain(cfg, T, "cuda", iters)[0] for _ in range(2))
        for rnd in range(2):
            for name, min_tokens in (("cuBLAS + silu_and_mul", 1 << 62), ("wide GEMM + SiLU", on.wide_min_tokens)):
                mw.set_kernel_config(dataclasses.replace(on, wide_min_tokens=min_tokens))
                t = timed(step, iters=iters, warmup=2)
                rows.append({"tokens": T, "variant": name, "round": rnd, "ms": t * 1e3, "gemm_chain_ms": chain * 1e3,
                             "ratio_to_gemm_chain": t / chain})
                print(f"prefill T={T:5d} round {rnd} {name:22s}: {t * 1e3:7.2f} ms, GEMM chain {chain * 1e3:7.2f} ms, "
                      f"x{t / chain:.3f}", flush=True)
        mw.set_kernel_config(on)
    return rows


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    k = res["kernel"]
    ts = [r["tokens"] for r in k]
    a.plot(ts, [r["cublas_silu_us"] / 1e3 for r in k], "o-", label="cuBLAS GEMM + silu_and_mul")
    a.plot(ts, [r["cublas_gemm_us"] / 1e3 for r in k], "s--", label="cuBLAS GEMM alone")
    a.plot(ts, [r["wide_us"] / 1e3 for r in k], "o-", label="wide GEMM + SiLU (one kernel)")
    a.set(xscale="log", yscale="log", xlabel="tokens", ylabel="ms", title="gate_up [28672 x 4096] + SiLU-and-mul")
    a.minorticks_off()
    a.set_xticks(ts, [str(t) for t in ts])
    a.set_yticks([0.2, 0.5, 1, 2, 3], ["0.2", "0.5", "1", "2", "3"])
    a.legend()
    p = res["prefill"]
    for name in dict.fromkeys(r["variant"] for r in p):
        xs = sorted({r["tokens"] for r in p})
        b.plot(xs, [min(r["ratio_to_gemm_chain"] for r in p if r["variant"] == name and r["tokens"] == x) for x in xs],
               "o-", label=name)
    b.axhline(1.15, color="gray", ls=":", label="target 1.15x (4k)")
    b.set(xscale="log", xlabel="prompt tokens (batch 1)", ylabel="prefill time / bare GEMM chain",
          title="prefill end to end")
    b.set_xticks(xs, [str(t) for t in xs])
    b.minorticks_off()
    b.legend()
    fig.suptitle(f"Llama-3-8B-shaped bf16, {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    res = {"device": torch.cuda.get_device_name(), "kernel": kernel_cases(LLAMA3_8B)}
    res["prefill"] = prefill_cases(LLAMA3_8B)
    save_results(res, os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")),
                 "wide", plot)


if __name__ == "__main__":
    main()
