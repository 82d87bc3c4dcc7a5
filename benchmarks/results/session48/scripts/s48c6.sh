# session 48 c6 (H200): the final rule (moe_w8a8_norm_quant on from 256 pairs): bench_moe's FP8 rows against the
# switch off in the same run, then the FP8 experts' model-level CUDA tests under the final defaults
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 110 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new-fp8,nqoff-fp8,new2-fp8 --out $OUT/moe_final > $OUT/moe_final.log 2>&1
echo "moe final rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 110 taskset -c 0-15 python3 -m pytest -q -m cuda tests/model_wrapper/test_fp8_checkpoint.py -k "expert" \
  tests/kernels/test_moe_kernel.py::test_norm_quantized_x_cuda > $OUT/t_final.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_final.log; grep -h FAILED $OUT/t_*.log | head
grep -hE "decode B=" $OUT/moe_final.log | cut -c1-150
