"""The engine over an FP8 (e4m3) KV cache with its decode attention on the CUDA kernel (kernels/e4m3_decode_cuda.py,
KernelConfig.fp8_kv_decode_cuda) or on the Triton kernel, same process, same random block-FP8 Llama-3-8B model.

bench_fp8.py's engine row (256 prompts of 512 random ids, 128 greedy tokens each, max_num_seqs 128, after the
server's start-up pass), alternated: on, off, on, off. Prints tokens/s of each.

    python3 benchmarks/ab_engine_fp8kv.py [--out DIR] [--prompts 256]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    from benchmarks.bench_fp8 import run_engine, to_fp8
    from benchmarks.common import LLAMA3_8B, random_text_generator
    from model_wrapper.kernels import KernelConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--prompts", type=int, default=256)
    args = ap.parse_args()
    gen8 = random_text_generator(LLAMA3_8B, device="cuda", dtype=torch.bfloat16)
    ref = random_text_generator(LLAMA3_8B, device="cuda", dtype=torch.bfloat16)
    to_fp8(gen8, ref, "block")
    del ref
    torch.cuda.empty_cache()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, LLAMA3_8B["vocab_size"], (512,), generator=g).tolist() for _ in range(args.prompts)]
    rows = []
    for cuda in (True, False, True, False):
        gen8.model_wrapper.set_kernel_config(dataclasses.replace(KernelConfig(), fp8_kv_decode_cuda=cuda))
        r = run_engine(gen8, torch.float8_e4m3fn, prompts, 128, "cuda")
        rows.append({"fp8_kv_decode_cuda": cuda, **r})
        print(f"engine FP8 + FP8 KV, decode attention {'CUDA' if cuda else 'Triton'}: {r['tokens_per_s']:.0f} tok/s "
              f"({r['seconds']:.2f} s)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "engine_fp8kv_ab.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "prompts": args.prompts, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
