"""Where a dense model's decode step goes, kernel by kernel in a layer: torch.profiler's records of CUDA-graph
replays of one step (Llama-3-8B shape, random weights), each kernel's exclusive time on the step's timeline
(benchmarks/moe_breakdown.exclusive: what it adds to the step under PDL), by its place in a layer, beside the
bytes floor of the projections.

    source .gpu/device-setup.sh && python3 benchmarks/profile_dense_decode.py --batches 1,8 --out $OUT
    python benchmarks/profile_dense_decode.py --device cpu --tiny --out /tmp/pd   # smoke run (no records on the CPU)

A layer's kernels are told apart by order: the layer starts at its first GEMV / GEMM after the one that closed the
layer before (4 a layer: qkv, o, gate_up, down), the kernels between them named by their place ("after qkv: 1",
...). The step's kernels before the first layer are "setup", those after the last layer's down "tail" (lm_head's
GEMV among them). Models: bf16, and FP8 with block scales (--kind block) or per-channel (channel), the decoder's
projections quantized in place (benchmarks/common.linear_to_fp8). The profiler's own cost per kernel makes the
span longer than an unprofiled step (its wall time printed beside it). Writes dense_profile.json to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_forward import copy_bandwidth, decode_case, decode_step  # noqa: E402
from benchmarks.common import LLAMA3_8B, linear_to_fp8, random_text_generator, tiny  # noqa: E402
from benchmarks.moe_breakdown import GEMM_WORDS, exclusive, is_any, profile_steps  # noqa: E402

ROLES = ("qkv", "o", "gate_up", "down")


def layer_rows(rows: list[dict], layers: int) -> list[tuple[str, dict, float]]:
    """One step's records (start order) -> [(role, record, exclusive us)]: role "setup", "<layer>:qkv" etc. for
    the four projections, "<layer>:after <proj>: <n>" for the n-th other kernel after one, "tail"."""
    excl = exclusive(rows)
    gemm = [i for i, r in enumerate(rows) if is_any(r["name"], GEMM_WORDS)]
    out, seen, last_proj = [], 0, None
    for i, r in enumerate(rows):
        if seen >= 4 * layers:
            role = "tail"
        elif i in gemm:
            role = f"{seen // 4}:{ROLES[seen % 4]}"
            last_proj = (seen // 4, ROLES[seen % 4], 0)
            seen += 1
        elif last_proj is None:
            role = "setup"
        else:
            layer, proj, n = last_proj
            last_proj = (layer, proj, n + 1)
            role = f"{layer}:after {proj}: {n + 1}"
        out.append((role, r, excl[i]))
    return out


def by_place(steps: list[list[dict]], layers: int) -> dict:
    """Median over steps, per place in a layer (the layer index dropped; mean over the middle layers 2..L-3) ->
    {place: {name, dur, excl}} plus setup and tail sums."""
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    per_step = []
    for rows in steps:
        acc: dict[str, list] = {}
        for role, r, x in layer_rows(rows, layers):
            if role in ("setup", "tail"):
                a = acc.setdefault(role, [role, 0.0, 0.0, 1])
                a[1] += r["dur"]
                a[2] += x
                continue
            layer, place = role.split(":", 1)
            if not 2 <= int(layer) < layers - 2:
                continue
            a = acc.setdefault(place, [r["name"][:70], 0.0, 0.0, 0])
            a[1] += r["dur"]
            a[2] += x
            a[3] += 1
        per_step.append({p: dict(name=a[0], dur=a[1] / a[3], excl=a[2] / a[3]) for p, a in acc.items()})
    places = list(per_step[0])
    return {p: dict(name=per_step[0][p]["name"], dur=med([s[p]["dur"] for s in per_step if p in s]),
                    excl=med([s[p]["excl"] for s in per_step if p in s])) for p in places}


def proj_bytes(gen) -> dict:
    """Bytes a layer's projection reads (weights and scales) by role, from layer 0."""
    lins = gen.model_wrapper.lora_linears()
    out = {}
    for role in ROLES:
        lin = lins[(0, role)]
        out[role] = sum(p.numel() * p.element_size() for p in lin.parameters()) + sum(
            b.numel() * b.element_size() for b in lin.buffers())
    return out


def profile_case(gen, kv, perm, name: str, B: int, context: int, layers: int, floors: dict, cuda: bool) -> dict:
    """One model / configuration at batch B: the unprofiled step, then (CUDA) a middle layer's kernels, printed
    against their bytes' floors -> the JSON row."""
    t = decode_case(gen, kv, 16, B, context, perm, 30 if cuda else 2)
    print(f"=== {name} B={B} ctx={context}: {t * 1e3:.3f} ms a step (unprofiled)", flush=True)
    row = dict(model=name, batch=B, step_ms=t * 1e3)
    if not cuda:
        return row
    steps = profile_steps(decode_step(gen, kv, 16, B, context, perm), steps=5)
    places = by_place(steps, layers)
    span = sorted(max(r["ts"] + r["dur"] for r in s) - s[0]["ts"] for s in steps)[2]
    print(f"profiled span {span:.1f} us; a middle layer, us (recorded / exclusive; floor of the bytes):")
    layer_sum = 0.0
    for place, p in places.items():
        if place in ("setup", "tail"):
            continue
        layer_sum += p["excl"]
        f = floors.get(place)
        fs = f"  floor {f:6.2f}  x{p['excl'] / f:5.2f}" if f else ""
        print(f"  {place:18s} {p['dur']:7.2f} / {p['excl']:6.2f}{fs}   {p['name']}")
    print(f"  layer: {layer_sum:.2f} us exclusive (floor of its projections {sum(floors.values()):.2f});"
          f" setup {places.get('setup', {}).get('excl', 0):.1f}, tail {places.get('tail', {}).get('excl', 0):.1f}")
    return dict(row, profiled_span_us=span, layer=places, floors_us=floors, layer_excl_us=layer_sum)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--kind", default="block", choices=["block", "channel"])
    ap.add_argument("--batches", default="1")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--models", default="bf16,fp8")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--variants", default=None,
                    help='JSON {name: {KernelConfig field: value}}: each model profiled again under each ("fp8[name]")')
    args = ap.parse_args()
    dev, cuda = args.device, args.device == "cuda"
    cfg = tiny(LLAMA3_8B) if args.tiny else LLAMA3_8B
    layers = cfg["num_hidden_layers"]
    bw = copy_bandwidth(dev)
    res = dict(device=torch.cuda.get_device_name(0) if cuda else dev, copy_bandwidth_TBps=bw / 1e12,
               context=args.context, kind=args.kind, rows=[])
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    gen = random_text_generator(cfg, device=dev, dtype=torch.bfloat16 if cuda else torch.float32)
    kv = gen.allocate_kv_cache(max(int(b) for b in args.batches.split(",")) * (-(-args.context // 16)) + 16, 16)
    perm = torch.randperm(kv[0][0].shape[0])
    base_cfg = gen.model_wrapper.kernel_config  # every model's rows: it, then each variant over it
    for model in args.models.split(","):
        if model == "fp8":
            for lin in gen.model_wrapper.lora_linears().values():
                linear_to_fp8(lin, args.kind)  # (the variants' set_kernel_config below drops the graphs)
        floors = {r: b / bw * 1e6 for r, b in proj_bytes(gen).items()}
        for vname, over in [("", {})] + list(json.loads(args.variants or "{}").items()):
            gen.model_wrapper.set_kernel_config(dataclasses.replace(base_cfg, **over))  # drops the graphs
            name = f"{model}[{vname}]" if vname else model
            for B in (int(b) for b in args.batches.split(",")):
                res["rows"].append(profile_case(gen, kv, perm, name, B, args.context, layers, floors, cuda))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dense_profile.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
