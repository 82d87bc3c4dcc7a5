"""Tuning sweep of the Triton LoRA kernels' launch constants under decode CUDA graphs
(Llama-3-8B-shaped bf16, batch 32 at 2k, 16 distinct rank-16 adapters on all 7 projections):
graph replay time (GPU only) per configuration, beside the base model's.

    source .gpu/device-setup.sh && python3 benchmarks/sweep_lora.py
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import adapters.triton_kernels as tk  # noqa: E402
from adapters import LoraManager  # noqa: E402
from benchmarks.bench_lora import DecodeBench, random_adapter  # noqa: E402
from benchmarks.common import LLAMA3_8B, make_random_checkpoint  # noqa: E402
from text_generator import TextGenerator  # noqa: E402


def replay_ms(bench, ids, n=50):
    for _ in range(3):
        bench.step(ids)
    return bench.replay_ms(ids, n)  # DecodeBench's: graph replays alone, best of 3


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    make_random_checkpoint(d, LLAMA3_8B, torch.bfloat16, device="cuda")
    gen = TextGenerator.from_pretrained(d, device="cuda", dtype=torch.bfloat16)
    bench = DecodeBench(gen, 32, 2048, 16)
    cfg = gen.config
    m = LoraManager(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, q_size=cfg.num_heads * cfg.head_dim,
                    kv_size=cfg.num_kv_heads * cfg.head_dim, intermediate_size=cfg.intermediate_size,
                    max_loras=16, max_rank=16, device="cuda", dtype=torch.bfloat16, kernel="triton")
    for a in range(16):
        m.add_adapter(random_adapter(f"a{a}", m, 16, "cuda"))
    base = replay_ms(bench, None)
    print(f"base replay {base:.3f} ms", flush=True)
    gen.lora_manager = m
    ids16 = [f"a{i % 16}" for i in range(32)]
    ids1 = ["a0"] * 32
    side = m.side
    wide = os.environ.get("SWEEP") == "wide"
    if wide:  # (what found MAX_SPLITS / NUM_WARPS)
        grid = [(bn, sp, w, True, 4) for bn, sp, w in itertools.product([128, 256], [4, 8, 16], [2, 4])]
        grid += [(128, 8, 4, False, 4), (256, 8, 4, False, 4), (128, 8, 4, True, 8)]
    else:
        grid = [(128, sp, w, True, 4) for sp, w in itertools.product([1, 2, 3, 4], [4, 8])]
        grid += [(128, 2, 4, False, 4)]
    for block_n, splits, warps, overlap, ppsm in grid:
        tk.BLOCK_N, tk.MAX_SPLITS, tk.NUM_WARPS, tk.PROGRAMS_PER_SM = block_n, splits, warps, ppsm
        m.side = side if overlap else None
        gen.model_wrapper.graphs.attach_lora(m)
        t16 = replay_ms(bench, ids16)
        t1 = replay_ms(bench, ids1)
        print(f"BLOCK_N {block_n:3d} MAX_SPLITS {splits:2d} warps {warps} overlap {overlap!s:5} ppsm {ppsm}: "
              f"16 adapters {t16:.3f} ms ({t16 / base - 1:+.1%}), 1 adapter {t1:.3f} ms ({t1 / base - 1:+.1%})",
              flush=True)


if __name__ == "__main__":
    main()
