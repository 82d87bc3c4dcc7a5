# written in session 58, not run (no device time left): the checks session 58 could not make on a GPU.
# 1. the split merge's o-input quantization with the reciprocal division (fixed in the commit after 18b8181; compiled
#    for sm90 on the CPU only), and the FP8 decode rows that run it (block FP8 at batch 3-32, skinny_mma);
# 2. the block-FP8 4k prefill with fp8_quant_reciprocal on / off (its SiLU-and-mul quantizer took 26% less time alone).
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 python3 -m pytest -m cuda -q -rf --tb=short tests/kernels/test_decode_attention.py tests/kernels/test_fp8_act.py \
  > $OUT/test.log 2>&1
echo "test rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8,32 --configs fp8 \
  --fp8-variants '{"div.rn": {"fp8_quant_reciprocal": false}}' --out $OUT/dec > $OUT/dec.log 2>&1
echo "dec rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --prefill-only \
  --prefill-variants '{"div.rn": {"fp8_quant_reciprocal": false}}' --out $OUT/pre > $OUT/pre.log 2>&1
echo "pre rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT dec pre 2>/dev/null; rm -rf $OUT/dec $OUT/pre
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/test.log; grep -hE "^decode" $OUT/dec.log; grep -hE "^prefill [0-9]" $OUT/pre.log | cut -c1-160
