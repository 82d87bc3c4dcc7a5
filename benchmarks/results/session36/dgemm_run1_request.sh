# dgemm (h/s36-dgemm, /work/wt/dgemm): 1 GPU (H100), about 6 minutes; a deadline keeps the whole job <= 7 min.
# Block-FP8 prefill GEMMs through FlashInfer's DeepGEMM port (issue 25): the GEMM probe (M = 4096 first), the 4k prefill
# step with the backend A/B (+ kernel profiles), the CUDA tests of the new backend. Needs .fiextra/fi_nv_internal.tar.xz;
# uses .fiextra/dgemm_prebuilt.tar.xz when the lead added it (see dgemm.NEEDS: the runner .so built on the CPU machine
# with CUDA 13.0 + the 42 DeepGEMM kernel cubins for 132 SMs); without it FlashInfer builds the runner here (~2-3 min).
D=$OUT/dgemm; mkdir -p $D
START=$(date +%s)
left() { local l=$((415 - ($(date +%s) - START))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
[ -d /tmp/site/flashinfer ] || source .gpu/device-setup.sh
source benchmarks/deepgemm_env.sh > $D/setup.log 2>&1  # (not piped: its exports must stay in this shell)
(nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader; ls -d /usr/local/cuda* ;
 $CUDA_HOME/bin/nvcc --version | tail -2; python3 -c "import torch; print(torch.__version__, torch.version.cuda)") \
  >> $D/setup.log 2>&1
if [ -f .fiextra/dgemm_prebuilt.tar.xz ]; then
  mkdir -p /tmp/dgpre && tar -xJf .fiextra/dgemm_prebuilt.tar.xz -C /tmp/dgpre \
    && mkdir -p /tmp/site/flashinfer/data/aot/fp8_blockscale_gemm_90 \
    && cp /tmp/dgpre/aot/fp8_blockscale_gemm_90/fp8_blockscale_gemm_90.so /tmp/site/flashinfer/data/aot/fp8_blockscale_gemm_90/ \
    && echo "prebuilt runner + $(ls /tmp/dgpre/dg_cache/cache | wc -l) cubins unpacked" | tee -a $D/setup.log
fi
# 1) the runner (load, or JIT build) and one kernel compiled fresh (empty cache dir): first-call costs
TRTLLM_DG_CACHE_DIR=/tmp/dg_fresh timeout $(left 300) python3 - <<'EOF' 2>&1 | grep -v "^\s*$" | tail -25 | tee $D/build.log
import time, torch
from model_wrapper.kernels import fp8_deepgemm
from model_wrapper.kernels.fp8_act import _quantize
t = time.perf_counter()
try:
    fp8_deepgemm._runner(0)
    print(f"runner build/load {time.perf_counter() - t:.1f} s")
except Exception as e:
    print(f"runner FAILED after {time.perf_counter() - t:.1f} s: {e!r:.3000}")
    open("/tmp/dg_runner_failed", "w").write("1")
    raise SystemExit(1)
for M, N, K in ((4096, 4096, 4096), (256, 6144, 4096)):
    x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
    a, s = _quantize(x, 128, None, rows=M, outer=True)
    w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    b = (torch.rand(N // 128, K // 128, device="cuda") * 1e-2).t()  # Fp8Method.block_scale's layout
    for i in range(2):
        torch.cuda.synchronize(); t = time.perf_counter()
        y = fp8_deepgemm.block_mm(a, s, M, w, b); torch.cuda.synchronize()
        print(f"[{N}, {K}] M={M} call {i}: {time.perf_counter() - t:.3f} s (call 0: nvcc compile + load)", y is not None)
EOF
mkdir -p /tmp/dg_cache/cache; [ -d /tmp/dgpre/dg_cache/cache ] && cp -rn /tmp/dgpre/dg_cache/cache/* /tmp/dg_cache/cache/
cat $D/setup.log
BE=cublaslt,deepgemm,bf16; [ -f /tmp/dg_runner_failed ] && BE=cublaslt,bf16
# 2) the probe: four Llama-3-8B GEMMs at 4096 (first), 2048, 1024, 512, 256, 128, 64, 17 tokens
timeout $(left 140) python3 benchmarks/bench_fp8_block_gemm.py --backends $BE --out $D 2>&1 | grep -v " INFO " \
  | tail -45 | tee $D/probe.log
# 3) the 4k prefill step (Llama-3-8B shape, random block-FP8): default (cuBLASLt) against the DeepGEMM backend, profiled
[ -f /tmp/dg_runner_failed ] || timeout $(left 170) python3 benchmarks/bench_fp8.py --prefill-only --profile-prefill \
  --prefill-variants '{"deepgemm": {"fp8_block_gemm_backend": "deepgemm"}, "deepgemm_b": {"fp8_block_gemm_backend": "deepgemm"}}' \
  --out $D 2>&1 | grep -v " INFO \|it/s\]" | tail -30 | tee $D/prefill.log
# 4) CUDA tests of the backend (GEMM vs float64, fp8_linear / fused input wiring, graph replay, tiny model within bounds)
timeout $(left 120) python3 -m pytest -q -p no:cacheprovider -m cuda tests/kernels/test_fp8_deepgemm.py 2>&1 \
  | tail -25 | tee $D/cuda_tests.log
ls /tmp/dg_cache/cache | wc -l > $D/kernels_cached.txt
echo "dgemm done in $(( $(date +%s) - START )) s" | tee -a $D/setup.log
