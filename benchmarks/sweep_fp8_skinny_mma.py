"""The e4m3 skinny GEMM's launch (kernels/fp8_skinny_mma.py: rows a program, pipeline stages, K step) at decode
batches of 4-16 tokens on Llama-3-8B's four projections, block (128 x 128) and per-channel e4m3 weights, on one GPU.

Per launch and token count: microseconds a layer (qkv, o, gate_up with its SiLU epilogue, down), the median replay of
a CUDA graph running the four over 32 layers' distinct random weights, against the floor of the layer's e4m3 weight
bytes over the copy bandwidth measured here. The best launch of each format (the least summed over the token counts)
is printed as KernelConfig overrides, ready for `bench_fp8.py --fp8-variants`. Session 42 picked its defaults this way
(benchmarks/RESULTS.md). `fp8_skinny_mma_block_n` is the most rows a program: fp8_skinny_mma halves it until
`fp8_skinny_mma_min_programs` programs, so a row count swept alone reaches only the shapes that many rows already fill
(session 42's sweep gave Llama-3-8B's qkv, o and down 32 rows whatever it asked for); `--per-shape` times each
projection alone, which is how session 45 saw it.

    source .gpu/device-setup.sh && python3 benchmarks/sweep_fp8_skinny_mma.py --out DIR   # -> fp8_skinny_mma.json/.png
    ... --grid '{"fp8_skinny_mma_narrow_warps": [2, 4], "fp8_skinny_mma_min_programs": [64, 128]}' --per-shape
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ab_gemv import graph_ms, save_results  # noqa: E402
from benchmarks.bench_forward import copy_bandwidth  # noqa: E402
from benchmarks.common import pyplot  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.fp8_act import quantize_fp8_per_token_group  # noqa: E402
from model_wrapper.kernels.fp8_reference import QuantizedActivation  # noqa: E402
from model_wrapper.kernels.fp8_skinny_mma import act_group, fp8_skinny_mma  # noqa: E402

SHAPES = (("qkv", 6144, 4096, False), ("o", 4096, 4096, False), ("gate_up", 28672, 4096, True),
          ("down", 4096, 14336, False))  # (name, N, K, SiLU epilogue)
LAYERS = 32
ROWS, STAGES = (32, 64, 128), (3, 4, 5)
K_STEPS = {"block": ("fp8_skinny_mma_block_k", (128, 256)), "channel": ("fp8_skinny_mma_row_block_k", (256, 512))}


def weights(kind: str) -> list:
    """LAYERS copies of each projection: e4m3 weight and float32 scales per row and 128 columns (block) or per row."""
    out = []
    for name, N, K, silu in SHAPES:
        group = 128 if kind == "block" else K
        ws = [(torch.randn(N, K, device="cuda") * 0.05).to(torch.float8_e4m3fn) for _ in range(LAYERS)]
        ss = [torch.rand(N, K // group, device="cuda") * 1e-2 + 1e-3 for _ in range(LAYERS)]
        out.append((name, K, silu, group, ws, ss))
    return out


def grid_for(kind: str, grid: dict | list | None) -> dict | list:
    """KernelConfig field -> values swept: `grid` (--grid), else rows x stages x the format's K step."""
    if grid:
        return grid
    field, k_steps = K_STEPS[kind]
    return {"fp8_skinny_mma_block_n": list(ROWS), "fp8_skinny_mma_stages": list(STAGES), field: list(k_steps)}


def sweep(kind: str, tokens, bw: float, grid: dict | list | None = None, per_shape: bool = False,
          prequantized: bool = False) -> dict:
    layers = weights(kind)
    floor_us = sum(ws[0].numel() for *_, ws, _ in layers) / bw * 1e6
    grid = grid_for(kind, grid)
    default = KernelConfig()
    rows = []
    launches = [dict(zip(g, values)) for g in (grid if isinstance(grid, list) else [grid])
                for values in itertools.product(*g.values())]
    fields = list(dict.fromkeys(f for launch in launches for f in launch))
    for launch in launches:
        cfg = KernelConfig(**launch)
        row = dict(launch, us={}, shape_us={},
                   default=all(getattr(default, f) == v for f, v in launch.items()))
        for M in tokens:
            xs = {K: torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _, K, *_ in layers}
            if prequantized:  # x quantized once outside the graph, as a producer would hand it over: the GEMMs alone
                groups = {K: act_group(K, group) for _, K, _, group, *_ in layers}
                xs = {K: QuantizedActivation(*quantize_fp8_per_token_group(x, groups[K]), M, groups[K], x.dtype)
                      for K, x in xs.items()}

            def chain(which):
                for name, K, silu, group, ws, ss in layers:
                    if which is None or name == which:
                        for w, s in zip(ws, ss):
                            fp8_skinny_mma(xs[K], w, s, group, silu=silu, cfg=cfg)
            try:
                row["us"][M] = graph_ms(lambda: chain(None)) * 1e3 / LAYERS
                if per_shape:  # each projection alone, 32 layers of it in a graph
                    row["shape_us"][M] = {name: graph_ms(lambda n=name: chain(n)) * 1e3 / LAYERS
                                          for name, *_ in layers}
            except Exception as e:  # a launch past the shared memory
                row["us"][M] = float("inf")
                print(f"  {kind} {launch} M={M}: {type(e).__name__}", flush=True)
        rows.append(row)
        tag = " (default)" if row["default"] else ""
        print(f"{kind:7s} " + " ".join(f"{f.replace('fp8_skinny_mma_', '')}={v}" for f, v in launch.items())
              + f"{tag:10s} " + "  ".join(f"M={m}: {u:7.2f}" for m, u in row["us"].items()), flush=True)
        for M, shapes in row["shape_us"].items():
            print(f"          M={M}: " + "  ".join(f"{n} {u:6.2f}" for n, u in shapes.items()), flush=True)
    best = min(rows, key=lambda r: sum(r["us"].values()))
    variant = {k: v for k, v in best.items() if k.startswith("fp8_")}
    print(f"{kind}: floor {floor_us:.2f} us a layer; best {variant}: {best['us']}", flush=True)
    if per_shape:
        for name, *_ in layers:
            b = min(rows, key=lambda r: sum(r["shape_us"].get(M, {}).get(name, float("inf")) for M in tokens))
            print(f"{kind}: best for {name}: {({k: v for k, v in b.items() if k.startswith('fp8_')})}: "
                  + "  ".join(f"M={M}: {b['shape_us'][M][name]:.2f}" for M in b["shape_us"]), flush=True)
    del layers
    torch.cuda.empty_cache()
    return dict(floor_us=floor_us, rows=rows, best=variant, grid=grid, fields=fields)


def plot(res: dict, path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(res["kinds"]), figsize=(7 * len(res["kinds"]), 4.5), squeeze=False)
    for ax, (kind, r) in zip(axes[0], res["kinds"].items()):
        names = ["/".join(str(x.get(f, "-")) for f in r["fields"]) for x in r["rows"]]
        for M in res["tokens"]:
            ax.plot(range(len(names)), [x["us"][M] / r["floor_us"] for x in r["rows"]], "o-", label=f"{M} tokens")
        for i, x in enumerate(r["rows"]):
            if x["default"]:
                ax.axvline(i, color="gray", ls="--", lw=1)
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
        fields = "/".join(f.replace("fp8_skinny_mma_", "") for f in r["fields"])
        ax.set(ylabel="us a layer / bytes floor", xlabel=f"{fields} (dashed: the default)",
               title=f"{kind} e4m3 weights")
        ax.legend()
    fig.suptitle(f"fp8_skinny_mma launches, Llama-3-8B layer, on {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--kinds", default="block,channel")
    ap.add_argument("--tokens", default="4,8,16")
    ap.add_argument("--grid", default=None, help="JSON: KernelConfig field -> values to sweep, or a list of "
                    "such grids (their launches in turn; default: rows x stages x the format's K step)")
    ap.add_argument("--per-shape", action="store_true", help="also time each projection alone")
    ap.add_argument("--prequantized", action="store_true", help="x quantized beforehand (a QuantizedActivation, as "
                    "a producer quantizing for skinny_mma hands it over): the GEMMs without their quantize kernels")
    args = ap.parse_args()
    bw = copy_bandwidth("cuda")
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    res = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, copy_bandwidth_TBps=bw / 1e12,
               tokens=tokens, prequantized=args.prequantized,
               kinds={k: sweep(k, tokens, bw, json.loads(args.grid) if args.grid else None, args.per_shape,
                               args.prequantized) for k in args.kinds.split(",")})
    save_results(res, args.out, "fp8_skinny_mma", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
