"""Engine A/B (session 40): FP8 + FP8 KV with the e4m3 decode launch tables of session 39 (old) and now (new), ORDER env sets the order; then bf16. (Session 39:: FP8 (block) weights + FP8 KV with the Triton prefill attention's e4m3 math of session 38
(q_dtype) and of now (prefill_attention.E4M3_MATH), then bf16; one process, warm_up before each timed pass (the
Triton compile hook prints what compiles inside one)."""
import dataclasses
import os, sys, time, gc
sys.path.insert(0, os.getcwd())
import torch
from triton import knobs
from benchmarks.bench_fp8 import to_fp8, E4M3
from benchmarks.common import LLAMA3_8B, random_text_generator
from text_generator.engine import LLMEngine
from text_generator.sampling import SamplingParams
from text_generator.serve.warmup import warm_up

STATE = {"phase": "load", "step": -1}
def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled, **kw):
    if STATE["phase"] == "timed":
        cfg = compile.get("configs") if isinstance(compile, dict) else None
        print(f"COMPILE step {STATE['step']}: {repr[:400]} attrs={str(cfg)[:300]}", flush=True)
    return None
knobs.runtime.jit_cache_hook = hook

cfg = LLAMA3_8B
gen8 = random_text_generator(cfg, device="cuda", dtype=torch.bfloat16)
genr = random_text_generator(cfg, device="cuda", dtype=torch.bfloat16)
to_fp8(gen8, genr, "block")
g = torch.Generator().manual_seed(1)
prompts = [torch.randint(0, cfg["vocab_size"], (512,), generator=g).tolist() for _ in range(256)]
out_len = 128

def arm(name, gen, kv):
    bs = 16; max_len = 512 + out_len
    nb = -(-max_len // bs) * 128 + 1
    kw = {} if kv is None else dict(kv_cache_dtype=kv)
    eng = LLMEngine(gen, num_blocks=nb, block_size=bs, max_num_seqs=128, max_num_batched_tokens=4096, max_seq_len=max_len, **kw)
    STATE["phase"] = "warm"; warm_up(eng)
    params = SamplingParams(temperature=0.0, max_new_tokens=out_len, ignore_eos=True)
    steps, shapes = [], []
    orig_fwd = gen.forward_tensor
    def fwd(input_ids, position_ids, is_prefill, *a, **k):
        shapes.append((int(input_ids.numel()), bool(is_prefill)))
        return orig_fwd(input_ids, position_ids, is_prefill, *a, **k)
    gen.forward_tensor = fwd
    orig = eng.step
    def step(*a, **k):
        STATE["step"] += 1
        t = time.perf_counter(); r = orig(*a, **k); steps.append(time.perf_counter() - t); return r
    eng.step = step
    STATE["phase"] = "timed"; STATE["step"] = -1
    torch.cuda.synchronize(); t0 = time.perf_counter()
    outs = eng.generate(prompts, params, use_tqdm=False)
    torch.cuda.synchronize(); el = time.perf_counter() - t0
    STATE["phase"] = "done"
    n = sum(len(o.token_ids) for o in outs)
    print(f"{name}: {n / el:.0f} tok/s, {el:.2f} s, steps {len(steps)}", flush=True)
    for i, s in enumerate(steps):
        if s > 0.15 or i < 12:
            print(f"  step {i}: {1e3 * s:.1f} ms, forward calls so far {len(shapes)}, last shape {shapes[min(i, len(shapes)-1)] if shapes else None}", flush=True)
    del gen.forward_tensor
    del eng; gc.collect(); torch.cuda.empty_cache()

from model_wrapper.kernels import decode_attention as d
NEW = (dict(d.LAUNCH["e4m3"]), d.E4M3_BY_BATCH)
OLD = (dict(block_n=64, num_warps=4, num_stages=3, maxnreg=128, fp8_math="bits_vreg"),
       ((16, {}), (32, {"split_factor": 2}), (64, {"fp8_math": "fp16_vreg"})))
for name in os.environ.get("ORDER", "old,new,old,new").split(","):
    d.LAUNCH["e4m3"], d.E4M3_BY_BATCH = OLD if name == "old" else NEW
    gen8.model_wrapper.set_kernel_config(gen8.model_wrapper.kernel_config)  # drop graphs captured before
    arm(f"fp8 + fp8kv, e4m3 decode launch {name}", gen8, E4M3)
arm("bf16 + bf16kv", genr, None)
