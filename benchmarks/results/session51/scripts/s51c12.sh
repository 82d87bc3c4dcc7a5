# session 51 c12 (H200): issue 26's decode rows on the final tree against session 50's chunk (s50), ctx 512
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"s50":{"moe_align_small_chunk":128},"s50-fp8":{"moe_align_small_chunk":128}}'
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8 --variants-json "$V" --out $OUT/moe512 > $OUT/moe512.log 2>&1
echo "moe512 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/moe512.log | cut -c1-100
cd $OUT && tar cJf moe_c12.tar.xz moe512 && rm -rf moe512
