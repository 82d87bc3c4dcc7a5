"""EAGLE-3 in the engine, on one loaded target, its arms alternated (random head: nothing accepted):

  plain              the engine without a drafter
  adaptive           Eagle3Drafter, adaptive speculation (the default): drafting stops, probes now and then
  adaptive readback  the same, its head's drafts read back after every head step (as before the drafts
                     were chained on the device: one device -> host sync per head step)
  fixed              Eagle3Drafter, adaptive_speculation=False: k head steps and a verify every step
  fixed readback     the same with a read back per head step

    python3 benchmarks/ab_eagle3_engine.py                        # GPU: Llama-3-8B shape, bf16, random weights
    python3 benchmarks/ab_eagle3_engine.py --tiny --device cpu    # smoke test

Each arm keeps one drafter (its head's CUDA graphs captured in the warm-up, as a server keeps one), and every
engine the same KV cache tensors (keep_one_kv_cache), so the target's graphs are captured once, in the warm-up.
Reports per arm the median over --rounds of output tokens/s, ITL p50 and the engine steps; for the
drafting arms also the wall time spent in propose() per run (it ends with the proposal's read back) and
the number of proposals; `captures`: CUDA graphs captured in the arm's timed runs, all rounds (0
expected: a capture stalls its step).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_speculative import TINY, capture_keys, engine_run, make_random_eagle3_head  # noqa: E402
from benchmarks.common import LLAMA3_8B, make_random_checkpoint  # noqa: E402
from text_generator import TextGenerator  # noqa: E402
from text_generator.speculative import Eagle3Drafter  # noqa: E402


class TimedDrafter(Eagle3Drafter):
    """Eagle3Drafter that adds up the wall time of its proposals; readback=True reads each head
    step's drafts back at once (a sync per head step)."""

    def __init__(self, *args, readback: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.readback, self.propose_s, self.proposals = readback, 0.0, 0

    def propose(self, seq_ids, budgets):
        t0 = time.perf_counter()
        try:
            return super().propose(seq_ids, budgets)
        finally:
            self.propose_s += time.perf_counter() - t0
            self.proposals += 1

    def _forward(self, *args, **kwargs):
        top, out = super()._forward(*args, **kwargs)
        if self.readback:
            top.tolist()
        return top, out


def keep_one_kv_cache(gen) -> None:
    """Every engine of the run gets the same KV cache tensors for the same (num_blocks, block_size, dtype): the
    target's CUDA graphs are keyed by the cache's address, so a fresh cache per engine had them captured again
    inside timed runs (session 34's A/B). A finished engine's blocks are all free, and nothing reads a block
    before a step writes it (prefix caching is off in engine_run), so reusing the tensors changes no output."""
    alloc, caches = gen.allocate_kv_cache, {}

    def same_cache(num_blocks, block_size, **kwargs):
        key = (num_blocks, block_size, kwargs.get("dtype"))
        if key not in caches:
            caches[key] = alloc(num_blocks, block_size, **kwargs)
        return caches[key]

    gen.allocate_kv_cache = same_cache


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=None, help="default 512 (tiny: 64)")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 128 (tiny: 24)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--arms", nargs="+", default=None, help="a subset of the arms (plain always runs)")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bench_speculative"))
    args = ap.parse_args(argv)
    cfg, tag = (TINY, "tiny") if args.tiny else (LLAMA3_8B, "8b")
    prompt_len, new = args.prompt_len or (64 if args.tiny else 512), args.new_tokens or (24 if args.tiny else 128)
    dtype, bs = torch.bfloat16, 16
    if args.device == "cpu":
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    path = make_random_checkpoint(os.path.join(args.workdir, f"target_{tag}"), cfg, dtype, device=args.device, seed=0)
    gen = TextGenerator.from_pretrained(path, device=args.device, dtype=dtype)
    keep_one_kv_cache(gen)
    head = make_random_eagle3_head(os.path.join(args.workdir, f"eagle3_{tag}"), cfg, dtype,
                                   draft_vocab=min(32000, cfg["vocab_size"] // 2),
                                   aux=(0, 1, 2) if cfg["num_hidden_layers"] < 3 else None)
    max_seq_len = prompt_len + new + 8
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(cfg["vocab_size"], (prompt_len,), generator=g).tolist() for _ in range(args.batch)]

    def drafter(readback):
        return TimedDrafter(gen, head, k=args.k, block_size=bs, max_seq_len=max_seq_len, readback=readback,
                            num_blocks=args.batch * (-(-max_seq_len // bs) + 1) + 8)

    arms = {"plain": (lambda: None, True), "adaptive": (lambda: drafter(False), True),
            "adaptive readback": (lambda: drafter(True), True), "fixed": (lambda: drafter(False), False),
            "fixed readback": (lambda: drafter(True), False)}
    arms = {name: (make(), adaptive) for name, (make, adaptive) in arms.items()
            if args.arms is None or name == "plain" or name in args.arms}
    runs = {name: [] for name in arms}
    kw = dict(block_size=bs, max_seq_len=max_seq_len, sync=sync)

    def run(d, adaptive, n):
        before = len(capture_keys(gen, d))
        r = engine_run(gen, prompts, n, d, adaptive=adaptive, **kw)
        r["captured"] = capture_keys(gen, d)[before:]
        # LLMEngine freezes the collector's generations (itself included): an engine in a reference
        # cycle would keep its KV cache, the next one would get another address, and the target's
        # graphs (keyed by the cache's address) would be captured again inside a timed run
        gc.unfreeze()
        gc.collect()
        return r

    # warm-up: every arm's graphs, at the timed runs' length (adaptive speculation's probes and growth come late
    # in a run), again while a pass still captured some
    for _ in range(3):
        if sum(run(d, adaptive, new)["captures"] for d, adaptive in arms.values()) == 0:
            break
    for _ in range(args.rounds):
        for name, (d, adaptive) in arms.items():
            if d is not None:
                d.propose_s, d.proposals = 0.0, 0
            r = run(d, adaptive, new)
            if d is not None:
                r.update(propose_ms=1e3 * d.propose_s, proposals=d.proposals)
            runs[name].append(r)
    print(f"device={torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'} batch={args.batch} "
          f"prompt={prompt_len} new_tokens={new} k={args.k} rounds={args.rounds}")
    print(f"{'arm':20s} {'tok/s':>8s} {'vs plain':>8s} {'ITL p50':>8s} {'ITL p99':>8s} {'steps':>6s} "
          f"{'drafted':>7s} {'propose ms':>10s} {'proposals':>9s} {'captures':>8s}")
    base = statistics.median(r["tokens_per_s"] for r in runs["plain"])
    for name, rs in runs.items():
        med = lambda key: statistics.median(r.get(key, 0) for r in rs)  # noqa: E731
        print(f"{name:20s} {med('tokens_per_s'):8.1f} {med('tokens_per_s') / base:7.2f}x {med('itl_p50_ms'):8.2f} "
              f"{med('itl_p99_ms'):8.2f} {med('steps'):6.0f} {med('drafted'):7.0f} {med('propose_ms'):10.1f} "
              f"{med('proposals'):9.0f} {sum(r['captures'] for r in rs):8d}")
    for name, rs in runs.items():
        for i, r in enumerate(rs):
            if r["captured"]:
                print(f"{name}, round {i + 1}: captured {r['captured']}")


if __name__ == "__main__":
    main()
