# session 54 c11 (H100): c10's MoE half again at ctx 512 alone (c10 asked for 2048 too, whose batch-128 cache did not
# fit the 80 GB card): the graphs' decode attention on FlashInfer's kernel (triton_decode false), Qwen3-30B-A3B
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"fid":{"triton_decode":false},"again":{},"fid-fp8":{"triton_decode":false},"again-fp8":{}}'
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe 2>/dev/null; rm -rf $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=" $OUT/moe.log | cut -c1-75
