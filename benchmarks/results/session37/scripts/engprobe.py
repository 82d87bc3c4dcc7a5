"""Probe: why the engine with FP8 is slower than bf16: four arms (weights x KV dtype), then a profiled run of two."""
import os, sys, time, gc
sys.path.insert(0, os.getcwd())
import torch
from benchmarks.bench_fp8 import to_fp8, E4M3
from benchmarks.common import LLAMA3_8B, random_text_generator
from text_generator.engine import LLMEngine
from text_generator.sampling import SamplingParams
from text_generator.serve.warmup import warm_up

cfg = LLAMA3_8B
gen8 = random_text_generator(cfg, device="cuda", dtype=torch.bfloat16)
genr = random_text_generator(cfg, device="cuda", dtype=torch.bfloat16)
to_fp8(gen8, genr, "block")
g = torch.Generator().manual_seed(1)
prompts = [torch.randint(0, cfg["vocab_size"], (512,), generator=g).tolist() for _ in range(256)]
out_len = 128

def arm(name, gen, kv, profile=False):
    bs = 16; max_len = 512 + out_len
    nb = -(-max_len // bs) * 128 + 1
    kw = {} if kv is None else dict(kv_cache_dtype=kv)
    eng = LLMEngine(gen, num_blocks=nb, block_size=bs, max_num_seqs=128, max_num_batched_tokens=4096, max_seq_len=max_len, **kw)
    warm_up(eng)
    params = SamplingParams(temperature=0.0, max_new_tokens=out_len, ignore_eos=True)
    steps = []
    orig = eng.step
    def step(*a, **k):
        t = time.perf_counter(); r = orig(*a, **k); steps.append(time.perf_counter() - t); return r
    eng.step = step
    torch.cuda.synchronize(); t0 = time.perf_counter()
    outs = eng.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize(); el = time.perf_counter() - t0
    n = sum(len(o.token_ids) for o in outs)
    s = sorted(steps)
    print(f"{name}: {n / el:.0f} tok/s, {el:.2f} s, steps {len(steps)}, step ms p50 {1e3*s[len(s)//2]:.1f} p90 {1e3*s[int(len(s)*.9)]:.1f} max {1e3*s[-1]:.1f}, sum {sum(s):.2f} s", flush=True)
    top = sorted(range(len(steps)), key=lambda i: -steps[i])[:12]
    print("   slowest steps (index, ms):", [(i, round(1e3 * steps[i], 1)) for i in sorted(top)], flush=True)
    if profile:
        eng.block_manager.reset_prefix_cache()
        from torch.profiler import profile as P, ProfilerActivity
        with P(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            eng.generate(prompts, params, use_tqdm=False); torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90), flush=True)
    del eng; gc.collect(); torch.cuda.empty_cache()

arm("fp8 + fp8kv", gen8, E4M3, profile=True)
arm("bf16 + bf16kv", genr, None, profile=True)
arm("fp8 + bf16kv", gen8, None)
arm("bf16 + fp8kv", genr, E4M3)
