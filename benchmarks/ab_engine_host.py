"""Two questions about the engine's host side, on one loaded engine, its passes alternated:

  row_tensor   the Sampler's per-row parameters copied from pinned memory with non_blocking (the host
               runs ahead of the device): the default
  synchronous  the `torch.tensor(values, device=cuda)` it replaced (the host waits in the Sampler for
               each step's forward)
  loaded       row_tensor while --spinners other processes each keep a core --duty busy (pure Python
               spinning, niced as bench_serve's clients): what the server's HTTP process and load
               generator (about 2 cores busy in bench_serve) cost an engine process that shares the
               host with them, without any HTTP

    python3 benchmarks/ab_engine_host.py                        # GPU: Llama-3-8B shape, bf16, random weights
    python3 benchmarks/ab_engine_host.py --tiny --device cpu    # smoke test

Every request is greedy with logprobs=1 (as bench_serve's): each step goes through the Sampler's
temperature / greedy tensors. Reports output tokens/s, ITL p50 and steps per pass, and each arm's medians.
"""

from __future__ import annotations

import argparse
import multiprocessing
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
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="timed passes of each arm")
    p.add_argument("--spinners", type=int, default=9, help="busy processes of the loaded arm")
    p.add_argument("--duty", type=float, default=0.25, help="each spinner's busy fraction")
    p.add_argument("--checkpoint", default=None)
    return p.parse_args()


def synchronous(values, device, dtype=None):
    """The Sampler's copy before row_tensor: torch.tensor straight onto the device."""
    return torch.tensor(values, dtype=dtype, device=device)


def spin(duty: float, stop) -> None:
    """A busy process: spin duty of every 4 ms until stop is set (niced as bench_serve's clients)."""
    os.nice(10)
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.004 * duty:
            pass
        time.sleep(0.004 * (1 - duty))


class Spinners:
    """--spinners processes spinning while the loaded arm's pass runs."""

    def __init__(self, n: int, duty: float):
        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=spin, args=(duty, self.stop), daemon=True) for _ in range(n)]

    def __enter__(self):
        for p in self.procs:
            p.start()
        time.sleep(0.5)  # started and spinning
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for p in self.procs:
            p.join(5)


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
    arms = {"row_tensor": (fast, False), "synchronous": (synchronous, False), "loaded": (fast, True)}
    rows = {k: [] for k in arms}
    for r in range(a.rounds + 1):  # round 0: untimed, every arm once
        for name, (fn, loaded) in arms.items():
            sampling.row_tensor = fn
            prompts = [torch.randint(3, vocab, (a.input_len,), generator=g).tolist() for _ in range(a.num_prompts)]
            engine.block_manager.reset_prefix_cache()
            with Spinners(a.spinners if loaded else 0, a.duty):
                steps = engine.num_steps
                t0 = time.perf_counter()
                outs = engine.generate(prompts, params, use_tqdm=False)
                seconds = time.perf_counter() - t0
                steps = engine.num_steps - steps
            itl = [y - x for o in outs for x, y in zip(o.metrics.token_times, o.metrics.token_times[1:])]
            tps = sum(len(o.token_ids) for o in outs) / seconds
            if r:
                rows[name].append((tps, percentile(itl, 50) * 1e3))
                print(f"round {r} {name}: {tps:.0f} tok/s, ITL p50 {percentile(itl, 50) * 1e3:.2f} ms, {steps} steps "
                      f"({1e3 * seconds / steps:.2f} ms each)", flush=True)
    sampling.row_tensor = fast
    med = {k: (statistics.median(t for t, _ in v), statistics.median(i for _, i in v)) for k, v in rows.items()}
    base = med["row_tensor"][0]
    print("medians: " + "; ".join(f"{k} {t:.0f} tok/s (ITL p50 {i:.2f} ms, {t / base:.3f}x of row_tensor)"
                                 for k, (t, i) in med.items()), flush=True)


if __name__ == "__main__":
    main()
