# session 52 c7: o's input quantized by the decode attention's split merge (fp8_attention_out_quant): CUDA tests, A/B
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"off":{"fp8_attention_out_quant":false},"again":{}}'
timeout 110 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 2,4,8,16,32 --configs fp8 \
  --fp8-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"ckpt-off-fp8":{"fp8_attention_out_quant":false},"ckpt-again-fp8":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 4,8,32 --contexts 512 \
  --variants ckpt-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 100 python3 -m pytest -m cuda -q tests/kernels/test_decode_attention.py tests/model_wrapper/test_fp8_checkpoint.py -k "merge_quantizes or pdl or attention_merge or (keeps_fp8 and block)" > $OUT/t.log 2>&1
echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log | cut -c1-60; grep -hE "decode B=" $OUT/moe.log | cut -c1-75; grep -E "^E |passed|failed" $OUT/t.log | head
cd $OUT && tar cJf c7.tar.xz fp8 moe fp8.log moe.log t.log && rm -rf fp8 moe
