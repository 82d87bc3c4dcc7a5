# fp8pre FINAL CHECK 2 (issue 25): 1 GPU, about 1 minute (timeouts 45 + 30 s). Branch h/s34-fp8pre (worktree /work/wt/fp8pre),
# HEAD be61bed or later. run_1341: every fused / standalone quantization test passed bit for bit on the H100 with the rtne
# conversion, but the model test SKIPPED (its tiny model at hidden 256 took no projection down the block-scaled path); it now
# uses hidden 512 / intermediate 1024. Step 2: the FP8 checkpoint CUDA tests again (block format, eager + graphs).
mkdir -p $OUT/fp8pre
timeout 45 python3 -m pytest -x -p no:cacheprovider -m cuda --tb=short -rs -q tests/kernels/test_fp8_act.py 2>&1 | tail -30 \
  | tee $OUT/fp8pre/fp8_act_tests.log
timeout 30 python3 -m pytest -q -p no:cacheprovider -m cuda --tb=short tests/model_wrapper/test_fp8_checkpoint.py \
  -k "keeps and block" 2>&1 | tail -15 | tee $OUT/fp8pre/fp8_checkpoint_tests.log
