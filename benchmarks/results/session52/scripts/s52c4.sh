# session 52 c4: a dense decode step kernel by kernel (bf16, block FP8, batch 1); the one-kernel RoPE + store +
# attention from batch 64 (the new default) against off; the 16-bit / FP8 GEMVs at 2 tokens against the next path
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 benchmarks/profile_dense_decode.py --batches 1 --models bf16,fp8 --out $OUT/prof > $OUT/prof.log 2>&1
echo "prof rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"off":{"decode_rope_attention_min_batch":1073741824},"g1":{"gemv_max_tokens":1,"fp8_gemv_max_tokens":1},"again":{}}'
timeout 240 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,2,3,64,128,256 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"off":{"decode_rope_attention_min_batch":1073741824},"g1":{"gemv_max_tokens":1,"fp8_gemv_max_tokens":1},"again":{},"off-fp8":{"decode_rope_attention_min_batch":1073741824},"g1-fp8":{"gemv_max_tokens":1,"fp8_gemv_max_tokens":1},"again-fp8":{}}'
timeout 180 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 2,64,128 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -v INFO $OUT/prof.log | head -60; grep -hE "^decode" $OUT/fp8.log | cut -c1-60; grep -hE "decode B=" $OUT/moe.log | cut -c1-70
cd $OUT && tar cJf c4.tar.xz prof fp8 moe prof.log fp8.log moe.log && rm -rf fp8 moe prof
