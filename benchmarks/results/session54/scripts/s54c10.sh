# session 54 c10 (H100): the graphs' decode attention on FlashInfer's kernel instead of the Triton one (triton_decode
# false) at batch 8-128, Qwen3-30B-A3B (GQA 8, 4 KV heads: issue 26's batch-32 row) and Llama-3-8B
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
VM='{"fid":{"triton_decode":false},"again":{},"fid-fp8":{"triton_decode":false},"again-fp8":{}}'
timeout 300 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,32,128 --contexts 512,2048 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"fid":{"triton_decode":false},"again":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 8,32,128 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT fp8 moe 2>/dev/null; rm -rf $OUT/fp8 $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log | cut -c1-75
