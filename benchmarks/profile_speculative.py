"""Host cost of the engine's speculative step (drafting, the verify batch, verification, KV
compaction, commit), per step, with the forward itself taken out:

    python benchmarks/profile_speculative.py [--batch 1 8] [--device cpu] [--profile]

The target is the "echo" model of bench_speculative.py (a tiny Llama on the CPU by default) and
the drafter the n-gram prompt lookup at depth 4, which the echo model accepts in full: every
step is a speculative step with 5 tokens per request. For each batch size it runs the engine to
completion and reports, over the decode-only steps, the CPU time (time.process_time: stable on
a shared machine; with one torch thread on the CPU it is the host time) of `engine.step()`
minus that spent inside `forward_tensor` (the driver's host time): the median per step, and
that median over the tokens a step emits. On CUDA forward_tensor is synchronized before its
time is taken, so waiting for the GPU is not counted as driver time.
--profile prints cProfile's top functions of the driver (forward_tensor excluded by subtraction
of its cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_speculative import TINY, cyclic_perm, make_echo  # noqa: E402
from benchmarks.common import random_text_generator  # noqa: E402
from text_generator.engine import LLMEngine  # noqa: E402
from text_generator.sampling import SamplingParams  # noqa: E402
from text_generator.speculative import NgramDrafter  # noqa: E402


class TimedGenerator:
    """Forwards every attribute to the generator; accumulates the CPU time of forward_tensor."""

    def __init__(self, gen, sync):
        self._gen, self._sync, self.seconds = gen, sync, 0.0

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def forward_tensor(self, *args, **kwargs):
        t = time.process_time()
        out = self._gen.forward_tensor(*args, **kwargs)
        self._sync()
        self.seconds += time.process_time() - t
        return out


def run(gen, batch: int, prompt_len: int, new_tokens: int, perm_cycle, profile: bool, sync) -> dict:
    timed = TimedGenerator(gen, sync)
    engine = LLMEngine(timed, num_blocks=batch * (prompt_len + new_tokens) // 16 + 8 * batch, block_size=16,
                       max_num_seqs=batch, max_num_batched_tokens=max(2048, batch * prompt_len),
                       speculative=NgramDrafter(max_ngram=3, depth=4), freeze_gc=False, async_scheduling=False)
    prompts = [(perm_cycle[i:] + perm_cycle * 4)[:prompt_len] for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    engine.step()  # the prefill
    prof = cProfile.Profile() if profile else None
    host, emitted = [], 0
    while engine.has_unfinished():
        timed.seconds = 0.0
        if prof:
            prof.enable()
        t = time.process_time()
        outs = engine.step()
        sync()
        wall = time.process_time() - t
        if prof:
            prof.disable()
        host.append(wall - timed.seconds)
        emitted += sum(len(o.new_token_ids) for o in outs)
    if prof:
        st = pstats.Stats(prof)
        st.sort_stats("cumulative").print_stats("text_generator|kv_manager|speculative", 30)
    per_step = statistics.median(host)
    tokens_per_step = emitted / max(1, len(host))
    return dict(batch=batch, steps=len(host), host_ms_per_step=per_step * 1e3,
                host_us_per_token=per_step / tokens_per_step * 1e6, tokens_per_step=tokens_per_step)


def run_decoder(gen, batch: int, prompt_len: int, new_tokens: int, perm_cycle, drafter, sync) -> dict:
    """The same measurement for SpeculativeDecoder.generate (bench_speculative's batch-1 driver):
    its whole call minus forward_tensor, per decode forward."""
    from kv_manager import BlockManager
    from text_generator.speculative import SpeculativeDecoder

    timed = TimedGenerator(gen, sync)
    nb = batch * (prompt_len + new_tokens) // 16 + 8 * batch
    dec = SpeculativeDecoder(timed, gen.allocate_kv_cache(nb, 16), BlockManager(nb, 16, enable_prefix_caching=False),
                             drafter, max_seq_len=prompt_len + new_tokens + 8)
    prompts = [(perm_cycle[i:] + perm_cycle * 4)[:prompt_len] for i in range(batch)]
    t = time.process_time()
    dec.generate(prompts, new_tokens)
    host = time.process_time() - t - timed.seconds
    steps = dec.stats.forwards - 1
    return dict(batch=batch, steps=steps, host_ms_per_step=host / steps * 1e3,
                host_us_per_token=host / dec.stats.emitted * 1e6, tokens_per_step=dec.stats.emitted / steps)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=200)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--driver", choices=["engine", "decoder"], default="engine",
                    help="LLMEngine's speculative step, or SpeculativeDecoder (mean per step)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16  # (FlashInfer: 16-bit only)
    gen = random_text_generator(TINY, device=args.device, dtype=dtype, cuda_graphs=args.device != "cpu")
    perm, cycle = cyclic_perm(TINY["vocab_size"], args.prompt_len // 2, torch.Generator().manual_seed(0))
    make_echo(gen, perm.to(args.device))
    for b in args.batch:
        if args.driver == "engine":
            r = run(gen, b, args.prompt_len, args.new_tokens, cycle, args.profile, sync)
        else:
            r = run_decoder(gen, b, args.prompt_len, args.new_tokens, cycle, NgramDrafter(max_ngram=3, depth=4), sync)
        print(f"batch {r['batch']:3d}: {r['steps']} steps, {r['tokens_per_step']:.1f} tokens/step, driver host "
              f"time {r['host_ms_per_step']:.3f} ms/step (median), {r['host_us_per_token']:.1f} us/token")


if __name__ == "__main__":
    main()
