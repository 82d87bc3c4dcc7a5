"""Engine throughput under several arms in one process, on one random Llama-3-8B-shaped model (issue 25's engine
row as an A/B: FP8 weights + FP8 KV against bf16, and any switch or launch table against another).

    python3 benchmarks/ab_engine_arms.py --weights block --order new,old,new,old --bf16 --out $OUT \\
        --arms '{"new": {}, "old": {"patch": {"model_wrapper.kernels.decode_attention.E4M3_BY_BATCH": [[64, {}]]}}}'
    python3 benchmarks/ab_engine_arms.py --arms '{"w": {"config": {"fp8_fused_act_quant": false}}}' --out $OUT
    python3 benchmarks/ab_engine_arms.py --device cpu --tiny --out /tmp/ab   # smoke run

An arm: "config", KernelConfig fields over the defaults; "patch", module attributes ("package.module.NAME": value,
JSON as it comes) set for the arm and restored after it. Each arm drops the generator's CUDA graphs, makes an
engine (bench_fp8.run_engine: 512 prompt tokens and 128 greedy ones a request, 128 running, the server's start-up
pass before the clock), and times one pass; the Triton specializations first built inside a timed pass are listed
(a start-up pass that missed them: each costs its compile inside the measurement). --weights block / channel:
the model's projections in FP8 (bench_fp8.to_fp8), its cache --kv (fp8 or bf16); --bf16 adds the model with the
dequantized weights and a bf16 cache, timed last. Writes ab_engine_arms.json / .png to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ab_gemv import save_results  # noqa: E402
from benchmarks.bench_fp8 import E4M3, run_engine, to_fp8  # noqa: E402
from benchmarks.common import LLAMA3_8B, pyplot, random_text_generator, tiny  # noqa: E402


def patched(patches: dict):
    """Sets each "package.module.NAME" to its value -> a function that restores the old values."""
    old = []
    for path, value in patches.items():
        module, name = path.rsplit(".", 1)
        mod = importlib.import_module(module)
        if not hasattr(mod, name):
            raise ValueError(f"ab_engine_arms: {module} has no attribute {name!r} to patch")
        old.append((mod, name, getattr(mod, name)))
        setattr(mod, name, value)

    def restore():
        for mod, name, value in reversed(old):
            setattr(mod, name, value)

    return restore


def plot(res: dict, path: str) -> None:
    plt = pyplot()
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(rows)), 3.5))
    ax.bar(range(len(rows)), [r["tokens_per_s"] for r in rows],
           color=["C1" if r["arm"] == "bf16" else "C0" for r in rows])
    ax.set_xticks(range(len(rows)), [r["arm"] for r in rows], rotation=30, ha="right")
    ax.set(ylabel="output tokens / s", title=f"engine, {res['weights']} weights, {res['kv']} KV ({res['device']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", default='{"default": {}}', help="JSON {name: {\"config\": {...}, \"patch\": {...}}}")
    ap.add_argument("--order", default=None, help="comma-separated arm names, repeats allowed (default: each once)")
    ap.add_argument("--weights", default="block", choices=["block", "channel", "bf16"])
    ap.add_argument("--kv", default="fp8", choices=["fp8", "bf16"])
    ap.add_argument("--bf16", action="store_true", help="also the bf16 model with a bf16 cache, last")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    from model_wrapper.kernels import KernelConfig

    arms = json.loads(args.arms)
    order = args.order.split(",") if args.order else list(arms)
    unknown = sorted({a for a in order if a not in arms}
                     | {k for arm in arms.values() for k in arm} - {"config", "patch"})
    if unknown:
        raise SystemExit(f"ab_engine_arms: unknown arms or arm keys {unknown} (arms: {sorted(arms)}; "
                         "keys: config, patch)")
    dev = args.device
    cfg = tiny(LLAMA3_8B) if args.tiny else LLAMA3_8B
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    gen = random_text_generator(cfg, device=dev, dtype=dtype)
    ref = random_text_generator(cfg, device=dev, dtype=dtype) if args.weights != "bf16" else None
    if ref is not None:
        to_fp8(gen, ref, args.weights)
        if not args.bf16:
            del ref
            ref = None
            gc.collect()
    g = torch.Generator().manual_seed(1)
    n, in_len, out_len = (args.prompts, 512, 128) if not args.tiny else (4, 32, 8)
    prompts = [torch.randint(0, cfg["vocab_size"], (in_len,), generator=g).tolist() for _ in range(n)]
    kv = E4M3 if args.kv == "fp8" else None
    res = {"device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu", "torch": torch.__version__,
           "weights": args.weights, "kv": args.kv, "prompts": n, "input_len": in_len, "output_len": out_len,
           "arms": arms, "rows": []}
    base = gen.model_wrapper.kernel_config
    for name in order:
        restore = patched(arms[name].get("patch", {}))
        try:
            gen.model_wrapper.set_kernel_config(dataclasses.replace(base, **arms[name].get("config", {})))  # (drops
            row = run_engine(gen, kv, prompts, out_len, dev)  # the graphs captured before)
        finally:
            restore()
        res["rows"].append(dict(arm=name, **row))
        print(f"{name}: {row['tokens_per_s']:.0f} tok/s, {row['seconds']:.2f} s, "
              f"{len(row['compiles_in_timed_pass'])} compiles in the timed pass {row['compiles_in_timed_pass'][:8]}",
              flush=True)
    gen.model_wrapper.set_kernel_config(base)
    if ref is not None:
        del gen
        gc.collect()
        row = run_engine(ref, None, prompts, out_len, dev)
        res["rows"].append(dict(arm="bf16", **row))
        print(f"bf16: {row['tokens_per_s']:.0f} tok/s, {row['seconds']:.2f} s", flush=True)
    save_results(res, args.out, "ab_engine_arms", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
