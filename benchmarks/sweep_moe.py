"""Launch constants and paths of the MoE layer on Qwen3-30B-A3B's shape (H 2048, I 768, 128 experts, top-8),
each variant beside the previous path in the same run.

    python3 benchmarks/sweep_moe.py --out benchmarks/results/moe_sweep.json            # decode (1-32 tokens)
    python3 benchmarks/sweep_moe.py --prefill --out ...                                 # + grouped-GEMM tiles

Decode: LAYERS sparse MLP layers (router projection, routing, experts: SparseMoE.forward on
FlashInferKernels, each layer its own random weights, so nothing stays in L2) run one after another on the
same input in one CUDA graph; the median replay per layer against the bytes a layer must read (the router and
the experts its tokens reach, bf16 or e4m3 + scales) at copy bandwidth. Rows (variant):
  old          the previous defaults: torch's routing ops, the K-looped decode kernels (moe_decode.py)
  new          KernelConfig() as it stands; new-fp8 the same on e4m3 experts
  no-pdl       new without programmatic dependent launch
  route-torch  new with torch's routing ops;  loop: new with the K-looped decode kernels
  gemv         the register-tile decode path forced where the default sorts (bf16 from 8 tokens, fp8 from 2)
  sorted       the sort and grouped GEMMs forced where the default takes the decode path
  tile         register-tile sizes / warps of the decode path (gate_up tile, down tile, warps), bf16 and fp8
  route-warps  the routing kernel's warps;  grouped: 16-row grouped-GEMM tilings of the sorted path (16, 32)
Kernels per layer are counted with torch.profiler (one eager layer) for old and new.
--switches: only new against SWITCHES / FP8_SWITCHES (the register-tile GEMVs' load order and warps, the routing's
top-k; FP8: the rounding and the tiles' size) at 1-4 tokens (--only, --tokens, --rounds narrow it); with
--only experts-only also the layers' experts alone on routings computed beforehand (what the router costs on top).
Prefill (--prefill, or --prefill-only without the decode rows): fused_moe alone at 128 / 1024 / 4096 tokens
(--prefill-tokens) over grouped-GEMM tilings, for bf16 experts and, with --prefill-kinds, FP8 experts weight-only
(fp8) and W8A8 (w8a8), each beside its default launch, with TFLOP/s and the error against the default's output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ab_gemv import graph_ms  # noqa: E402
from benchmarks.bench_forward import copy_bandwidth  # noqa: E402
from benchmarks.bench_moe import OLD_MOE, quantize_fp8_blockwise  # noqa: E402
from model_wrapper.kernels.config import KernelConfig  # noqa: E402
from model_wrapper.kernels.moe import fused_moe, takes_decode_path  # noqa: E402
from model_wrapper.layers.kernels import FlashInferKernels  # noqa: E402
from model_wrapper.layers.moe import MoESpec, SparseMoE  # noqa: E402

H, I, E, K = 2048, 768, 128, 8
LAYERS = 4
# the path before this sweep's kernels: torch routing, K-looped decode kernels
PREVIOUS = dataclasses.replace(KernelConfig(), moe_fused_route=False, moe_decode_gemv=False)
FORCE_DECODE = dict(moe_decode_pairs=1 << 30, moe_fp8_decode_pairs=1 << 30, moe_decode_pairs_per_expert=1 << 30)
# register-tile decode path: (gate_up tile, down tile, warps)
GEMV_TILES = [(16384, 16384, 8), (8192, 8192, 8), (32768, 32768, 8), (16384, 16384, 4), (8192, 8192, 4)]
FP8_TILES = 3  # the first four also on e4m3 experts (every tile is a compile)
ROUTE_WARPS = (2, 8)
# grouped GEMM (sorted path at 16-32 tokens; prefill): (block_m, block_n, block_k, warps, stages)
CANDIDATES = [(16, 64, 128, 4, 3), (16, 32, 128, 4, 3), (16, 64, 64, 4, 4), (16, 128, 64, 4, 3), (16, 64, 256, 4, 2)]
PREFILL_CANDIDATES = [(64, 64, 64, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4)]


def expert_bytes(fp8: bool) -> float:
    """Bytes of one expert: its weights (2 or 1 a weight) and, for FP8, the float32 scales."""
    if not fp8:
        return 3 * H * I * 2
    return 3 * H * I + (2 * I * -(-H // 128) + H * -(-I // 128)) * 4


def make_layers(fp8: bool, g: torch.Generator) -> list[SparseMoE]:
    layers = []
    for _ in range(LAYERS):
        with torch.device("cuda"):
            m = SparseMoE(MoESpec(E, K, I, norm_topk_prob=True), H).to(torch.bfloat16).requires_grad_(False)
        m.gate.weight.normal_(0, 0.02, generator=g)
        ex = m.experts
        ex.gate_up_proj.normal_(0, 0.02, generator=g)
        ex.down_proj.normal_(0, 0.02, generator=g)
        if fp8:
            for name in ("gate_up_proj", "down_proj"):
                q, s = quantize_fp8_blockwise(getattr(ex, name).data)
                setattr(ex, name, torch.nn.Parameter(q, requires_grad=False))
                setattr(ex, name + "_scale", s)
        layers.append(m)
    return layers


def kernels_for(cfg: KernelConfig) -> FlashInferKernels:
    return FlashInferKernels(torch.ones(64, device="cuda"), torch.bfloat16, 16, cfg)


def count_kernels(layer: SparseMoE, x: torch.Tensor, cfg: KernelConfig) -> list[str]:
    """The CUDA kernels one eager call of the layer launches (after a warm-up call)."""
    kern = kernels_for(cfg)
    layer(x, None, kern)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        layer(x, None, kern)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def decode_sweep(rows: list, bw: float, g: torch.Generator) -> dict:
    layers = {False: make_layers(False, g), True: make_layers(True, g)}
    router = E * H * 2
    counts = {}

    def measure(T, name, cfg, x, fp8=False, **extra):
        kern = kernels_for(cfg)
        ls = layers[fp8]
        # the experts a layer's tokens reach (the floor reads each once), averaged over the layers
        touched = sum(torch.topk(x @ l.gate.weight.T, K).indices.unique().numel() for l in ls) / LAYERS
        floor_us = (router + touched * expert_bytes(fp8)) / bw * 1e6
        try:
            us = graph_ms(lambda: [l(x, None, kern) for l in ls]) * 1e3 / LAYERS
        except Exception as e:  # a tile that does not fit the SM's registers / shared memory
            print(f"T={T} {name} {extra}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            return
        rows.append(dict(part="decode", tokens=T, variant=name, us=us, floor_us=floor_us, ratio=us / floor_us,
                         experts_touched=touched, **extra))
        print(f"T={T:3d} {name:12s} {us:7.1f} us/layer  floor {floor_us:6.1f}  x{us / floor_us:5.2f}  "
              f"{extra if extra else ''}", flush=True)

    new = KernelConfig()
    for T in (1, 2, 4, 8, 16, 32):
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
        measure(T, "old", PREVIOUS, x)
        measure(T, "new", new, x)
        measure(T, "new-fp8", new, x, fp8=True)
        measure(T, "old-fp8", PREVIOUS, x, fp8=True)
        if T in (1, 8, 32):
            measure(T, "no-pdl", dataclasses.replace(new, pdl=False), x)
            measure(T, "route-torch", dataclasses.replace(new, moe_fused_route=False), x)
        decode = takes_decode_path(T * K, E, new)
        if decode:
            measure(T, "loop", dataclasses.replace(new, moe_decode_gemv=False), x)
            measure(T, "sorted", dataclasses.replace(new, moe_decode_pairs=0), x)
        else:
            measure(T, "gemv", dataclasses.replace(new, **FORCE_DECODE), x)
        if takes_decode_path(T * K, E, new, fp8=True):
            measure(T, "sorted-fp8", dataclasses.replace(new, moe_fp8_decode_pairs=0), x, fp8=True)
        else:
            measure(T, "gemv-fp8", dataclasses.replace(new, **FORCE_DECODE), x, fp8=True)
        if T in (1, 4):
            for i, (tile, down_tile, warps) in enumerate(GEMV_TILES):
                cfg = dataclasses.replace(new, **FORCE_DECODE, moe_gemv_tile=tile, moe_gemv_down_tile=down_tile,
                                          moe_gemv_warps=warps)
                extra = dict(tile=tile, down_tile=down_tile, warps=warps)
                measure(T, "tile", cfg, x, **extra)
                if i < FP8_TILES:
                    measure(T, "tile-fp8", cfg, x, fp8=True, **extra)
        if T in (1, 32):
            for warps in ROUTE_WARPS:
                measure(T, "route-warps", dataclasses.replace(new, moe_route_warps=warps), x, route_warps=warps)
        if T in (16, 32):
            for bm, bn, bk, warps, stages in CANDIDATES:
                cfg = dataclasses.replace(new, moe_decode_pairs=0, moe_block_m=bm, moe_block_n=bn, moe_block_k=bk,
                                          moe_warps=warps, moe_stages=stages)
                measure(T, "grouped", cfg, x, block_m=bm, block_n=bn, block_k=bk, warps=warps, stages=stages)
        if T in (1, 32):
            for name, cfg in (("old", PREVIOUS), ("new", new)):
                names = count_kernels(layers[False][0], x, cfg)
                counts[f"T={T} {name}"] = names
                print(f"T={T} {name}: {len(names)} kernels a layer: {names}", flush=True)
    return counts


# session 34's switches of the register-tile decode path, A/B against new (--switches): bf16 (the gate_up GEMV's
# loads in ptxas's order) and on e4m3 experts (the one-value rounding, tiles of the bf16 tiles' bytes, both)
# session 36: the expert GEMVs at 4 warps (KernelConfig.moe_gemv_warps), bf16 and FP8
SWITCHES = {"lf-off": dict(moe_gemv_loads_first=False), "route-rank": dict(moe_route_sort=False),
            "w4": dict(moe_gemv_warps=4)}
FP8_SWITCHES = {"w4-fp8": dict(moe_gemv_warps=4), "unpacked-fp8": dict(moe_fp8_packed_round=False, moe_fp8_direct=False),
                "t32k-fp8": dict(moe_fp8_gemv_tile=32768, moe_fp8_gemv_down_tile=32768, moe_fp8_direct=False),
                "t16k-fp8": dict(moe_fp8_gemv_tile=16384, moe_fp8_gemv_down_tile=16384, moe_fp8_direct=False),
                "s33-fp8": dict(moe_fp8_packed_round=False, moe_fp8_gemv_tile=32768, moe_fp8_gemv_down_tile=32768,
                                moe_fp8_direct=False),
                "dequant-fp8": dict(moe_fp8_direct=False, moe_fp8_decode_pairs=8),
                "direct32-fp8": dict(moe_fp8_direct_tile=32768, moe_fp8_direct_down_tile=32768),
                "w8a8-fp8": dict(moe_fp8_w8a8=True),  # (session 40: the sorted path's grouped GEMMs W8A8)
                "wonly-fp8": dict(moe_fp8_w8a8=False)}  # (session 41: W8A8 is the default; this, weight-only)
# (session 41's lag-fp8, KernelConfig.moe_w8a8_lag, W8A8 products scaled a K step late: 1-3% slower at 2-128
# tokens on an H100 in session 42, removed)
SORTED_FP8_SWITCHES = {"w8a8-fp8", "wonly-fp8"}  # the FP8 switches past the decode path (the others: on it)


def switch_sweep(rows: list, bw: float, g: torch.Generator, only: set | None = None, tokens=(1, 2, 4),
                 rounds: int = 2) -> None:
    """new against each of SWITCHES (those named in only, if given) at 1, 2 and 4 tokens (or tokens), and on e4m3
    experts against FP8_SWITCHES where they take the decode path (past it: SORTED_FP8_SWITCHES), rounds times in
    turn (the second round shows the spread), the same layers and floors as decode_sweep."""
    layers = {False: make_layers(False, g), True: make_layers(True, g)}
    router = E * H * 2
    new = KernelConfig()
    for T in tokens:
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
        cases = [("new", new, False)] + [(n, dataclasses.replace(new, **kw), False) for n, kw in SWITCHES.items()
                                         if only is None or n in only]
        decode_fp8 = takes_decode_path(T * K, E, new, fp8=True)
        fp8_switches = {n: kw for n, kw in FP8_SWITCHES.items() if (only is None or n in only)
                        and (decode_fp8 or n in SORTED_FP8_SWITCHES)}
        if decode_fp8 or fp8_switches:
            cases += [("new-fp8", new, True)] + [(n, dataclasses.replace(new, **kw), True)
                                                 for n, kw in fp8_switches.items()]
        # diagnostic rows: the layers' experts alone (fused_moe on routings computed beforehand, no router kernel in the
        # graph): what new spends beyond them is the router and its hand-off to the experts
        for fp8 in (False, True) if only is None or "experts-only" in only else ():
            if not fp8 or takes_decode_path(T * K, E, new, fp8=True):
                cases.append(("experts-only" + ("-fp8" if fp8 else ""), None, fp8))
        for rnd in range(1, rounds + 1):
            for name, cfg, fp8 in cases:
                ls = layers[fp8]
                touched = sum(torch.topk(x @ l.gate.weight.T, K).indices.unique().numel() for l in ls) / LAYERS
                if cfg is None:
                    routed = [kernels_for(new).moe_router(x, l.gate.weight, l.spec) for l in ls]
                    floor_us = touched * expert_bytes(fp8) / bw * 1e6
                    us = graph_ms(lambda: [fused_moe(x, w, ids, l.experts.gate_up_proj, l.experts.down_proj, new,
                                                     l.experts.gate_up_proj_scale, l.experts.down_proj_scale)
                                           for (w, ids), l in zip(routed, ls)]) * 1e3 / LAYERS
                else:
                    kern = kernels_for(cfg)
                    floor_us = (router + touched * expert_bytes(fp8)) / bw * 1e6
                    us = graph_ms(lambda: [l(x, None, kern) for l in ls]) * 1e3 / LAYERS
                rows.append(dict(part="switches", tokens=T, variant=name, round=rnd, us=us, floor_us=floor_us,
                                 ratio=us / floor_us))
                print(f"T={T:3d} round {rnd} {name:12s} {us:7.1f} us/layer  floor {floor_us:6.1f}  "
                      f"x{us / floor_us:5.2f}", flush=True)


# FP8 experts' prefill tiles: weight-only dequantizes a [BLOCK_K <= 128] weight tile a step; W8A8 takes BLOCK_K 128
PREFILL_FP8_CANDIDATES = [(64, 64, 128, 4, 3), (128, 64, 128, 8, 3), (64, 128, 128, 8, 3), (64, 64, 128, 4, 4),
                          (128, 64, 128, 4, 3), (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (32, 64, 128, 4, 4)]
# W8A8 (BLOCK_K 128): around session 41's first sweep's best, 64 x 64 at 4 warps, 3 stages
PREFILL_W8A8_CANDIDATES = [(64, 64, 128, 4, 3), (64, 64, 128, 4, 2), (64, 64, 128, 4, 4), (64, 64, 128, 8, 3),
                           (64, 32, 128, 4, 3), (64, 128, 128, 4, 3), (64, 128, 128, 8, 4), (128, 64, 128, 8, 4),
                           (128, 32, 128, 4, 3), (32, 64, 128, 4, 3), (16, 64, 128, 4, 3),
                           # the small tiles (decode batches 2-256): deeper pipelines, wider
                           (16, 64, 128, 4, 4), (16, 64, 128, 4, 5), (16, 128, 128, 4, 3), (16, 32, 128, 4, 4)]
PREFILL_KINDS = ("bf16", "fp8", "w8a8")


def prefill_sweep(rows: list, bw: float, g: torch.Generator, kinds=("bf16",), tokens=(128, 1024, 4096),
                  tiles: list | None = None) -> None:
    """fused_moe alone over grouped-GEMM tilings (moe_small_pairs raised so the moe_block_* set takes every
    step): bf16 experts, FP8 weight-only ("fp8") and W8A8 ("w8a8", KernelConfig.moe_fp8_w8a8) on e4m3 experts.
    Each tile's output is compared with the default tile's of the same kind (max |diff| / max |ref|); the
    first row of every kind and T is the default launch (variant "default"). tiles: the candidates of every kind
    instead of the lists above ((block_m, block_n, block_k, warps, stages); W8A8 needs block_k 128)."""
    gate_up = torch.randn(E, 2 * I, H, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    down = torch.randn(E, H, I, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    gq, gs = quantize_fp8_blockwise(gate_up)
    dq, ds = quantize_fp8_blockwise(down)
    for T in tokens:
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=g)
        w, ids = torch.softmax(torch.randn(T, E, device="cuda", generator=g), -1).topk(K, -1)
        w = (w / w.sum(-1, keepdim=True)).to(torch.bfloat16)
        flops = 2 * T * K * 3 * H * I
        rows_e = max(1, T * K // E)  # torch.bmm on balanced groups (bench_moe's grouped-GEMM chain), for scale
        xe, ae = (torch.randn(E, rows_e, n, device="cuda", dtype=torch.bfloat16, generator=g) for n in (H, I))
        wgu, wd = gate_up.transpose(1, 2), down.transpose(1, 2)
        us = graph_ms(lambda: (torch.bmm(xe, wgu), torch.bmm(ae, wd))) * 1e3
        rows.append(dict(part="prefill", kind="bmm", tokens=T, variant="bmm", us=us, tflops=flops / us / 1e6))
        print(f"T={T:5d} bf16  torch.bmm balanced : {us:8.1f} us  {flops / us / 1e6:6.1f} TFLOP/s", flush=True)
        for kind in kinds:
            fp8 = kind != "bf16"
            floor_us = ids.unique().numel() * expert_bytes(fp8) / bw * 1e6
            args = (gq, dq, gs, ds) if fp8 else (gate_up, down)
            base = dataclasses.replace(KernelConfig(), moe_fp8_w8a8=kind == "w8a8")
            cands = [None] + (tiles if tiles is not None else {"bf16": PREFILL_CANDIDATES, "fp8": PREFILL_FP8_CANDIDATES,
                                                               "w8a8": PREFILL_W8A8_CANDIDATES}[kind])
            ref = None
            for cand in cands:
                if cand is None:
                    cfg = base
                else:
                    bm, bn, bk, warps, stages = cand
                    cfg = dataclasses.replace(base, moe_small_pairs=1 << 30, moe_block_m=bm, moe_block_n=bn,
                                              moe_block_k=bk, moe_warps=warps, moe_stages=stages)
                try:
                    y = fused_moe(x, w, ids, *args[:2], cfg, *args[2:])
                    us = graph_ms(lambda: fused_moe(x, w, ids, *args[:2], cfg, *args[2:])) * 1e3
                except Exception as e:  # noqa: BLE001  (a tile that does not build costs its row)
                    print(f"T={T:5d} {kind:5s} tile {cand}: failed {e!r}"[:300], flush=True)
                    continue
                ref = y.float() if ref is None else ref
                err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                row = dict(part="prefill", kind=kind, tokens=T, variant="default" if cand is None else "tile", us=us,
                           floor_us=floor_us, tflops=flops / us / 1e6, err_vs_default=err)
                if cand is not None:
                    row.update(block_m=bm, block_n=bn, block_k=bk, warps=warps, stages=stages)
                rows.append(row)
                print(f"T={T:5d} {kind:5s} {'default' if cand is None else 'tile %d %d %d %d %d' % cand:18s}: "
                      f"{us:8.1f} us  {flops / us / 1e6:6.1f} TFLOP/s  err {err:.1e}  (bytes floor {floor_us:.1f})",
                      flush=True)


def plot_prefill(rows: list, path: str) -> None:
    """The prefill tiles' TFLOP/s per kind and token count (the default launch hatched) -> path (PNG)."""
    from benchmarks.common import pyplot

    plt = pyplot()
    pre = [r for r in rows if r["part"] == "prefill"]
    if plt is None or not pre:
        return
    kinds = [k for k in PREFILL_KINDS if any(r.get("kind", "bf16") == k for r in pre)]
    tokens = sorted({r["tokens"] for r in pre})
    fig, axes = plt.subplots(len(kinds), 1, figsize=(12, 3.2 * len(kinds)), squeeze=False)
    for ax, kind in zip(axes[:, 0], kinds):
        for i, T in enumerate(tokens):
            rs = [r for r in pre if r.get("kind", "bf16") == kind and r["tokens"] == T]
            xs = [i + (j - len(rs) / 2) * 0.8 / max(1, len(rs)) for j in range(len(rs))]
            ax.bar(xs, [r.get("tflops", 0.0) for r in rs], width=0.8 / max(1, len(rs)),
                   color=[f"C{j % 10}" for j in range(len(rs))],
                   hatch=None, edgecolor=["black" if r["variant"] == "default" else "none" for r in rs])
            best = max(rs, key=lambda r: r.get("tflops", 0.0)) if rs else None
            if best is not None:
                label = "default" if best["variant"] == "default" else "%d x %d x %d, %dw %ds" % tuple(
                    best[f] for f in ("block_m", "block_n", "block_k", "warps", "stages"))
                ax.annotate(f"best {label}", (i, best.get("tflops", 0.0)), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(tokens)), [f"T={T}" for T in tokens])
        ax.set(ylabel="TFLOP/s", title=f"fused_moe {kind} experts, one Qwen3-30B-A3B layer: tiles (outlined: default)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/moe_sweep.json")
    ap.add_argument("--prefill", action="store_true", help="also the grouped-GEMM tiles at 128-4096 tokens")
    ap.add_argument("--prefill-only", action="store_true", help="the grouped-GEMM tiles alone (no decode rows)")
    ap.add_argument("--prefill-kinds", default="bf16", help=f"with --prefill: expert kinds of {PREFILL_KINDS}")
    ap.add_argument("--prefill-tokens", default="128,1024,4096", help="with --prefill: the token counts")
    ap.add_argument("--prefill-tiles", default="", help="with --prefill: a JSON list of [block_m, block_n, block_k, "
                    "warps, stages] tried for every kind instead of the built-in lists")
    ap.add_argument("--switches", action="store_true", help="only the decode path's switches against new, 1-4 tokens")
    ap.add_argument("--only", default="", help="with --switches: the switches to run (comma-separated; default all)")
    ap.add_argument("--tokens", default="1,2,4", help="with --switches: the token counts")
    ap.add_argument("--rounds", type=int, default=2, help="with --switches: rounds of every case in turn")
    args = ap.parse_args()
    bw = copy_bandwidth("cuda")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name(0)}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    if args.switches:
        switch_sweep(rows, bw, g, set(args.only.split(",")) if args.only else None,
                     tuple(int(t) for t in args.tokens.split(",")), args.rounds)
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(0), bandwidth_TBps=bw / 1e12, layers=LAYERS, rows=rows),
                      f, indent=1)
        return
    counts = {} if args.prefill_only else decode_sweep(rows, bw, g)
    if args.prefill or args.prefill_only:
        kinds = tuple(args.prefill_kinds.split(","))
        if not set(kinds) <= set(PREFILL_KINDS):
            ap.error(f"--prefill-kinds: expected some of {PREFILL_KINDS}, got {args.prefill_kinds!r}")
        tiles = [tuple(t) for t in json.loads(args.prefill_tiles)] if args.prefill_tiles else None
        prefill_sweep(rows, bw, g, kinds, tuple(int(t) for t in args.prefill_tokens.split(",")), tiles)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(0), bandwidth_TBps=bw / 1e12, layers=LAYERS, rows=rows,
                       kernels=counts), f, indent=1)
    plot_prefill(rows, os.path.splitext(args.out)[0] + ".png")
    print("\nper layer (us, x its bytes floor): old -> new, bf16 and fp8")
    for T in sorted({r["tokens"] for r in rows if r["part"] == "decode"}):
        by = {r["variant"]: r for r in rows if r["tokens"] == T and r["part"] == "decode"}
        line = "  ".join(f"{v} {by[v]['us']:.1f} (x{by[v]['ratio']:.2f})" for v in ("old", "new", "old-fp8", "new-fp8")
                         if v in by)
        print(f"T={T:3d}  {line}")


if __name__ == "__main__":
    main()
