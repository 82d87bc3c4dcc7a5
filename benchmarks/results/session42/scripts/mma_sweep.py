"""Session 42: fp8_skinny_mma's launch (rows a program, K step, stages) at 4-16 tokens on Llama-3-8B's four projections,
block and per-channel e4m3 weights: us a layer (qkv + o + gate_up with SiLU + down), graphs of 32 layers, distinct
weights. Writes the best config per kind (summed over the token counts) for the step A/B."""
import itertools, json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.ab_gemv import graph_ms
from benchmarks.bench_forward import copy_bandwidth
from model_wrapper.kernels.config import KernelConfig
from model_wrapper.kernels.fp8_skinny_mma import fp8_skinny_mma

bw = copy_bandwidth("cuda")
print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
SHAPES = [("qkv", 6144, 4096, False), ("o", 4096, 4096, False), ("gate_up", 28672, 4096, True), ("down", 4096, 14336, False)]
L = 32
out = {}
for kind in ("block", "channel"):
    layers = []
    for name, N, K, silu in SHAPES:
        group = 128 if kind == "block" else K
        ws = [(torch.randn(N, K, device="cuda") * 0.05).to(torch.float8_e4m3fn) for _ in range(L)]
        ss = [torch.rand(N, K // group, device="cuda") * 1e-2 + 1e-3 for _ in range(L)]
        layers.append((name, K, silu, group, ws, ss))
    floor = sum(len(l[4]) * l[4][0].numel() for l in layers) / L / bw * 1e6
    kfield = "fp8_skinny_mma_block_k" if kind == "block" else "fp8_skinny_mma_row_block_k"
    kvals = (128, 256) if kind == "block" else (256, 512)
    rows = []
    for bn, st, bk, mp in itertools.product((32, 64, 128), (3, 4, 5), kvals, (128,)):
        cfg = KernelConfig(fp8_skinny_mma_block_n=bn, fp8_skinny_mma_stages=st, fp8_skinny_mma_min_programs=mp,
                           **{kfield: bk})
        row = dict(block_n=bn, stages=st, block_k=bk, min_programs=mp, us={})
        for M in (4, 8, 16):
            xs = {K: torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for K in (4096, 14336)}
            try:
                us = graph_ms(lambda: [fp8_skinny_mma(xs[K], ws[i], ss[i], group, silu=silu, cfg=cfg)
                                       for i in range(L) for _, K, silu, group, ws, ss in layers]) * 1e3 / L
            except Exception as e:
                us = float("inf")
            row["us"][M] = us
        rows.append(row)
        print(kind, bn, st, bk, mp, " ".join(f"M={m}: {u:7.2f}" for m, u in row["us"].items()), flush=True)
    d = KernelConfig()
    dflt = next(r for r in rows if (r["block_n"], r["stages"], r["block_k"], r["min_programs"]) ==
                (d.fp8_skinny_mma_block_n, d.fp8_skinny_mma_stages, getattr(d, kfield), d.fp8_skinny_mma_min_programs))
    best = min(rows, key=lambda r: sum(r["us"].values()))
    print(f"{kind}: floor {floor:.2f} us a layer; default {dflt['us']}; best {best}", flush=True)
    out[kind] = dict(floor_us=floor, rows=rows, default=dflt, best=best,
                     variant={"fp8_skinny_mma_block_n": best["block_n"], "fp8_skinny_mma_stages": best["stages"],
                              kfield: best["block_k"], "fp8_skinny_mma_min_programs": best["min_programs"]})
    del layers
    torch.cuda.empty_cache()
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "mma_sweep.json"), "w"), indent=1)
