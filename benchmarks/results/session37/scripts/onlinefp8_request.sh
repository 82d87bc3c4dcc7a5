# onlinefp8: 1 GPU, about 1-2 minutes (each step has its own timeout). Branch h/s37-onlinefp8:
# quantization="fp8" (a bf16 / fp32 checkpoint quantized to block FP8 at load, served as a
# transformers fine-grained FP8 checkpoint). Steps: (1) the new CUDA tests (e4m3 kept on CUDA, logits
# within test_fp8_checkpoint's FP8 bounds of fp32 transformers on the dequantized weights; dense + MoE; prints both errors), (2) the same file's CPU tests
# on the device's torch 2.11 (the quantizer's e4m3 casts), (3) regression: the block-FP8 checkpoint CUDA tests.
mkdir -p $OUT/onlinefp8
timeout 200 python3 -m pytest -q -s -p no:cacheprovider -m cuda -rs tests/model_wrapper/test_online_fp8.py \
  2>&1 | tail -30 | tee $OUT/onlinefp8/cuda_tests.log
timeout 200 python3 -m pytest -q -p no:cacheprovider -m "not cuda" -x tests/model_wrapper/test_online_fp8.py \
  2>&1 | tail -15 | tee $OUT/onlinefp8/cpu_tests_on_device.log
timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda tests/model_wrapper/test_fp8_checkpoint.py \
  -k "keeps_fp8 or experts" 2>&1 | tail -10 | tee $OUT/onlinefp8/regression.log
