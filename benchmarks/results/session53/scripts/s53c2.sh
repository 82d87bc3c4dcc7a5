# session 53 c2: the 16-bit GEMV at 2 tokens on this card (H200: bf16 batch 2 at 1.43x against batch 4's 1.23x in s52 c3)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 benchmarks/profile_dense_decode.py --batches 1,2 --models bf16,fp8 --out $OUT/prof > $OUT/prof.log 2>&1
echo "prof rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"g1":{"gemv_max_tokens":1},"g1f":{"gemv_max_tokens":1,"fp8_gemv_max_tokens":1},"t8k":{"gemv_tile":8192},"w4":{"gemv_warps":4},"t32k":{"gemv_tile":32768},"again":{}}'
timeout 240 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,2,3 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"g1":{"gemv_max_tokens":1},"t8k":{"gemv_tile":8192},"again":{},"g1-fp8":{"gemv_max_tokens":1},"again-fp8":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,2,3 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -v INFO $OUT/prof.log | head -70; grep -hE "^decode" $OUT/fp8.log | cut -c1-60; grep -hE "decode B=" $OUT/moe.log | cut -c1-70
cd $OUT && tar cJf c2.tar.xz prof fp8 moe prof.log fp8.log moe.log && rm -rf fp8 moe prof
