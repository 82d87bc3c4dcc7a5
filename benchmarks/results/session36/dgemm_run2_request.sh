# dgemm FOLLOW-UP (h/s36-dgemm @ a18f714 or later): 1 GPU (H100), <= 3 minutes (deadline inside). Run 1's request and results
# are in the branch (benchmarks/results/session36/dgemm_run1_*). Same setup as run 1: .fiextra/fi_nv_internal.tar.xz
# and .fiextra/dgemm_prebuilt.tar.xz (/work/gpu_requests/dgemm_prebuilt.tar.xz). Writes under $OUT/dgemm/run2/.
# 1) the backend's CUDA tests after run 1's two failures (the graph test asserted on a size another test had run; the
#    model test now an A/B against the cuBLASLt backend, printing both top-1s) + the fused block path's tests;
# 2) Llama-3-8B shape, random block-FP8, one bench_fp8.py run: the decode step at batch 32 / 64 / 128 (CUDA graphs; 32-128
#    tokens take the block path) and the 128-token prefill step (a mixed CUDA graph): cuBLASLt (default) against "auto".
D=$OUT/dgemm/run2; mkdir -p $D
START=$(date +%s)
left() { local l=$((170 - ($(date +%s) - START))); [ $l -gt $1 ] && echo $1 || echo $((l > 5 ? l : 5)); }
[ -d /tmp/site/flashinfer ] || source .gpu/device-setup.sh
source benchmarks/deepgemm_env.sh > $D/setup.log 2>&1  # (not piped: its exports must stay in this shell)
if [ -f .fiextra/dgemm_prebuilt.tar.xz ]; then
  mkdir -p /tmp/dgpre && tar -xJf .fiextra/dgemm_prebuilt.tar.xz -C /tmp/dgpre \
    && mkdir -p /tmp/site/flashinfer/data/aot/fp8_blockscale_gemm_90 /tmp/dg_cache/cache \
    && cp /tmp/dgpre/aot/fp8_blockscale_gemm_90/fp8_blockscale_gemm_90.so /tmp/site/flashinfer/data/aot/fp8_blockscale_gemm_90/ \
    && cp -rn /tmp/dgpre/dg_cache/cache/* /tmp/dg_cache/cache/ && echo "prebuilt unpacked" >> $D/setup.log
fi
cat $D/setup.log
timeout $(left 80) python3 -m pytest -q -p no:cacheprovider -m cuda -rA -s tests/kernels/test_fp8_deepgemm.py \
  tests/kernels/test_fp8_act.py > $D/cuda_tests_full.log 2>&1
grep "graphs=\|PASSED\|FAILED\|Error\|passed\|failed" $D/cuda_tests_full.log | tail -30 | tee $D/cuda_tests.log
timeout $(left 100) python3 benchmarks/bench_fp8.py --skip-accuracy --skip-engine --configs fp8 --batches 32,64,128 \
  --fp8-variants '{"auto": {"fp8_block_gemm_backend": "auto"}}' --prefill-tokens 128 \
  --prefill-variants '{"auto": {"fp8_block_gemm_backend": "auto"}, "auto_b": {"fp8_block_gemm_backend": "auto"}}' \
  --out $D 2>&1 | grep "decode\|prefill 128 tokens\|copy bandwidth\|Error\|error\|Traceback" | tail -20 | tee $D/bench.log
echo "dgemm follow-up done in $(( $(date +%s) - START )) s"
