# session 58 c6: KernelConfig.fp8_quant_reciprocal (new, on): the activation quantize kernels divide by the scale
# through its reciprocal. The kernel-level CUDA tests of test_fp8_act.py (bit for bit against quantize_fp8_reference
# on the GPU), the kernels alone on / off (ab_fp8_quant.py), the per-channel 4k prefill on / off in one process
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 60 python3 -m pytest -m cuda -q -rf --tb=short tests/kernels/test_fp8_act.py \
  -k "reference or per_token_quantization or take_the" > $OUT/test.log 2>&1
echo "test rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 40 taskset -c 0-15 python3 benchmarks/ab_fp8_quant.py --out $OUT/ab > $OUT/ab.log 2>&1
echo "ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --prefill-only \
  --prefill-variants '{"div.rn": {"fp8_quant_reciprocal": false}}' --out $OUT/pre > $OUT/pre.log 2>&1
echo "pre rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT ab pre 2>/dev/null; rm -rf $OUT/ab $OUT/pre
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/test.log; grep -vi warn $OUT/ab.log | tail -7; grep -hE "^prefill [0-9]" $OUT/pre.log | cut -c1-200
