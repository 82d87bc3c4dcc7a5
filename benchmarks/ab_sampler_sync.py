"""A/B of the Sampler's per-row parameter copies on the engine: `sampling.row_tensor` (pinned memory,
non_blocking: the host runs ahead of the device) against the synchronous `torch.tensor(values, device=cuda)`
it replaced (the host waits in the Sampler for each step's forward), on one loaded engine, passes alternated.

    python3 benchmarks/ab_sampler_sync.py             # GPU: Llama-3-8B shape, bf16, random weights
    python3 benchmarks/ab_sampler_sync.py --tiny --device cpu   # smoke test (the CPU path is the same on both)

Every request is greedy with logprobs=1 (as bench_serve's), so each step goes through the Sampler's
temperature / greedy tensors. Reports output tokens/s and ITL p50 per pass and the medians of each side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_engine import TINY  # noqa: E402
from benchmarks.bench_serve import BLOCK_SIZE, checkpoint  # noqa: E402
from benchmarks.common import LLAMA3_8B, percentile  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="(row_tensor, synchronous) passes each")
    p.add_argument("--checkpoint", default=None)
    return p.parse_args()


def synchronous(values, device, dtype=None):
    """The Sampler's copy before row_tensor: torch.tensor straight onto the device."""
    return torch.tensor(values, dtype=dtype, device=device)


def main() -> None:
    from text_generator import LLMEngine, SamplingParams, TextGenerator, sampling
    from text_generator.serve.warmup import warm_up
    from text_generator.tokenizer import load_tokenizer

    a = parse_args()
    path = checkpoint(a)
    if a.device != "cpu":
        torch.set_num_threads(1)
    max_len = a.input_len + a.output_len + 16
    engine = LLMEngine(TextGenerator.from_pretrained(path, device=a.device), block_size=BLOCK_SIZE,
                       num_blocks=-(-5 * a.max_num_seqs * -(-max_len // BLOCK_SIZE) // 4) + 1,
                       max_num_seqs=a.max_num_seqs, max_num_batched_tokens=4096, max_seq_len=max_len,
                       tokenizer=load_tokenizer(path))
    if a.device != "cpu":
        warm_up(engine)
    params = SamplingParams(temperature=0.0, max_new_tokens=a.output_len, ignore_eos=True, logprobs=1)
    vocab = (TINY if a.tiny else LLAMA3_8B)["vocab_size"]
    g = torch.Generator().manual_seed(0)
    fast = sampling.row_tensor
    rows = {"row_tensor": [], "synchronous": []}
    for r in range(a.rounds + 1):  # round 0: untimed, both sides once
        for name, fn in (("row_tensor", fast), ("synchronous", synchronous)):
            sampling.row_tensor = fn
            prompts = [torch.randint(3, vocab, (a.input_len,), generator=g).tolist() for _ in range(a.num_prompts)]
            engine.block_manager.reset_prefix_cache()
            t0 = time.perf_counter()
            outs = engine.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            itl = [y - x for o in outs for x, y in zip(o.metrics.token_times, o.metrics.token_times[1:])]
            tps = sum(len(o.token_ids) for o in outs) / seconds
            if r:
                rows[name].append((tps, percentile(itl, 50) * 1e3))
                print(f"round {r} {name}: {tps:.0f} tok/s, ITL p50 {percentile(itl, 50) * 1e3:.2f} ms", flush=True)
    sampling.row_tensor = fast
    med = {k: (statistics.median(t for t, _ in v), statistics.median(i for _, i in v)) for k, v in rows.items()}
    print(f"median: row_tensor {med['row_tensor'][0]:.0f} tok/s (ITL p50 {med['row_tensor'][1]:.2f} ms), "
          f"synchronous {med['synchronous'][0]:.0f} tok/s (ITL p50 {med['synchronous'][1]:.2f} ms): "
          f"{med['row_tensor'][0] / med['synchronous'][0]:.3f}x", flush=True)


if __name__ == "__main__":
    main()
