"""Probe: a K-looped, pipelined FP8 GEMV ("stream") against the register-tile GEMV
(model_wrapper/kernels/fp8_gemv.py) at 1 token, on Llama-3-8B's four projections (block scales
128 x 128), and a read-only twin of the stream kernel (the loads without the products: what a
pipelined stream of these bytes reaches on this card).

The register-tile GEMV holds whole rows a program (2 rows of down's 14336 columns): each program
re-reads all of x for them, and a program's bytes are in flight only until its loads land. Here a
program takes BN rows and walks K in BK-column tiles through a STAGES-deep pipeline (TMA tiles into
shared memory, or pointer loads Triton turns into cp.async), x's BK columns a step shared by the BN
rows; the first tile is loaded before the PDL wait, as the register-tile kernel loads its weights.

    source .gpu/device-setup.sh && python3 benchmarks/ab_fp8_gemv_stream.py --out $OUT
    python benchmarks/ab_fp8_gemv_stream.py --smoke        # CPU, Triton's interpreter, tiny shapes

Times: bench_fp8_gemm.time_calls (median CUDA-graph replay over weight copies of > 256 MB, calls
overlapping through PDL as a decode step's do); floor = (e4m3 weights + scales + x + y) / copy
bandwidth. Every result checked against the dequantized product (max rel. error).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
if "--smoke" in sys.argv:
    sys.path.insert(0, os.path.join(HERE, "tests"))
    import triton_interpret  # noqa: F401

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from model_wrapper.kernels.common import gdc_launch_dependents, gdc_wait, launch_args, silu_mul  # noqa: E402

SHAPES = {"qkv": (6144, 4096, False), "o": (4096, 4096, False), "gate_up+silu": (28672, 4096, True),
          "down": (4096, 14336, False)}
SMOKE_SHAPES = {"gate_up+silu": (64, 512, True), "down": (48, 768, False)}


@triton.jit
def _tile(x_ptr, w, s_ptr, srows, stride_s, k, BK: tl.constexpr, CH: tl.constexpr, GROUP: tl.constexpr,
          PER_GROUP: tl.constexpr, READ_ONLY: tl.constexpr):
    """One [BN, BK] e4m3 tile against x's columns k..k+BK -> [BN, BK // CH] fp32 (scaled per group)."""
    BN: tl.constexpr = w.shape[0]
    if READ_ONLY:
        b = w.to(tl.uint8, bitcast=True).to(tl.int32)
        return tl.sum(tl.reshape(b, [BN, BK // CH, CH]), axis=2).to(tl.float32)
    x = tl.load(x_ptr + k + tl.arange(0, BK)).to(tl.float32)
    part = tl.sum(tl.reshape(w.to(tl.float32) * x[None, :], [BN, BK // CH, CH]), axis=2)
    if PER_GROUP:
        if BK <= GROUP:
            part = part * tl.load(s_ptr + srows * stride_s + k // GROUP)[:, None]
        else:
            g = (k + tl.arange(0, BK // CH) * CH) // GROUP
            part = part * tl.load(s_ptr + srows[:, None] * stride_s + g[None, :])
    return part


@triton.jit
def _load(w_ptr, w_desc, row0, rows_safe, k, stride_w, BK: tl.constexpr, TMA: tl.constexpr):
    if TMA:
        return w_desc.load([row0, k])
    return tl.load(w_ptr + rows_safe[:, None] * stride_w + k + tl.arange(0, BK)[None, :])


@triton.jit
def _stream_gemv_kernel(x_ptr, w_ptr, w_desc, s_ptr, o_ptr, N, stride_w, stride_s, K: tl.constexpr,
                        GROUP: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, CH: tl.constexpr,
                        SILU: tl.constexpr, TMA: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
                        READ_ONLY: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BN + tl.arange(0, BN)
    ok = rows < N
    safe = tl.where(ok, rows, 0).to(tl.int64)
    usafe = safe + N
    PER_GROUP: tl.constexpr = GROUP < K
    # the first tile before the PDL wait (the kernel before may still be writing x)
    w0 = _load(w_ptr, w_desc, pid * BN, safe, 0, stride_w, BK, TMA)
    wu0 = w0
    if SILU:
        wu0 = _load(w_ptr, w_desc, N + pid * BN, usafe, 0, stride_w, BK, TMA)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    acc = _tile(x_ptr, w0, s_ptr, safe, stride_s, 0, BK, CH, GROUP, PER_GROUP, READ_ONLY)
    accu = acc
    if SILU:
        accu = _tile(x_ptr, wu0, s_ptr, usafe, stride_s, 0, BK, CH, GROUP, PER_GROUP, READ_ONLY)
    for k in tl.range(BK, K, BK, num_stages=STAGES):
        w = _load(w_ptr, w_desc, pid * BN, safe, k, stride_w, BK, TMA)
        acc += _tile(x_ptr, w, s_ptr, safe, stride_s, k, BK, CH, GROUP, PER_GROUP, READ_ONLY)
        if SILU:
            wu = _load(w_ptr, w_desc, N + pid * BN, usafe, k, stride_w, BK, TMA)
            accu += _tile(x_ptr, wu, s_ptr, usafe, stride_s, k, BK, CH, GROUP, PER_GROUP, READ_ONLY)
    y = tl.sum(acc, axis=1)
    if not PER_GROUP:
        y = y * tl.load(s_ptr + safe * stride_s)
    dtype = o_ptr.dtype.element_ty
    if SILU:
        yu = tl.sum(accu, axis=1)
        if not PER_GROUP:
            yu = yu * tl.load(s_ptr + usafe * stride_s)
        y = silu_mul(y.to(dtype), yu.to(dtype))
    tl.store(o_ptr + rows, y.to(dtype), mask=ok)


def stream_gemv(x, w, s, group, silu, bn=32, bk=128, ch=16, stages=4, warps=4, tma=True, read_only=False):
    """x [1, K] -> [1, N] (silu: [1, N // 2]); w e4m3 [N, K], s float32 [N, K // group]."""
    from model_wrapper.kernels.common import weight_descriptor

    K = x.shape[1]
    N = w.shape[0] // 2 if silu else w.shape[0]
    assert K % bk == 0 and (group >= K or group % bk == 0 or bk % group == 0)
    out = torch.empty(1, N, dtype=x.dtype, device=x.device)
    pdl = x.is_cuda
    tma = tma and x.is_cuda
    _stream_gemv_kernel[(triton.cdiv(N, bn),)](
        x, w, weight_descriptor(w, bn, bk) if tma else None, s, out, N, w.stride(0), s.stride(0), K=K,
        GROUP=min(group, K), BN=bn, BK=bk, CH=ch, SILU=silu, TMA=tma, STAGES=stages, PDL=pdl, READ_ONLY=read_only,
        num_warps=warps, **launch_args(pdl))
    return out


def variants(smoke: bool, shape: str) -> dict:
    if smoke:
        return {f"bn{bn} bk{bk}": dict(bn=bn, bk=bk, stages=2, warps=2, tma=False)
                for bn, bk in ((16, 128), (8, 256))}
    out = {}
    bns = (8, 16) if shape in ("o", "down", "qkv") else (16, 32)
    for bn, bk, st, tma in itertools.product(bns, (128, 256), (4, 6), (True, False)):
        if not tma and st == 4:
            continue
        out[f"bn{bn} bk{bk} s{st} {'tma' if tma else 'ptr'}"] = dict(bn=bn, bk=bk, stages=st, warps=4, tma=tma)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", os.path.join(HERE, "benchmarks", "results")))
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--variants-json", default=None, help='JSON {name: stream_gemv keywords}: these rows instead')
    args = ap.parse_args()
    from benchmarks.bench_forward import copy_bandwidth
    from benchmarks.bench_fp8_gemm import ROTATE_BYTES, time_calls
    from model_wrapper.kernels import fp8
    from model_wrapper.kernels.config import KernelConfig
    from model_wrapper.kernels.fp8_reference import dequantize_fp8_weight

    device = "cpu" if args.smoke else "cuda"
    dt = torch.float16 if args.smoke else torch.bfloat16
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes:
        shapes = {k: shapes[k] for k in args.shapes.split(",")}
    bw = copy_bandwidth(device)
    res = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
           "triton": triton.__version__, "copy_bandwidth_TBps": bw / 1e12, "rows": []}
    print(f"{res['device']}: copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    g = torch.Generator(device=device).manual_seed(0)
    group = 128
    base = KernelConfig()
    for shape, (N, K, silu) in shapes.items():
        kg = -(-K // group)
        copies = 2 if args.smoke else max(2, -(-ROTATE_BYTES // (N * K)))
        ws = [(torch.randn(N, K, device=device, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
              for _ in range(copies)]
        ss = [(torch.rand(-(-N // 128), kg, device=device, generator=g) / (64 * K**0.5)).repeat_interleave(
            128, 0)[:N].contiguous() for _ in range(copies)]
        wb = dequantize_fp8_weight(ws[0], ss[0], group, dt)
        n_out = N // 2 if silu else N
        x = torch.randn(1, K, device=device, generator=g).to(dt)
        want = x.float() @ wb.float().t()
        if silu:
            gate, up = want.to(dt).float().chunk(2, dim=-1)
            want = torch.nn.functional.silu(gate) * up
        floor_s = (N * K + N * kg * 4 + K * 2 + n_out * 2) / bw
        rows = {"default": lambda i: fp8.fp8_gemv(x, ws[i], ss[i], group, silu=silu, cfg=base)}
        vs = json.loads(args.variants_json) if args.variants_json else variants(args.smoke, shape)
        for name, kw in vs.items():
            rows[name] = (lambda kw: lambda i: stream_gemv(x, ws[i], ss[i], group, silu, **kw))(kw)
        for name in [n for n in vs if vs[n].get("tma", True) and vs[n].get("stages") == 6][:3]:
            rows["read-only " + name] = (lambda kw: lambda i: stream_gemv(x, ws[i], ss[i], group, silu, **kw))(
                {**vs[name], "read_only": True})
        rows["default again"] = rows["default"]
        for name, fn in rows.items():
            try:
                sec = time_calls(torch, fn, len(ws), device)
                err = float((fn(0).float() - want).abs().max() / want.abs().max())
            except Exception as e:  # noqa: BLE001
                print(f"{shape:13s} {name:26s} {type(e).__name__}: {str(e)[:200]}", flush=True)
                res["rows"].append(dict(shape=shape, variant=name, error=repr(e)[:300]))
                continue
            row = dict(shape=shape, N=N, K=K, variant=name, us=sec * 1e6, floor_us=floor_s * 1e6,
                       x_floor=sec / floor_s, weight_TBps=N * K / sec / 1e12, max_rel_err=err)
            res["rows"].append(row)
            print(f"{shape:13s} {name:26s} {row['us']:8.2f} us  x{row['x_floor']:5.2f} floor  "
                  f"{row['weight_TBps']:5.2f} TB/s  err {err:.1e}", flush=True)
        del ws, ss
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fp8_gemv_stream.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
