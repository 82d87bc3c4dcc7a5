# session 53 c10: the bf16 MoE GEMVs at 4 warps from 2 tokens (m4); issue 25 / 26 rows on this tree
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"m4":{"moe_gemv_multi_warps":4},"again":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,3,4 --contexts 512 \
  --variants new --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8,32,128 --configs bf16,fp8 \
  --out $OUT/rows25 > $OUT/rows25.log 2>&1
echo "rows25 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8 --out $OUT/rows26 > $OUT/rows26.log 2>&1
echo "rows26 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/moe.log $OUT/rows26.log | cut -c1-70; grep -hE "^decode" $OUT/rows25.log | cut -c1-60
