# session 51 c4: issue 26's decode rows on this tree (chunks of 16 at decode sizes) against session 50's chunk of 128, ctx 512 / 2048
# (batch 128 at 2048 does not fit an 80 GB card beside the bf16 model)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"s50":{"moe_align_small_chunk":128},"s50-fp8":{"moe_align_small_chunk":128}}'
timeout 250 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8 --variants-json "$V" --out $OUT/moe512 > $OUT/moe512.log 2>&1
echo "moe512 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 250 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,32 --contexts 2048 \
  --variants new,new-fp8 --variants-json "$V" --out $OUT/moe2048 > $OUT/moe2048.log 2>&1
echo "moe2048 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/moe512.log $OUT/moe2048.log | cut -c1-100
cd $OUT && tar cJf moe_c4.tar.xz moe512 moe2048 && rm -rf moe512 moe2048
