# session 54 c4: where FP8 / bf16 batch 8 go (dense), where Qwen3-30B-A3B batch 1 / 32 go (bf16, FP8 experts);
# fp8_gemv_x_once (now on) against off once more
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 taskset -c 0-15 python3 benchmarks/profile_dense_decode.py --models bf16,fp8 --batches 8 \
  --out $OUT/prof > $OUT/prof.log 2>&1
echo "prof rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 240 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,32 --contexts 512 \
  --variants new,new-fp8 --profile new,new-fp8 --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"xoff":{"fp8_gemv_x_once":false},"again":{}}'
timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT fp8 prof moe 2>/dev/null; rm -rf $OUT/fp8 $OUT/prof $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log | cut -c1-60
grep -vE "^\s*$" $OUT/prof.log | grep -v "Warn\|INFO\|WARN\|warn" | tail -32
