# session 48 c3 (H200): moe_w8a8_quant_in_gemm (the W8A8 small tiles quantize their activation tiles themselves)
# -- its CUDA tests, then bench_moe's FP8 decode rows against the default in the same run
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "quantized_in or w8a8_cuda" > $OUT/t_moe.log 2>&1
echo "moe tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 240 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,16,32,64,128 --contexts 512 \
  --variants new-fp8,quant-fp8,new2-fp8,quant2-fp8 --out $OUT/moe_quant > $OUT/moe_quant.log 2>&1
echo "moe quant rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32 --contexts 512 \
  --variants ckpt-fp8,ckpt-quant-fp8 --out $OUT/moe_ckpt > $OUT/moe_ckpt.log 2>&1
echo "moe ckpt rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_moe.log
grep -hE "decode B=" $OUT/moe_*.log | cut -c1-150
