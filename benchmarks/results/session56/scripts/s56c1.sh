# session 56 c1: moe_w8a8_act_quant (gate_up quantizes down's operand in its epilogue): its CUDA tests, then the
# Qwen3-30B-A3B FP8-experts decode (batch 8 / 32 / 128, ctx 512) and prefill (1k / 4k) rows, off / on / off / on
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 240 python3 -m pytest -q -m cuda tests/kernels/test_moe_kernel.py -k "w8a8 or norm_quantized" > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"aq-fp8":{"moe_w8a8_act_quant":true},"again-fp8":{},"aq2-fp8":{"moe_w8a8_act_quant":true}}'
timeout 330 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 8,32,128 --contexts 512 \
  --variants new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT moe 2>/dev/null; rm -rf $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/tests.log; grep -hE "decode B=|prefill T=|logit" $OUT/moe.log | cut -c1-110
