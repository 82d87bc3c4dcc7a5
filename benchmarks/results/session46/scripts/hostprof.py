# session 46: host time of Qwen3-30B-A3B's 4k prefill, FP8 experts with and without block-FP8 attention (c2: ckpt-fp8
# 132.7 ms timed against 77.6 ms of GPU kernels; new-fp8 80.7 against 80.0)
import cProfile, pstats, sys, time, os, io
import torch
sys.path.insert(0, os.getcwd())
from benchmarks.bench_moe import QWEN3_30B_A3B, quantize_experts, quantize_attention
from benchmarks.bench_forward import prefill_step
from benchmarks.common import random_text_generator

gen = random_text_generator(dict(QWEN3_30B_A3B), device="cuda", dtype=torch.bfloat16)
kv = gen.allocate_kv_cache(300, 16)
perm = torch.randperm(300)
quantize_experts(gen.model_wrapper.model)
for name in ("new-fp8", "ckpt-fp8"):
    if name == "ckpt-fp8":
        quantize_attention(gen.model_wrapper.model)
        gen.model_wrapper.set_kernel_config(gen.model_wrapper.kernel_config)
    step = prefill_step(gen, kv, 16, 4096, perm)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter(); step(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    # host time alone: the calls without waiting (enqueue time), then the wait
    t0 = time.perf_counter(); step(); t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"{name}: wall ms {[round(t * 1e3, 2) for t in ts]}; one call enqueues in {(t1 - t0) * 1e3:.2f} ms, "
          f"then waits {(t2 - t1) * 1e3:.2f} ms", flush=True)
    pr = cProfile.Profile()
    pr.enable(); step(); torch.cuda.synchronize(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(s.getvalue()[-6000:], flush=True)
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(30); print(s.getvalue()[-7000:], flush=True)
