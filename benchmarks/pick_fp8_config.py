"""Pick the FP8 skinny kernel's KernelConfig values from a sweep of bench_fp8_gemm.py --sweep-only.

    python3 benchmarks/pick_fp8_config.py results/fp8_gemm.json --out fp8_config.json

Per token tile, the (K step, dequant) variant with the least time summed over the swept shapes:
16 tokens -> fp8_skinny_block_k / fp8_skinny_dequant, 64 and 128 tokens together ->
fp8_skinny_wide_block_k / fp8_skinny_wide_dequant; fp8_skinny_max_tokens = the largest swept
token count up to which that skinny variant beats cuBLASLt's block-scaled GEMM (summed over the
shapes; 16 at least, and 16 where the block-scaled GEMM was not measured). Prints the comparison with bf16 and writes the fields as JSON for
bench_fp8_gemm.py / bench_fp8.py --kernel-config.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sweep_json")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.sweep_json) as f:
        rows = [r for r in json.load(f).get("sweep", []) if "us" in r]
    shapes = sorted({r["shape"] for r in rows})
    skinny = defaultdict(dict)  # (tokens, block_k, dequant) -> {shape: us}
    other = defaultdict(dict)  # (kernel, tokens) -> {shape: us}
    for r in rows:
        if r["kernel"] == "skinny":
            skinny[(r["tokens"], r["fp8_skinny_block_k"], r["fp8_skinny_dequant"])][r["shape"]] = r["us"]
        else:
            other[(r["kernel"], r["tokens"])][r["shape"]] = r["us"]

    def total(times: dict) -> float:
        return sum(times.values()) if all(s in times for s in shapes) else float("inf")

    def best(tokens: tuple[int, ...]):
        variants = {(bk, dq) for (_, bk, dq) in skinny}
        cost = {v: sum(total(skinny.get((m, *v), {})) for m in tokens) for v in variants}
        return min(cost, key=cost.get) if cost and min(cost.values()) < float("inf") else None

    narrow = best((16,))
    wide_tokens = tuple(m for m in (64, 128) if any(k[0] == m for k in skinny))
    wide = best(wide_tokens) or (best((64,)) if 64 in wide_tokens else None)
    picked = {}
    if narrow:
        picked.update(fp8_skinny_block_k=narrow[0], fp8_skinny_dequant=narrow[1])
    if wide:
        picked.update(fp8_skinny_wide_block_k=wide[0], fp8_skinny_wide_dequant=wide[1])
    max_tokens = 16
    for m in (64, 128):
        mine = total(skinny.get((m, *wide), {})) if wide else float("inf")
        blk = total(other.get(("scaled_mm_block", m), {}))  # inf where not measured: the bound stays
        if mine < blk < float("inf") and max_tokens == (16 if m == 64 else 64):
            max_tokens = m
    picked["fp8_skinny_max_tokens"] = max_tokens
    print(f"shapes {shapes}: picked {picked}")
    for m in (16, 64, 128):
        v = narrow if m == 16 else wide
        if v is None:
            continue
        mine = skinny.get((m, *v), {})
        line = f"  {m:3d} tokens: skinny k{v[0]}{' dequant' if v[1] else ''} " + " ".join(
            f"{s}={mine.get(s, float('nan')):.1f}" for s in shapes)
        for kernel in ("scaled_mm_block", "bf16"):
            t = other.get((kernel, m), {})
            line += f" | {kernel} " + " ".join(f"{s}={t.get(s, float('nan')):.1f}" for s in shapes)
        print(line + " (us)")
    with open(args.out, "w") as f:
        json.dump(picked, f, indent=1)


if __name__ == "__main__":
    main()
