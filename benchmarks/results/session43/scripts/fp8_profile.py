"""Session 43 probe: where an FP8 Llama-3-8B decode step's GPU time goes at batch 1 / 8 / 32 (context 512), eager,
per kernel name: median over 3 profiled steps of the summed kernel time, the call count and us a call; per-channel and
block weights, bf16 beside. Prints one table a (kind, batch) and writes fp8_profile.json to argv[1]."""
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())
from benchmarks.bench_forward import decode_step  # noqa: E402
from benchmarks.common import LLAMA3_8B, linear_to_fp8, random_text_generator  # noqa: E402
from benchmarks.moe_breakdown import profile_steps  # noqa: E402

out = {}
for kind in ("bf16", "channel", "block"):
    gen = random_text_generator(LLAMA3_8B, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    if kind != "bf16":
        for lin in gen.model_wrapper.lora_linears().values():
            linear_to_fp8(lin, kind)
    torch.cuda.empty_cache()
    kv = gen.allocate_kv_cache(32 * 33, 16)
    for k, v in kv:
        k.normal_()
        v.normal_()
    perm = torch.randperm(32 * 33)
    for B in (1, 8, 32):
        steps = profile_steps(decode_step(gen, kv, 16, B, 512, perm), steps=3)
        names = sorted({r["name"] for s in steps for r in s})
        rows = []
        for n in names:
            tot = statistics.median(sum(r["dur"] for r in s if r["name"] == n) for s in steps)
            cnt = statistics.median(sum(1 for r in s if r["name"] == n) for s in steps)
            rows.append(dict(name=n[:90], us=tot, calls=cnt, us_per_call=tot / max(cnt, 1)))
        rows.sort(key=lambda r: -r["us"])
        total = sum(r["us"] for r in rows)
        out[f"{kind} B={B}"] = dict(total_us=total, kernels=rows)
        print(f"== {kind} B={B}: kernels {total:.0f} us", flush=True)
        for r in rows[:14]:
            print(f"  {r['us']:8.1f} us {r['calls']:5.0f} x {r['us_per_call']:7.2f}  {r['name']}", flush=True)
    del gen, kv
    torch.cuda.empty_cache()
with open(os.path.join(sys.argv[1], "fp8_profile.json"), "w") as f:
    json.dump(out, f, indent=1)
