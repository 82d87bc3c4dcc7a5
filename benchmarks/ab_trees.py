"""Same-run A/B of two source trees: decode and prefill (bench_forward's cases) and LoRA decode (bench_lora).

    python3 benchmarks/ab_trees.py --base PATH_TO_OLD_TREE --out benchmarks/results/ab_restructure

Each tree runs in its own subprocess (its packages and its benchmarks/ first on sys.path), old and new
alternating for --rounds rounds; a row's time is its best over the rounds. Then bench_lora of each tree
(batch 32 at 2k, rank 16 and 64, 1 and 16 adapters). Writes <out>.json, <out>.png and prints the table
with new / old per row. Used to check that a restructure leaves speed unchanged (every row within 2%).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs inside a tree: that tree's bench_forward cases, on one Llama-3-8B-shaped random model.
WORKER = r"""
import json, sys, torch
from benchmarks.bench_forward import decode_case, prefill_case
from benchmarks.common import LLAMA3_8B, random_text_generator
gen = random_text_generator(LLAMA3_8B, device="cuda", dtype=torch.bfloat16)
block_size = 16
kv_tok = gen.kv_cache_spec.bytes_per_token
num_blocks = int(40 * 2**30 // (kv_tok * block_size))
kv = gen.allocate_kv_cache(num_blocks, block_size)
perm = torch.randperm(num_blocks)
rows = {}
for B in (1, 8, 32, 64, 128):
    for ctx in (512, 2048):
        if B * -(-ctx // block_size) <= num_blocks:
            rows[f"decode B={B} ctx={ctx}"] = decode_case(gen, kv, block_size, B, ctx, perm, 30) * 1e3
for T in (1024, 4096):
    rows[f"prefill T={T}"] = prefill_case(gen, kv, block_size, T, perm, max(2, 32768 // T)) * 1e3
print("ROWS " + json.dumps(rows), flush=True)
"""


def run_tree(tree: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", WORKER], cwd=tree, env=env, capture_output=True, text=True)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("ROWS ")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"worker failed in {tree}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads(line[5:])


def run_lora(tree: str, out: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "benchmarks/bench_lora.py", "--kernels", "triton", "--ranks", "16", "64",
           "--adapters", "1", "16", "--out", out]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"bench_lora failed in {tree}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    with open(os.path.join(out, "lora.json")) as f:
        res = json.load(f)
    return _lora_rows(res)


def _lora_rows(res: dict) -> dict[str, float]:
    """bench_lora's JSON -> {row name: graph replay ms} (row 0 is the base model)."""
    rows = {}
    for r in res["rows"]:
        if r.get("replay_ms") is None:
            continue
        name = "lora base" if r["rank"] == 0 else f"lora rank {r['rank']} x {r['num_adapters']}"
        rows[name + " replay"] = r["replay_ms"]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the old tree (a checkout of the commit before the change)")
    ap.add_argument("--new", default=HERE)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-lora", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "benchmarks", "results", "ab_restructure"))
    args = ap.parse_args()
    trees = {"old": os.path.abspath(args.base), "new": os.path.abspath(args.new)}
    best: dict[str, dict[str, float]] = {"old": {}, "new": {}}
    for rnd in range(args.rounds):
        for name, tree in trees.items():
            for k, v in run_tree(tree).items():
                best[name][k] = min(v, best[name].get(k, float("inf")))
            print(f"round {rnd}: {name} done", flush=True)
    if not args.no_lora:
        for name, tree in trees.items():
            best[name].update(run_lora(tree, os.path.join(os.path.dirname(args.out), f"lora_{name}")))
    rows = []
    print(f"{'row':36s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s}")
    for k in best["old"]:
        if k not in best["new"]:
            continue
        o, n = best["old"][k], best["new"][k]
        rows.append(dict(row=k, old_ms=o, new_ms=n, ratio=n / o))
        print(f"{k:36s} {o:9.3f} {n:9.3f} {n / o:8.3f}")
    import torch

    res = dict(device=torch.cuda.get_device_name(0), rounds=args.rounds, rows=rows,
               max_ratio=max(r["ratio"] for r in rows), min_ratio=min(r["ratio"] for r in rows))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    plot(res, args.out + ".png")
    print(f"new/old: {res['min_ratio']:.3f} .. {res['max_ratio']:.3f}")


def plot(res: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(10, 0.3 * len(rows) + 1.5))
    ax.barh([r["row"] for r in rows], [r["ratio"] for r in rows])
    for x in (0.98, 1.0, 1.02):
        ax.axvline(x, color="k" if x == 1.0 else "r", lw=0.8, ls="-" if x == 1.0 else "--")
    ax.set(xlabel="new / old time (dashed: +-2%)", title=f"restructure A/B on {res['device']}",
           xlim=(0.9, 1.1))
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
