# session 52 c1: upper bounds of fusing the decode attention chain (hacks: outputs wrong, timings only)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
git apply .probe/hack.patch && echo applied >> $OUT/rc.txt
V='{"norope":{"hack_no_rope":true},"nomerge":{"hack_no_merge":true},"noattn":{"hack_no_attn":true},"none":{"hack_no_rope":true,"hack_no_attn":true},"norope-fp8":{"hack_no_rope":true},"nomerge-fp8":{"hack_no_merge":true},"noattn-fp8":{"hack_no_attn":true},"none-fp8":{"hack_no_rope":true,"hack_no_attn":true}}'
timeout 280 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8 --contexts 512 \
  --variants new,new-fp8 --variants-json "$V" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
V2='{"norope":{"hack_no_rope":true},"nomerge":{"hack_no_merge":true},"noattn":{"hack_no_attn":true},"none":{"hack_no_rope":true,"hack_no_attn":true}}'
timeout 250 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8 --configs bf16,fp8 \
  --fp8-variants "$V2" --bf16-variants "$V2" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/moe.log | cut -c1-100; grep -hiE "B=|batch" $OUT/fp8.log | tail -30 | cut -c1-120
cd $OUT && tar cJf c1.tar.xz moe fp8 moe.log fp8.log && rm -rf moe fp8
