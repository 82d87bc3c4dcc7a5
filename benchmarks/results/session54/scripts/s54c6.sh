# session 54 c6: the FP8 GEMV's tile / rounds / warps at batch 1 on an H200 (the defaults were swept on H100s)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"t16r1":{"fp8_gemv_tile":16384,"fp8_gemv_rounds":1},"t16r2":{"fp8_gemv_tile":16384},"t32r1":{"fp8_gemv_rounds":1},"t32r4":{"fp8_gemv_rounds":4},"t64r2":{"fp8_gemv_tile":65536},"t64r4":{"fp8_gemv_tile":65536,"fp8_gemv_rounds":4},"w8":{"fp8_gemv_warps":8},"w8t64r2":{"fp8_gemv_warps":8,"fp8_gemv_tile":65536},"again":{}}'
timeout 250 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 250 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/chn > $OUT/chn.log 2>&1
echo "chn rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT fp8 chn 2>/dev/null; rm -rf $OUT/fp8 $OUT/chn
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode|Error|error" $OUT/fp8.log $OUT/chn.log | cut -c1-70
