# session 52 c3: RoPE + store + decode attention in one kernel at every batch (the dtype check fixed): A/B with the
# default run again, and the CUDA tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"ra":{"decode_rope_attention_max_batch":256},"again":{"decode_rope_attention_max_batch":0}}'
timeout 230 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,2,4,8,16,32,128 --configs bf16,fp8,fp8+fp8kv \
  --fp8-variants "$V" --bf16-variants "$V" --fp8kv-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"ra":{"decode_rope_attention_max_batch":256},"again":{"decode_rope_attention_max_batch":0},"ra-fp8":{"decode_rope_attention_max_batch":256},"again-fp8":{"decode_rope_attention_max_batch":0}}'
timeout 180 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,4,8,32 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 100 python3 -m pytest -m cuda -q tests/kernels/test_rope_decode_attention.py > $OUT/tk.log 2>&1
echo "tk rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 python3 -m pytest -m cuda -q tests/model_wrapper/test_cuda_model.py -k "rope_and_the_store" > $OUT/tm.log 2>&1
echo "tm rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log | cut -c1-60; grep -hE "decode B=" $OUT/moe.log | cut -c1-70; tail -3 $OUT/tk.log; grep -E "^E |passed|failed" $OUT/tm.log | head -20
cd $OUT && tar cJf c3.tar.xz fp8 moe fp8.log moe.log tk.log tm.log && rm -rf fp8 moe
