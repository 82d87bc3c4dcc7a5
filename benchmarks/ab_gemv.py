"""A/B of the projections of one- and two-token decode steps: Triton's GEMV (weights read before
the PDL wait) with Triton's residual add + RMSNorm before it, against cuBLAS with FlashInfer's
norm, and the GEMV with FlashInfer's norm in between. Llama-3-8B-shaped bf16, CUDA graphs, batch 1
and 2, context 512-4096, beside the floor = (weights + KV read) / copy bandwidth of this run.
Per case: the wall clock of 30 forward_tensor calls (bench_forward's measure) and the median
CUDA-event time of 50 replays of the captured graph (no host work); two interleaved rounds.
First, the projections alone: the model's own qkv / o / gate_up / down of every layer and
lm_head (15.0 GB), back to back in one graph, through cuBLAS and through the GEMV at 1, 2 and 4
tokens, against the copy bandwidth.

    source .gpu/device-setup.sh && python3 benchmarks/ab_gemv.py > benchmarks/results/gemv.log
    python3 benchmarks/ab_gemv.py --per-projection [--tokens 1,2]   # each projection alone, KernelConfig variants
    python benchmarks/ab_gemv.py --per-projection --smoke   # CPU, Triton's interpreter, shapes / 64

writes gemv.json and gemv.png (--per-projection: gemv_projections.json) to benchmarks/results (or to
$OUT when OUT is set).
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if "--smoke" in sys.argv:  # Triton's interpreter, set up before any kernel is defined
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import triton_interpret  # noqa: F401
from benchmarks.bench_forward import copy_bandwidth, decode_step, timed
from benchmarks.common import LLAMA3_8B, pyplot, random_text_generator
from model_wrapper.kernels.gemv import gemv

VARIANTS = {  # name: (GEMV_MAX_TOKENS, Triton's add + RMSNorm)
    "cuBLAS + FlashInfer norm": (0, False),
    "GEMV + FlashInfer norm": (2, False),
    "GEMV + Triton norm (default)": (2, True),
}


def replay_ms(graph, n=50) -> float:
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(n):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[n // 2]


def graph_ms(run, n=20) -> float:
    """Median replay time of one graph capturing run() (run once before, on a side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return replay_ms(graph, n)


def decode_case(gen, kv, perm, B, ctx, weight_bytes, bw, block_size=16) -> dict:
    """One decode case (graphs on): the wall clock of 30 forward_tensor calls (bench_forward's
    measure) and the median replay of its captured graph, beside the floor of this run."""
    graphs = gen.model_wrapper.graphs
    wall = timed(decode_step(gen, kv, block_size, B, ctx, perm), iters=30, warmup=3) * 1e3
    rep = replay_ms(graphs._graphs[graphs.bucket_for(B)].graph)
    floor = (weight_bytes + B * ctx * gen.kv_cache_spec.bytes_per_token) / bw * 1e3
    return {"batch": B, "context": ctx, "wall_ms": wall, "replay_ms": rep, "floor_ms": floor, "wall_ratio": wall / floor,
            "replay_ratio": rep / floor}


def run_variants(gen, kv, perm, variants: dict, configure, batches, contexts, weight_bytes, bw, block_size=16):
    """-> decode cases of every variant (configure(*settings) applies one; its graphs are then
    recaptured) at every batch and context, over two interleaved rounds; each printed."""
    graphs, cases = gen.model_wrapper.graphs, []
    for rnd in range(2):
        for name, settings in variants.items():
            configure(*settings)
            graphs.drop()  # recapture with this variant
            for B in batches:
                for ctx in contexts:
                    c = {"round": rnd, "variant": name, **decode_case(gen, kv, perm, B, ctx, weight_bytes, bw, block_size)}
                    print(f"round {rnd} {name:30s} B={B:2d} ctx={ctx:4d}: step {c['wall_ms']:.3f} ms "
                          f"(x{c['wall_ratio']:.3f}), replay {c['replay_ms']:.3f} ms (x{c['replay_ratio']:.3f}), "
                          f"floor {c['floor_ms']:.3f} ms", flush=True)
                    cases.append(c)
    return cases


def plot_variants(ax, cases, variants, where: dict, x: str, ratio: str) -> None:
    """One line per variant on ax: the best (over rounds) `ratio` of the cases matching `where`, against `x`."""
    for name in variants:
        rows = [c for c in cases if c["variant"] == name and all(c[k] == v for k, v in where.items())]
        xs = sorted({c[x] for c in rows})
        ax.plot(xs, [min(c[ratio] for c in rows if c[x] == v) for v in xs], "o-", label=name)


def decode_panels(fig, axes, res, variants, ratio: str, ylabel: str, path: str) -> None:
    """The decode-step panels on axes (context 512, then 2048: one line per variant against the
    batch), then the figure's title, saved to path."""
    for ax, ctx in zip(axes, (512, 2048)):
        plot_variants(ax, res["cases"], variants, {"context": ctx}, "batch", ratio)
        ax.set(xlabel="batch", xscale="log", ylabel=ylabel, title=f"decode step, context {ctx}")
        ax.legend(fontsize=8)
    fig.suptitle(f"Llama-3-8B-shaped bf16, CUDA graphs, on {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def save_results(res: dict, out: str, stem: str, plot) -> None:
    """res -> out/stem.json, plot(res, path) -> out/stem.png."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, stem + ".json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(out, stem + ".png"))


def projections_ms(mw, T, linear) -> float:
    """Median replay time of one graph running every projection of the model on T-token inputs."""
    layers = mw.model.model.layers
    mods = [m for layer in layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                                             layer.mlp.down_proj)] + [mw.model.lm_head]
    xs = {m.in_features: torch.randn(T, m.in_features, device="cuda", dtype=mw.dtype) for m in mods}

    def run():
        for m in mods:
            linear(xs[m.in_features], m.weight)

    return graph_ms(run)


PER_PROJECTION = {"8B qkv": (6144, 4096, False), "8B o": (4096, 4096, False), "8B gate_up+silu": (28672, 4096, True),
                  "8B down": (4096, 14336, False), "30B-A3B qkv": (5120, 2048, False), "30B-A3B o": (2048, 4096, False)}
GEMV_VARIANTS = {"default": {}, "t8k": dict(gemv_tile=8192), "t32k": dict(gemv_tile=32768), "w4": dict(gemv_warps=4),
                 "r2": dict(gemv_rounds=2), "r4": dict(gemv_rounds=4)}  # (rounds: 1 token, K <= 8192)


def per_projection(out: str, tokens=(1, 2), smoke: bool = False) -> None:
    """Each projection alone (PER_PROJECTION: Llama-3-8B's four, Qwen3-30B-A3B's qkv and o; bf16) through
    the GEMV under each of GEMV_VARIANTS' KernelConfig overrides, us a call in a graph of calls rotating
    over > 256 MB of weight copies (bench_fp8_gemm.time_calls; consecutive calls overlap through PDL as a
    step's projections do), x the floor (weight + x + y bytes over the copy bandwidth); each result
    against the fp32 product. Writes gemv_projections.json. smoke: on the CPU under Triton's interpreter,
    shapes / 64 in fp16 (a check that the script runs)."""
    from benchmarks.bench_fp8_gemm import ROTATE_BYTES, time_calls
    from model_wrapper.kernels.config import KernelConfig

    device, dt = ("cpu", torch.float16) if smoke else ("cuda", torch.bfloat16)
    bw = copy_bandwidth(device)
    res = {"device": "cpu (interpreter)" if smoke else torch.cuda.get_device_name(0), "torch": torch.__version__,
           "copy_bandwidth_TBps": bw / 1e12, "variants": GEMV_VARIANTS, "rows": []}
    print(f"{res['device']}: copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    for shape, (N, K, silu) in PER_PROJECTION.items():
        N, K = (N // 64, K // 64) if smoke else (N, K)
        copies = 2 if smoke else max(2, -(-ROTATE_BYTES // (N * K * 2)))
        ws = [torch.randn(N, K, device=device, dtype=dt) / K**0.5 for _ in range(copies)]
        for T in tokens:
            x = torch.randn(T, K, device=device, dtype=dt)
            want = x.float() @ ws[0].float().t()
            if silu:
                gate, up = want.to(dt).float().chunk(2, dim=-1)
                want = torch.nn.functional.silu(gate) * up
            n_out = N // 2 if silu else N
            floor = (N * K + T * K + T * n_out) * 2 / bw
            for name, over in GEMV_VARIANTS.items():
                cfg = dataclasses.replace(KernelConfig(), **over)
                fn = (lambda c: lambda i: gemv(x, ws[i], silu=silu, cfg=c))(cfg)
                sec = time_calls(torch, fn, copies, device)
                err = float((fn(0).float() - want).abs().max() / want.abs().max())
                row = dict(shape=shape, N=N, K=K, tokens=T, variant=name, us=sec * 1e6, floor_us=floor * 1e6,
                           x_floor=sec / floor, max_rel_err=err)
                res["rows"].append(row)
                print(f"{shape:16s} T={T} {name:14s} {row['us']:8.2f} us  x{row['x_floor']:5.3f}  err {err:.1e}",
                      flush=True)
        del ws
    for T in tokens:
        for shapes, label in ((list(PER_PROJECTION)[:4], "8B layer"), (list(PER_PROJECTION)[4:], "30B-A3B qkv+o")):
            sums = {v: sum(r["us"] for r in res["rows"] if r["tokens"] == T and r["variant"] == v
                           and r["shape"] in shapes) for v in GEMV_VARIANTS}
            print(f"T={T} {label}: " + "  ".join(f"{v} {us:.2f}" for v, us in sums.items()), flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "gemv_projections.json"), "w") as f:
        json.dump(res, f, indent=1)


def main():
    out = os.environ.get("OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    if "--per-projection" in sys.argv:
        tokens = sys.argv[sys.argv.index("--tokens") + 1] if "--tokens" in sys.argv else "1,2"
        per_projection(out, tuple(int(t) for t in tokens.split(",")), smoke="--smoke" in sys.argv)
        return
    gen = random_text_generator(LLAMA3_8B, device="cuda")
    mw = gen.model_wrapper
    kernels = mw.kernels
    block_size, num_blocks = 16, 8192
    kv = gen.allocate_kv_cache(num_blocks, block_size)
    perm = torch.randperm(num_blocks)
    weight_bytes = sum(p.numel() * p.element_size() for n, p in mw.model.named_parameters() if "embed_tokens" not in n)
    bw = copy_bandwidth("cuda")
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_bandwidth_TBps": bw / 1e12,
           "weight_GB": weight_bytes / 1e9, "cases": []}
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s, weights {weight_bytes / 1e9:.2f} GB", flush=True)
    triton_norm = kernels.add_rms_norm
    proj_bytes = weight_bytes - mw.model.model.norm.weight.numel() * 2 - sum(
        p.numel() * p.element_size() for n, p in mw.model.named_parameters() if "layernorm" in n)
    res["projections"] = []
    for T in (1, 2, 4):
        for name, fn in (("cuBLAS", torch.nn.functional.linear), ("GEMV", gemv)):
            ms = projections_ms(mw, T, fn)
            res["projections"].append({"tokens": T, "kernel": name, "ms": ms, "TBps": proj_bytes / ms / 1e9})
            print(f"projections alone, {T} token(s), {name:6s}: {ms:.3f} ms ({proj_bytes / ms / 1e9:.2f} TB/s; "
                  f"copy {bw / 1e12:.2f})", flush=True)

    def flashinfer_norm(x, residual, weight, eps):
        kernels._fi.fused_add_rmsnorm(x, residual, weight, eps)
        return x, residual

    def configure(max_tokens, tnorm):
        mw.set_kernel_config(dataclasses.replace(mw.kernel_config, gemv_max_tokens=max_tokens))
        kernels.add_rms_norm = triton_norm if tnorm else flashinfer_norm

    res["cases"] = run_variants(gen, kv, perm, VARIANTS, configure, (1, 2), (512, 2048, 4096), weight_bytes, bw,
                                block_size)
    kernels.add_rms_norm = triton_norm
    save_results(res, out, "gemv", plot)


def plot(res, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, B in zip(axes, (1, 2)):
        plot_variants(ax, res["cases"], VARIANTS, {"batch": B}, "context", "wall_ratio")
        ax.axhline(1.15, color="gray", ls="--", lw=1, label="target (batch 1): 1.15x")
        ax.set(xlabel="context tokens", xscale="log", title=f"batch {B}: decode step / floor (best of 2 rounds)")
        ax.set_ylabel("x floor")
        ax.legend(fontsize=8)
    fig.suptitle(f"Llama-3-8B-shaped bf16, CUDA graphs, on {res['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
