"""A/B and sweep of the weight-only FP8 GEMV (model_wrapper/kernels/fp8_gemv.py) at 1-4 tokens on
Llama-3-8B's projections (block scales, 128 x 128), against the session-32 kernel it replaced (kept
here, below, as it was), the skinny kernel (the 3-16 token path), the project's bf16 projection on
the dequantized weight, and the floor of the bytes each must read.

    source .gpu/device-setup.sh && python3 benchmarks/ab_fp8_gemv.py --out $OUT
    python benchmarks/ab_fp8_gemv.py --smoke --out /tmp/ab   # CPU, Triton's interpreter, tiny shapes

Shapes as a decode step runs them: qkv 6144x4096, o 4096x4096, gate_up 28672x4096 with its SiLU
epilogue, down 4096x14336. Rows named by KernelConfig overrides (new_variants: "default", tiles,
warps and chunks; the session-32 kernel with --old; session 33 also timed a "bits" conversion since
removed, RESULTS.md; session 44 "half", fp16 products, also removed). Each
time is bench_fp8_gemm's: the median CUDA-graph replay of calls rotating over weight copies of
> 256 MB together (no L2 reuse), per call; consecutive calls in the graph overlap through PDL as
a decode step's projections do. floor = (e4m3 weight + scales + x + y bytes) / the copy bandwidth
measured here. Every result is checked against the dequantized product (max rel. error). Prints,
per token count, each variant's sum over the four projections (a layer) and writes
fp8_gemv_ab.json to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
if "--smoke" in sys.argv:  # the interpreter is set up before any kernel (this file's own) is defined
    sys.path.insert(0, os.path.join(HERE, "tests"))
    import triton_interpret  # noqa: F401

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from model_wrapper.kernels.common import gdc_launch_dependents, gdc_wait, silu_mul  # noqa: E402

SHAPES = {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up+silu": (28672, 4096, True),
          "down": (4096, 14336, False)}
SMOKE_SHAPES = {"gate_up+silu": (64, 256, True), "down": (48, 448, False)}
TOKENS = (1, 2, 4)


def new_variants(M: int, smoke: bool) -> dict:
    """name -> KernelConfig overrides of the new kernel swept at M tokens (a compile each). "default"
    is KernelConfig's own; fp8_gemv_tile counts weights x tokens ("t32k" holds 16k weights at 2
    tokens); "r1" / "r4": the tile as 1 / 4 row blocks a program takes in turn (fp8_gemv_rounds, by
    default 2; at 1 token, rows of up to 8192). (Session 35 also timed rows held as power-of-2 segments and down's
    own chunk / tile / warps: benchmarks/RESULTS.md.)"""
    if smoke:
        return {"default": {}, "t1k w2": dict(fp8_gemv_tile=1024, fp8_gemv_warps=2),
                "t1k w2 ch8": dict(fp8_gemv_tile=1024, fp8_gemv_warps=2, fp8_gemv_chunk=8)}
    out = {"default": {}, "t16k w4": dict(fp8_gemv_tile=16384)}
    if M == 1:
        out.update({"t8k w4": dict(fp8_gemv_tile=8192), "t64k w4": dict(fp8_gemv_tile=65536),  # (t64k: session 42)
                    "t32k w8": dict(fp8_gemv_warps=8),
                    "t32k w4 ch32": dict(fp8_gemv_chunk=32), "r1": dict(fp8_gemv_rounds=1),
                    "r4": dict(fp8_gemv_rounds=4)})
    else:
        out.update({"t64k w4": dict(fp8_gemv_tile=65536)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(HERE, "benchmarks", "results")))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--old", action="store_true", help="also the session-32 kernel")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of " + ",".join(SHAPES))
    ap.add_argument("--only", default=None, help="comma-separated variant names to run (default: all)")
    ap.add_argument("--variants-json", default=None, help='JSON {name: {KernelConfig field: value}}: more rows of the '
                    'kernel under other KernelConfig values, at every token count')
    ap.add_argument("--x32", action="store_true", help="also the default kernel on x held in fp32 (the same values: "
                    "its products without x's conversions)")
    args = ap.parse_args()
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("ab_fp8_gemv needs a CUDA GPU (or --smoke)")
    from benchmarks.bench_fp8_gemm import ROTATE_BYTES, bf16_projections, time_calls
    from benchmarks.bench_forward import copy_bandwidth
    from model_wrapper.kernels import fp8
    from model_wrapper.kernels.config import KernelConfig
    from model_wrapper.kernels.fp8_reference import dequantize_fp8_weight

    device = "cpu" if args.smoke else "cuda"
    dt = torch.float16 if args.smoke else torch.bfloat16
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes:
        shapes = {k: shapes[k] for k in args.shapes.split(",")}  # (in that order)
    tokens = [int(t) for t in args.tokens.split(",")]
    base = KernelConfig()
    bw = copy_bandwidth(device)
    bf16 = bf16_projections(device, base)
    res = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
           "torch": torch.__version__, "triton": triton.__version__, "copy_bandwidth_TBps": bw / 1e12,
           "config": dataclasses.asdict(base), "rows": []}
    print(f"{res['device']}: copy bandwidth {bw / 1e12:.3f} TB/s; bf16 through {bf16['name']}", flush=True)
    g = torch.Generator(device=device).manual_seed(0)
    group = 128
    for shape, (N, K, silu) in shapes.items():
        kg = -(-K // group)
        copies = 2 if args.smoke else max(2, -(-ROTATE_BYTES // (N * K)))
        ws = [(torch.randn(N, K, device=device, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
              for _ in range(copies)]
        ss = [(torch.rand(-(-N // 128), kg, device=device, generator=g) / (64 * K**0.5)).repeat_interleave(
            128, 0)[:N].contiguous() for _ in range(copies)]
        wb = [dequantize_fp8_weight(w, s, group, dt) for w, s in zip(ws, ss)]
        n_out = N // 2 if silu else N
        for M in tokens:
            x = torch.randn(M, K, device=device, generator=g).to(dt)
            want = x.float() @ wb[0].float().t()
            if silu:
                gate, up = want.to(dt).float().chunk(2, dim=-1)
                want = torch.nn.functional.silu(gate) * up
            floor_s = (N * K + N * kg * 4 + M * K * 2 + M * n_out * 2) / bw
            variants = {}
            if M <= 2 and args.old:  # (its path's bound)
                variants["old (session 32)"] = lambda i: old_fp8_gemv(x, ws[i], ss[i], group, silu)
            for name, over in {**new_variants(M, args.smoke), **json.loads(args.variants_json or "{}")}.items():
                if args.only and name not in args.only.split(","):
                    continue
                c = dataclasses.replace(base, **over)
                variants[name] = (lambda c: lambda i: fp8.fp8_gemv(x, ws[i], ss[i], group, silu=silu, cfg=c))(c)
            if args.x32:
                x32 = x.float()
                variants["x fp32"] = lambda i: fp8.fp8_gemv(x32, ws[i], ss[i], group, silu=silu, cfg=base)
            variants["skinny"] = lambda i: fp8.fp8_skinny(x, ws[i], ss[i], group, silu=silu, cfg=base)
            variants["bf16"] = (lambda i: bf16["silu"](x, wb[i])) if silu else (lambda i: bf16["linear"](x, wb[i]))
            for name, fn in variants.items():
                try:
                    sec = time_calls(torch, fn, len(ws), device)
                    err = float((fn(0).float() - want).abs().max() / want.abs().max())
                except Exception as e:  # noqa: BLE001 (a variant the compiler refuses: noted, skipped)
                    print(f"{shape:13s} M={M} {name:24s} {type(e).__name__}: {str(e)[:160]}", flush=True)
                    res["rows"].append(dict(shape=shape, tokens=M, variant=name, error=repr(e)[:300]))
                    continue
                row = dict(shape=shape, N=N, K=K, tokens=M, variant=name, us=sec * 1e6, floor_us=floor_s * 1e6,
                           x_floor=sec / floor_s, weight_TBps=N * K / sec / 1e12, max_rel_err=err)
                res["rows"].append(row)
                print(f"{shape:13s} M={M} {name:24s} {row['us']:8.2f} us  x{row['x_floor']:5.2f} floor  "
                      f"{row['weight_TBps']:5.2f} TB/s  err {err:.1e}", flush=True)
        del ws, ss, wb
        save(res, args.out)
    summary(res)
    save(res, args.out)


def summary(res):
    """Per token count: each variant's time over the four projections (a layer), x its floor."""
    res["layer"] = []
    shapes = list(dict.fromkeys(r["shape"] for r in res["rows"]))
    for M in sorted({r["tokens"] for r in res["rows"]}):
        rows = [r for r in res["rows"] if r["tokens"] == M and "us" in r]
        floor = sum(next(r["floor_us"] for r in rows if r["shape"] == s) for s in shapes)
        out = []
        for v in dict.fromkeys(r["variant"] for r in rows):
            got = {r["shape"]: r["us"] for r in rows if r["variant"] == v}
            if len(got) == len(shapes):
                out.append(dict(tokens=M, variant=v, layer_us=sum(got.values()), x_floor=sum(got.values()) / floor,
                                **{f"{s}_us": got[s] for s in shapes}))
        out.sort(key=lambda r: r["layer_us"])
        res["layer"] += out
        print(f"\nM={M}: a layer's four projections (floor {floor:.1f} us)", flush=True)
        for r in out:
            print(f"  {r['variant']:24s} {r['layer_us']:8.2f} us  x{r['x_floor']:5.2f}  "
                  + "  ".join(f"{s} {r[s + '_us']:.2f}" for s in shapes), flush=True)


def save(res, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "fp8_gemv_ab.json"), "w") as f:
        json.dump(res, f, indent=1)


# -- the session-32 kernel (model_wrapper/kernels/fp8.py at 122bc06), the A side --------------------

@triton.jit
def _old_fp8_gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, N, K, stride_x, stride_w, stride_s, stride_o,
                         GROUP: tl.constexpr, GP: tl.constexpr, KGP: tl.constexpr, M: tl.constexpr,
                         BLOCK_N: tl.constexpr, SILU: tl.constexpr, PDL: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = rows < N
    g = tl.arange(0, KGP)
    j = tl.arange(0, GP)
    cols = g[:, None] * GROUP + j[None, :]
    col_ok = (j[None, :] < GROUP) & (cols < K)
    w_at = w_ptr + rows[:, None, None].to(tl.int64) * stride_w + cols[None, :, :]
    w_ok = live[:, None, None] & col_ok[None, :, :]
    s_at = s_ptr + rows[:, None].to(tl.int64) * stride_s + g[None, :]
    s_ok = live[:, None] & (g * GROUP < K)[None, :]
    w = tl.load(w_at, mask=w_ok, other=0.0)
    s = tl.load(s_at, mask=s_ok, other=0.0)
    if SILU:
        wu = tl.load(w_at + N * stride_w, mask=w_ok, other=0.0)
        su = tl.load(s_at + N * stride_s, mask=s_ok, other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    dtype = o_ptr.dtype.element_ty
    for m in tl.static_range(M):
        x = tl.load(x_ptr + m * stride_x + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :, :]
        acc = tl.sum(tl.sum(w.to(tl.float32) * x, axis=2) * s, axis=1)
        if SILU:
            up = tl.sum(tl.sum(wu.to(tl.float32) * x, axis=2) * su, axis=1)
            acc = silu_mul(acc.to(dtype), up.to(dtype))
        tl.store(o_ptr + m * stride_o + rows, acc.to(dtype), mask=live)


def old_fp8_gemv(x, weight, weight_scale, group, silu, tile=32768, warps=4):
    """The session-32 fp8_gemv (its defaults: tile 32768, 4 warps), no bias."""
    from model_wrapper.kernels.common import DEFAULT, launch_args, uses_pdl

    M, K = x.shape
    N = weight.shape[0] // 2 if silu else weight.shape[0]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    gp, kgp = triton.next_power_of_2(group), triton.next_power_of_2(triton.cdiv(K, group))
    block_n = max(1, tile // (gp * kgp) // (2 if silu else 1))
    pdl = uses_pdl(x.device, DEFAULT)
    _old_fp8_gemv_kernel[(triton.cdiv(N, block_n),)](
        x, weight, weight_scale, x, out, N, K, x.stride(0), weight.stride(0), weight_scale.stride(0), out.stride(0),
        GROUP=group, GP=gp, KGP=kgp, M=M, BLOCK_N=block_n, SILU=silu, PDL=pdl, num_warps=warps, **launch_args(pdl))
    return out


if __name__ == "__main__":
    main()
