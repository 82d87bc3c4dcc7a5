# fuse, final check (issue 25/26 batch-1 fusion): 1 GPU, about 2.5 minutes (timeouts 60 + 60 + 45 + 90 s).
# Branch h/s34-fuse (worktree /work/wt/fuse), HEAD c966169 or later. The defaults changed: KernelConfig.gemv_add_norm
# is ON at 1-token steps for a dense MLP's gate_up (bf16 and FP8 GEMVs), qkv off; the MoE router part was removed
# (the moe helper owns moe_route.py now). Checks: the GPU tests of the switch, the default decode path against
# transformers, FP8 checkpoints, and the default against off in one run (batch 1 and 2; 2 must be unchanged).
mkdir -p $OUT/fuse
timeout 60 python3 -m pytest -q -p no:cacheprovider -m cuda tests/model_wrapper/test_add_norm_cuda.py 2>&1 | tail -6 \
  | tee $OUT/fuse/cuda_tests.log
timeout 60 python3 -m pytest -q -p no:cacheprovider -m cuda tests/model_wrapper/test_cuda_model.py \
  -k "gemv or graph_replay" 2>&1 | tail -6 | tee $OUT/fuse/cuda_model_tests.log
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_norm_prologue.py 2>&1 | tail -4 \
  | tee $OUT/fuse/kernel_tests.log
OFF='{"off": {"gemv_add_norm": false}, "on2": {}, "off2": {"gemv_add_norm": false}}'
timeout 90 python3 benchmarks/bench_fp8.py --decode-only --batches 1,2 --configs bf16,fp8 --bf16-variants "$OFF" \
  --fp8-variants "$OFF" --out $OUT/fuse 2>&1 | grep -v " INFO " | tee $OUT/fuse/fp8_decode.log | grep -E "^decode|Error|error"
