# session 49 c5 (H200): the W8A8 CUDA tests on the vectorized float64 oracle (tests/kernels/moe_w8a8_oracle.py), one
# process (c4 ran them under 12 xdist workers: 350-430 s each at 257 tokens on the pair-by-pair oracle)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 400 python3 -m pytest -q -rfE --durations=12 -m cuda tests/kernels/test_moe_kernel.py tests/model_wrapper/test_moe_fp8_shards.py \
  tests/model_wrapper/test_moe_fp8_formats.py -k "w8a8 or rank_slices or ct_experts" > $OUT/t_w8a8.log 2>&1
echo "w8a8 tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 18 $OUT/t_w8a8.log
