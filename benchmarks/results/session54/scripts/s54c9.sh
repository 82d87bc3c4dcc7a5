# session 54 c9 (H100, where block FP8 batch 1 is 1.17-1.18x its floor against issue 25's 1.15x): two kernels a layer
# fewer at batch 1, each measured before on other trees / cards: the input norm in the qkv GEMV's prologue (qn:
# gemv_add_norm_qkv, off since session 34: FP8 -0.6%, Qwen3 +2-3%), RoPE + store + attention in one kernel (ra:
# decode_rope_attention_min_batch 1; session 52: even on the H200 at batch 1), both (qnra)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"qn":{"gemv_add_norm_qkv":true},"ra":{"decode_rope_attention_min_batch":1},"qnra":{"gemv_add_norm_qkv":true,"decode_rope_attention_min_batch":1},"again":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/chn > $OUT/chn.log 2>&1
echo "chn rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"qn":{"gemv_add_norm_qkv":true},"ra":{"decode_rope_attention_min_batch":1},"again":{},"ckpt-qn-fp8":{"gemv_add_norm_qkv":true},"ckpt-ra-fp8":{"decode_rope_attention_min_batch":1},"ckpt-again-fp8":{}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1 --contexts 512 \
  --variants new,ckpt-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT fp8 chn moe 2>/dev/null; rm -rf $OUT/fp8 $OUT/chn $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log $OUT/chn.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log | cut -c1-75
