"""Engine throughput of two source trees on the same random Llama-3-8B-shaped model, one process each.

    python3 benchmarks/ab_engine.py --tree . ; python3 benchmarks/ab_engine.py --tree <old checkout>

The load of bench_serve.py's engine row: 256 prompts of 256 random ids, 128 greedy tokens each
(logprobs=1), max_num_seqs 128, all at t = 0; prints output tokens/s and ITL p50 / p99.
"""
import argparse
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--tree", default=".")
ap.add_argument("--prompts", type=int, default=256)
ap.add_argument("--repeat", type=int, default=1, help="timed runs in the same process (a later run has no first-use costs)")
a = ap.parse_args()
sys.path.insert(0, os.path.abspath(a.tree))
import torch  # noqa: E402

from benchmarks.common import LLAMA3_8B, percentile, random_text_generator  # noqa: E402
from text_generator.engine import LLMEngine  # noqa: E402
from text_generator.sampling import SamplingParams  # noqa: E402

gen = random_text_generator(LLAMA3_8B, device="cuda")
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(0, 128000, (256,), generator=g).tolist() for _ in range(a.prompts)]
eng = LLMEngine(gen, num_blocks=(384 // 16 + 1) * 128 + 1, block_size=16, max_num_seqs=128, max_seq_len=384)
p = SamplingParams(temperature=0.0, max_new_tokens=128, ignore_eos=True, logprobs=1)
eng.generate(prompts[:8], SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True), use_tqdm=False)
eng.block_manager.reset_prefix_cache()
for run in range(a.repeat):
    eng.block_manager.reset_prefix_cache()
    cache = os.environ.get("TRITON_CACHE_DIR")
    before = len(os.listdir(cache)) if cache and os.path.isdir(cache) else None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = eng.generate(prompts, p, use_tqdm=False)
    torch.cuda.synchronize()
    el = time.perf_counter() - t0
    itl = [x for o in outs for x in o.metrics.itls]
    n = sum(len(o.token_ids) for o in outs)
    compiled = "" if before is None else f", Triton kernels compiled during the run {len(os.listdir(cache)) - before}"
    print(f"tree {a.tree} run {run}: {n / el:.0f} tok/s, ITL p50 {percentile(itl, 50) * 1e3:.2f} ms "
          f"p99 {percentile(itl, 99) * 1e3:.2f} ms, steps {eng.num_steps}{compiled}", flush=True)
