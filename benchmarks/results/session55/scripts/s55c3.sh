# session 55 c3: decode_attention_fat (one program a SM where the pairs nearly fill the SMs) against the default, in
# decode steps (Qwen3-30B-A3B bf16 / FP8 experts; Llama-3-8B bf16 / block FP8), and its kernel tests on the GPU
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 python3 -m pytest -q -m cuda tests/kernels/test_decode_attention.py > $OUT/tk.log 2>&1
echo "tk rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"fat":{"decode_attention_fat":true},"again":{},"fat-fp8":{"decode_attention_fat":true},"again-fp8":{}}'
timeout 240 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 8,16,32 --contexts 512,2048 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"fat":{"decode_attention_fat":true},"again":{}}'
for ctx in 512 2048; do
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 4,8,16 --configs bf16,fp8 --context $ctx \
  --bf16-variants "$V" --fp8-variants "$V" --out $OUT/l$ctx > $OUT/llama$ctx.log 2>&1
echo "llama$ctx rc=$? $(date +%T)" >> $OUT/rc.txt
done
tar cf $OUT/json.tar -C $OUT moe l512 l2048 2>/dev/null; rm -rf $OUT/moe $OUT/l512 $OUT/l2048
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/tk.log; grep -hE "^decode" $OUT/llama*.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log | cut -c1-90
