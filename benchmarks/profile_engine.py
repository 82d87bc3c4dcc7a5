"""Where an engine decode step's time goes on the GPU (Llama-3-8B-shaped bf16, batch 256):

    source .gpu/device-setup.sh && python3 benchmarks/profile_engine.py

Runs the engine over 256 prompts of 512 tokens (64 new tokens each) and, for the decode-only
steps, splits the wall time into: scheduling, forward_tensor on the host (validation, metadata,
launches; returns before the GPU is done), the GPU forward itself (CUDA events), sampling up to
the device -> host copy of the tokens (includes waiting for the GPU), and the rest (emit, stop
checks, commit). The engine runs in the plain order (async_scheduling=False): running ahead
moves sampling into runahead.launch / complete, where this split does not see it.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import LLAMA3_8B, make_random_checkpoint  # noqa: E402
from kv_manager import profile_num_blocks  # noqa: E402
from text_generator import TextGenerator  # noqa: E402
import text_generator.engine.engine as engine_module  # noqa: E402
from text_generator.engine import LLMEngine  # noqa: E402
from text_generator.sampling import SamplingParams  # noqa: E402


def main():
    B, L, O = int(os.environ.get("B", 256)), 512, 64
    tmp = tempfile.TemporaryDirectory(prefix="profile_engine_")
    make_random_checkpoint(tmp.name, LLAMA3_8B, torch.bfloat16, device="cuda")
    gen = TextGenerator.from_pretrained(tmp.name, device="cuda", dtype=torch.bfloat16)
    nb = profile_num_blocks(gen.kv_cache_spec, 16, device=torch.device("cuda"), memory_fraction=0.8, max_seq_len=L + O)
    eng = LLMEngine(gen, num_blocks=nb, block_size=16, max_num_seqs=B, max_num_batched_tokens=8192,
                    max_seq_len=L + O, async_scheduling=False)
    cur: dict[str, float] = {}

    def wrap(obj, name, key):
        f = getattr(obj, name)

        def w(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            cur[key] = cur.get(key, 0.0) + time.perf_counter() - t
            return r
        setattr(obj, name, w)

    wrap(eng.scheduler, "schedule", "schedule")
    wrap(engine_module, "forward_chunks", "forward_tensor (host)")  # (engine.py calls it by this name)
    wrap(eng, "sample", "sample + emit (waits for GPU)")
    wrap(eng.sampler, "__call__", "sampler call (host)")
    mw = gen.model_wrapper
    f = mw.forward
    ev = []

    def fwd(*a, **k):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        r = f(*a, **k)
        e.record()
        ev.append((s, e))
        return r
    mw.forward = fwd
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=0.0, max_new_tokens=O, ignore_eos=True)
    for _ in range(B):
        eng.add_request(torch.randint(0, gen.vocab_size, (L,), generator=g).tolist(), params)
    steps = []
    prof = cProfile.Profile()
    while eng.has_unfinished():
        if len(steps) == O // 2:
            prof.enable()
        elif len(steps) == O // 2 + 20:
            prof.disable()
        cur.clear()
        ev.clear()
        t = time.perf_counter()
        eng.step()
        wall = time.perf_counter() - t
        torch.cuda.synchronize()
        gpu = sum(s.elapsed_time(e) for s, e in ev) / 1e3
        steps.append((dict(cur), wall, gpu, eng.scheduler.running and len(eng.scheduler.running)))
    dec = [s for s in steps[-40:-5]]  # decode-only steps at full batch
    print(f"decode steps at batch {B}, context ~{L + O // 2}: median ms")
    print(f"  wall per step           {statistics.median([s[1] for s in dec]) * 1e3:7.2f}")
    print(f"  GPU forward (events)    {statistics.median([s[2] for s in dec]) * 1e3:7.2f}")
    for k in dec[0][0]:
        print(f"  {k:24s}{statistics.median([s[0].get(k, 0) for s in dec]) * 1e3:7.2f}")
    print("=== cProfile of 20 decode steps ===")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
    tmp.cleanup()


if __name__ == "__main__":
    main()
