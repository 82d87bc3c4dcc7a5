# moe FINAL CHECK 2 (issue 26, session 34): 1 GPU, about 3 minutes (timeouts 80 + 30 + 45 + 90 s; usually less).
# Branch h/s34-moe (worktree /work/wt/moe), HEAD 0a971cf or later. Since run_1341: two defaults flipped from its A/B
# (KernelConfig.moe_route_sort on: the routing top-k by tl.topk; FP8 expert GEMV tiles 8k). Checks: the MoE kernel /
# routing CUDA tests, the sm90 compile test (SASS load order), the MoE / FP8-expert model tests under the new
# defaults, and the whole model new / new-fp8 beside the old values (route-rank, t16k-fp8) at batch 1 and 32.
mkdir -p $OUT/moe
timeout 80 python3 -m pytest -q -p no:cacheprovider -m cuda tests/kernels/test_moe_kernel.py \
  tests/kernels/test_moe_route.py 2>&1 | tail -6 | tee $OUT/moe/kernel_tests.log
timeout 30 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_moe_compile.py 2>&1 | tail -6 \
  | tee $OUT/moe/compile_tests.log
timeout 45 python3 -m pytest -q -p no:cacheprovider -m cuda tests/model_wrapper/test_moe.py \
  tests/model_wrapper/test_fp8_checkpoint.py -k "moe or expert or qwen3" 2>&1 | tail -6 | tee $OUT/moe/model_tests.log
timeout 90 python3 benchmarks/bench_moe.py --out $OUT/moe --decode-only --no-peer --batches 1,32 --contexts 512 \
  --variants new,route-rank,new-fp8,t16k-fp8 2>&1 | grep -v " INFO " | tee $OUT/moe/bench.log \
  | grep -E "decode B=|logits B=|rror"
