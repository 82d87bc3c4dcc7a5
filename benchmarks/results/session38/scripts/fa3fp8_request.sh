# fa3fp8: 1 GPU (H100 or H200), about 4-5 minutes with the prebuilt module (+2-3 min without); each step has its own timeout.
# Branch h/s38-fa3fp8 @ 563cdbc or later. FlashInfer fa3 all-e4m3 prefill (q, K, V e4m3) over FP8 KV caches.
# OPTIONAL (saves ~2-3 min of GPU time): copy /work/gpu_requests/fa3fp8_prebuilt.tar.xz into the job tree as
# .fiextra/fa3_fp8_prebuilt.tar.xz (see fa3fp8.NEEDS). Without it step 1 JIT-builds the module (timed).
# Steps: (1) load (or build) the fa3 e4m3 module, (2) the attention benchmark (fa3 bf16 / fa2 bf16q-e4m3 / fa3
# e4m3 ragged + paged / Triton; 1k, 4k, 8k, 4x1k), (3) the new CUDA tests, (4) bench_fp8 4k prefill rows:
# bf16, FP8 weights + bf16 KV, FP8 weights + FP8 KV on fa2 and on fa3 (per-channel FP8, fast accumulation).
set +e
source .gpu/device-setup.sh
mkdir -p $OUT/fa3fp8
source benchmarks/fa3_fp8_env.sh 2>&1 | tee $OUT/fa3fp8/env.log
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee -a $OUT/fa3fp8/env.log
# (1) the module: loaded from the prebuilt .so, or built here (time printed)
timeout 240 python3 -c "
import time, torch, flashinfer
from model_wrapper.attention.fa3_fp8 import plan_kwargs
t = time.time()
ws = torch.empty(128 << 20, dtype=torch.uint8, device='cuda')
w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, 'NHD', backend='fa3')
qo = torch.tensor([0, 256], dtype=torch.int32)
w.plan(qo, qo, 32, 8, 128, causal=True, **plan_kwargs(torch.bfloat16, None))
print('fa3 e4m3 module ready in %.1f s' % (time.time() - t))
" 2>&1 | tail -20 | tee $OUT/fa3fp8/module.log
# (2) attention alone
timeout 120 python3 benchmarks/bench_fp8_attention.py --out $OUT/fa3fp8 2>&1 | tail -60 | tee $OUT/fa3fp8/attention.log
# (3) CUDA tests: the fa3 FP8 prefill rows against the torch backend, and a tiny Llama (fa2 and fa3)
timeout 120 python3 -m pytest -q -s -p no:cacheprovider -m cuda -rA tests/model_wrapper/test_fa3_fp8_prefill_cuda.py \
  2>&1 | tail -40 | tee $OUT/fa3fp8/cuda_tests.log
# (4) the 4k prefill step: bf16 / FP8 + bf16 KV / FP8 + FP8 KV (fa2, fa3); per-channel FP8 with fast accumulation
echo '{"fp8_fast_accum": true}' > /tmp/fa3fp8_cfg.json
timeout 150 python3 benchmarks/bench_fp8.py --kind channel --prefill-only --kernel-config /tmp/fa3fp8_cfg.json \
  --out $OUT/fa3fp8 2>&1 | grep -v Warning | tail -25 | tee $OUT/fa3fp8/bench_fp8_prefill.log
echo "fa3fp8 summary:"; grep -h -E "1x4k|4x1k|passed|failed|FP8 \+ FP8 KV|ready in" $OUT/fa3fp8/*.log | head -40
