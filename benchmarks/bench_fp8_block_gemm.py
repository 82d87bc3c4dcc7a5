"""Block-FP8 GEMMs (128 x 128 weight blocks, 1 x 128 activation groups) at Llama-3-8B's shapes:
cuBLASLt's block-scaled GEMM (torch._scaled_mm, the project's "scaled_mm_block" path) against
FlashInfer's DeepGEMM port (kernels/fp8_deepgemm.py) and bf16 F.linear on the dequantized weight.

    source .gpu/device-setup.sh && python3 benchmarks/bench_fp8_block_gemm.py --out $OUT
    python benchmarks/bench_fp8_block_gemm.py --out /tmp/blk    # CPU: writes the JSON, skips the GPU parts

For qkv 6144x4096, o 4096x4096, gate_up 28672x4096, down 4096x14336 at --tokens (default 4096
first, then 2048, 1024, 512, 256, 128, 64, 17): the GEMM alone on activations quantized
beforehand (the layout the producers write: e4m3 [Mp, K], scales [Mp, K/128] with stride(0) 1,
Mp = M rounded up to 16), us a call as the median CUDA-graph replay of calls rotating over
weight copies of > 256 MB (no L2 reuse between calls; the graph also shows the DeepGEMM call
captures); each shape's max relative error against the float64 product of the same e4m3
operands (bf16: of the same bf16 operands); the first call of each (shape, M) timed alone
(DeepGEMM: NVRTC compiles a kernel per tile config) and the runner module's build / load time;
and the chain sums (one layer's four GEMMs, and x 32 layers in ms). Writes fp8_block_gemm.json
and fp8_block_gemm.png to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)

from benchmarks.bench_fp8_gemm import time_calls  # noqa: E402  (a CUDA graph of calls over the weight copies)

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
TOKENS = (4096, 2048, 1024, 512, 256, 128, 64, 17)
LAYERS = 32
ROTATE_BYTES = 256 << 20


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "benchmarks", "results"))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--backends", default="cublaslt,deepgemm,bf16")
    return ap.parse_args()


def main():
    args = parse()
    import torch

    os.makedirs(args.out, exist_ok=True)
    res = {"tokens": [int(t) for t in args.tokens.split(",")], "shapes": {k: SHAPES[k] for k in args.shapes.split(",")},
           "backends": args.backends.split(","), "rows": [], "first_call_s": {}, "errors": {}}
    if not torch.cuda.is_available():
        res["skipped"] = "no CUDA device: the GEMMs run on the GPU only"
        save(res, args.out)
        print(res["skipped"])
        return
    dev = torch.device("cuda")
    res["device"] = torch.cuda.get_device_name(dev)
    res["torch"] = torch.__version__
    if "deepgemm" in res["backends"]:
        res["runner_build_s"] = runner_build(res, dev)
    ops_of = {name: operands(torch, N, K, dev) for name, (N, K) in res["shapes"].items()}
    for M in res["tokens"]:  # M first: the 4k chain is whole before the smaller steps start
        for name, (N, K) in res["shapes"].items():
            ops = ops_of[name]
            row = {"shape": name, "N": N, "K": K, "M": M}
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            for be in res["backends"]:
                try:
                    fn, check = call(torch, be, x, ops)
                    t0 = time.perf_counter()
                    y = fn(0)
                    torch.cuda.synchronize()
                    res["first_call_s"][f"{be}/{name}/{M}"] = time.perf_counter() - t0
                    row[f"{be}_err"] = check(y)
                    row[f"{be}_us"] = time_calls(torch, fn, len(ops["w"]), "cuda", replays=20) * 1e6
                except Exception as e:  # noqa: BLE001 (one refusal must not end the run: it is the result)
                    res["errors"][f"{be}/{name}/{M}"] = repr(e)[:500]
            res["rows"].append(row)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
            save(res, args.out)
    res["chain"] = chains(res)
    for c in res["chain"]:
        print("chain", json.dumps(c))
    save(res, args.out)
    plot(res, os.path.join(args.out, "fp8_block_gemm.png"))


def runner_build(res, dev) -> float | None:
    """Seconds to build (or load from FlashInfer's cache) and configure the DeepGEMM runner."""
    from model_wrapper.kernels import fp8_deepgemm

    t0 = time.perf_counter()
    try:
        fp8_deepgemm._runner(dev.index or 0)
    except Exception as e:  # noqa: BLE001
        res["errors"]["deepgemm/build"] = repr(e)[:2000]
        print("deepgemm runner build failed:", repr(e)[:2000], flush=True)
        return None
    return time.perf_counter() - t0


def operands(torch, N, K, dev) -> dict:
    """Weight copies (e4m3 + [N/128, K/128] block scales, and the dequantized bf16 weight) filling
    ROTATE_BYTES, so that consecutive calls find none of their weight in L2."""
    copies = max(2, -(-ROTATE_BYTES // (N * K)))
    w, blocks, wb = [], [], []
    for i in range(copies):
        g = torch.Generator(device=dev).manual_seed(i)
        q = (torch.randn(N, K, device=dev, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
        s = torch.rand(N // 128, K // 128, device=dev, generator=g) * 1e-3 + 1e-3
        w.append(q)
        blocks.append(s)
        if i < max(2, copies // 2):  # bf16: twice the bytes a copy
            wb.append((q.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.bfloat16))
    return {"w": w, "blocks": blocks, "wb": wb}


def call(torch, backend, x, ops):
    """-> (fn(i): the product with weight copy i, check(y): max rel. error of copy 0's product)."""
    from model_wrapper.kernels import fp8_deepgemm
    from model_wrapper.kernels.fp8 import _block_mm
    from model_wrapper.kernels.fp8_act import _quantize

    M, K = x.shape
    mp = -(-M // 16) * 16
    if backend == "bf16":
        wb = ops["wb"]
        fn = lambda i: torch.nn.functional.linear(x, wb[i % len(wb)])  # noqa: E731
        want = x.double() @ wb[0].double().t()
        return fn, lambda y: rel_err(y, want)
    a, a_s = _quantize(x, 128, None, rows=mp, outer=True)
    w, blocks = ops["w"], ops["blocks"]
    if backend == "cublaslt":
        fn = lambda i: _block_mm(a, a_s, M, w[i], blocks[i].t(), None, torch.bfloat16, None)  # noqa: E731
    elif backend == "deepgemm":
        fn = lambda i: fp8_deepgemm.block_mm(a, a_s, M, w[i], blocks[i].t())  # noqa: E731
    else:
        raise ValueError(f"--backends: unknown {backend!r}")
    ad = a[:M].double() * a_s[:M].double().repeat_interleave(128, dim=1)
    wd = w[0].double() * blocks[0].double().repeat_interleave(128, 0).repeat_interleave(128, 1)
    want = ad @ wd.t()
    return fn, lambda y: rel_err(y, want)


def rel_err(y, want) -> float:
    return float((y.double() - want).abs().max() / want.abs().max())


def chains(res) -> list[dict]:
    """Per M and backend: one layer's four GEMMs (us) and LAYERS layers (ms), where all four ran."""
    out = []
    for M in res["tokens"]:
        rows = [r for r in res["rows"] if r["M"] == M]
        c = {"M": M}
        for be in res["backends"]:
            ts = [r.get(f"{be}_us") for r in rows]
            if ts and all(t is not None for t in ts) and len(ts) == len(res["shapes"]):
                c[f"{be}_layer_us"] = sum(ts)
                c[f"{be}_model_ms"] = sum(ts) * LAYERS / 1e3
        out.append(c)
    return out


def save(res, out):
    with open(os.path.join(out, "fp8_block_gemm.json"), "w") as f:
        json.dump(res, f, indent=1)


def plot(res, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    shapes = list(res["shapes"])
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 4), squeeze=False)
    for ax, name in zip(axes[0], shapes):
        rows = sorted((r for r in res["rows"] if r["shape"] == name), key=lambda r: r["M"])
        for be in res["backends"]:
            pts = [(r["M"], r[f"{be}_us"]) for r in rows if f"{be}_us" in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=be)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{name} {res['shapes'][name]}")
        ax.set_xlabel("tokens")
        ax.set_ylabel("us a call")
        ax.legend()
    fig.suptitle(f"block-FP8 GEMMs, {res.get('device', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
