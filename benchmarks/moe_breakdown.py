"""Where one MoE decode step's GPU time goes: torch.profiler's kernel records of a step, each kernel put
in a part of the model by its name and its place in the step, set against that part's bytes floor.

    rows = profile_steps(step, steps=5)          # step(): one forward_tensor decode call (graph replay)
    parts = attribute(rows[i])                   # {part: microseconds} of one step
    print(table(summary(rows, floors)))

Parts (in step order):
    setup           kernels before the first layer's (input copies, embedding, the RoPE table)
    norms           the residual add + RMSNorm kernels
    q/k norm        Qwen3's q and k RMSNorms where they are kernels of their own (between qkv and attention)
    attn proj       qkv and o (the GEMVs / GEMMs of a layer before its router's)
    rope + store    RoPE and the K/V store
    attention       decode attention (and its split-KV merge)
    router GEMV     the last GEMV / GEMM of a layer before its experts (or the fused router + routing kernel)
    routing         kernels between the router's GEMV and the experts (softmax / top-k)
    experts         the MoE expert kernels (GEMVs, or align + grouped GEMMs + k-sum)
    lm_head         GEMVs / GEMMs after the last layer; `tail` the rest there (final norm, the fp32 cast)
    other           anything else inside a layer (named in the JSON)
    idle            the step's GPU span minus the union of its kernels: launch gaps and host waits

A kernel's time is its exclusive time on the step's timeline: from when it starts or the kernel before it
ends, whichever is later, to its end (kernels taken in order of their ends). Under PDL a kernel launches
early and waits for the one before; its recorded duration includes that wait, its exclusive time only what
it adds to the step. The parts and idle sum to the span. Kernels inside a CUDA graph replay are recorded
one by one by CUPTI; the profiler's own cost per kernel makes the span longer than an unprofiled step.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch

EXPERT_KERNELS = ("_gate_up_gemv_kernel", "_down_gemv_kernel", "_gate_up_kernel", "_down_kernel", "_moe_gemm_kernel",
                  "_sum_k_kernel", "_count_kernel", "_scatter_kernel")
ROUTE_KERNELS = ("_route_kernel",)
ROUTER_KERNELS = ("_router_route_kernel",)  # the router's GEMV and the routing in one
GEMM_WORDS = ("gemv", "gemm", "nvjet", "xmma", "cutlass", "skinny", "_wide_kernel")
ATTENTION_WORDS = ("_decode_kernel", "_merge_kernel", "_verify_kernel", "_prefill_kernel", "BatchDecode",
                   "BatchPrefill", "SingleDecode", "Persistent", "MergeStates")
NORM_WORDS = ("norm", "Norm")
ROPE_WORDS = ("rope", "Rope", "_store_kv_kernel", "AppendPaged")

PARTS = ("setup", "norms", "attn proj", "q/k norm", "rope + store", "attention", "router GEMV", "routing", "experts", "other",
         "lm_head", "tail", "idle")


def is_any(name: str, words) -> bool:
    return any(w in name for w in words)


def profile_steps(step, steps: int = 5, warmup: int = 3) -> list[list[dict]]:
    """Run step() `steps` times (after `warmup` unrecorded calls: graph capture, compilation), each under
    its own torch.profiler session (so that steps do not mix) -> per step its GPU records
    [{name, ts, dur}] (microseconds) in start order."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    out = []
    for _ in range(steps):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
        rows = [dict(name=e["name"], ts=float(e["ts"]), dur=float(e.get("dur", 0.0)))
                for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        out.append(sorted(rows, key=lambda r: r["ts"]))
    return out


def label(rows: list[dict]) -> list[str]:
    """The part of each kernel of one step (rows in start order)."""
    n = len(rows)
    labels = ["other"] * n
    expert = [is_any(r["name"], EXPERT_KERNELS) for r in rows]
    if not any(expert):
        return labels
    first_layer = None
    last_expert = max(i for i in range(n) if expert[i])
    # a layer ends with its last expert kernel: segments [start, end]
    i, start = 0, None
    while i < n:
        if expert[i]:
            j = i
            while j + 1 < n and expert[j + 1]:
                j += 1
            seg_start = 0 if start is None else start
            _label_layer(rows, labels, seg_start, i, j, first=start is None)
            if first_layer is None:
                first_layer = seg_start
            start = j + 1
            i = j + 1
        else:
            i += 1
    for k in range(last_expert + 1, n):
        labels[k] = "lm_head" if is_any(rows[k]["name"], GEMM_WORDS) else "tail"
    return labels


def _label_layer(rows, labels, start, first_expert, end, first: bool):
    for k in range(first_expert, end + 1):
        labels[k] = "experts"
    fused = [k for k in range(start, first_expert) if is_any(rows[k]["name"], ROUTER_KERNELS)]
    gemms = [k for k in range(start, first_expert) if is_any(rows[k]["name"], GEMM_WORDS)]
    router = fused[-1] if fused else gemms[-1] if gemms else None
    if first:  # the first layer's segment starts after the step's setup: at its first norm
        norms = [k for k in range(start, first_expert) if is_any(rows[k]["name"], NORM_WORDS)]
        layer_start = norms[0] if norms else start
        for k in range(start, layer_start):
            labels[k] = "setup"
        start = layer_start
    seen_qkv = seen_attention = False
    for k in range(start, first_expert):
        name = rows[k]["name"]
        seen_attention = seen_attention or is_any(name, ATTENTION_WORDS)
        if router is not None and k == router:
            labels[k] = "router GEMV"
        elif router is not None and k > router or is_any(name, ROUTE_KERNELS):
            labels[k] = "routing"
        elif is_any(name, GEMM_WORDS):
            labels[k] = "attn proj"
            seen_qkv = True
        elif is_any(name, ATTENTION_WORDS):
            labels[k] = "attention"
        elif is_any(name, ROPE_WORDS):
            labels[k] = "rope + store"
        elif is_any(name, NORM_WORDS):  # between qkv and attention: Qwen3's q / k norms
            labels[k] = "q/k norm" if seen_qkv and not seen_attention else "norms"


def exclusive(rows: list[dict]) -> list[float]:
    """Each record's exclusive time (us): taken in order of their ends, end - max(start, the latest end
    before it), 0 for one that ends inside another."""
    out = [0.0] * len(rows)
    frontier = None
    for i in sorted(range(len(rows)), key=lambda i: rows[i]["ts"] + rows[i]["dur"]):
        s, e = rows[i]["ts"], rows[i]["ts"] + rows[i]["dur"]
        out[i] = max(0.0, e - (s if frontier is None else max(s, frontier)))
        frontier = e if frontier is None else max(frontier, e)
    return out


def attribute(rows: list[dict]) -> dict:
    """One step's records -> {part: exclusive us, ..., "span": us, "others": {kernel name: us}}."""
    parts = {p: 0.0 for p in PARTS}
    others: dict[str, float] = {}
    for r, lab, x in zip(rows, label(rows), exclusive(rows)):
        parts[lab] += x
        if lab in ("other", "tail", "setup"):
            others[f"{lab}: {r['name'][:80]}"] = others.get(f"{lab}: {r['name'][:80]}", 0.0) + x
    if rows:
        span = max(r["ts"] + r["dur"] for r in rows) - rows[0]["ts"]
        parts["idle"] = span - sum(exclusive(rows))
        parts["span"] = span
    parts["kernels"] = len(rows)
    parts["others"] = others
    return parts


def summary(steps: list[list[dict]], floors_us: dict | None = None) -> dict:
    """Median over steps of each part (us) and, where floors_us names it, the part's bytes floor and ratio;
    median_step_kernels: every kernel of the median step (name, part, recorded and exclusive us)."""
    per = [attribute(r) for r in steps]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    out = {p: med([a[p] for a in per]) for p in PARTS + ("span", "kernels") if all(p in a for a in per)}
    mid = per.index(sorted(per, key=lambda a: a.get("span", 0.0))[len(per) // 2])  # the median step by span
    layer = [dict(name=r["name"][:60], part=lab, dur=r["dur"], excl=x)
             for r, lab, x in zip(steps[mid], label(steps[mid]), exclusive(steps[mid]))]
    res = dict(parts=out, others=per[mid]["others"], median_step_kernels=layer)
    if floors_us:
        res["floors_us"] = floors_us
    return res


def table(s: dict) -> str:
    parts, floors = s["parts"], s.get("floors_us", {})
    span = parts.get("span", 0.0) or 1.0
    lines = [f"{'part':14s} {'us/step':>9s} {'share':>6s} {'floor us':>9s} {'x floor':>8s}"]
    for p in PARTS:
        if p not in parts:
            continue
        f = floors.get(p)
        fs = f"{f:9.1f} {parts[p] / f:8.2f}" if f else f"{'':9s} {'':8s}"
        lines.append(f"{p:14s} {parts[p]:9.1f} {parts[p] / span:6.1%} {fs}")
    lines.append(f"{'GPU span':14s} {parts.get('span', 0.0):9.1f}  ({int(parts.get('kernels', 0))} records)")
    big = sorted(s["others"].items(), key=lambda kv: -kv[1])[:6]
    lines += [f"  {name}: {us:.1f} us" for name, us in big]
    return "\n".join(lines)
