# session 52 c2: RoPE + store + decode attention in one kernel: A/B (decode_rope_attention_max_batch) and CUDA tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"ra":{"decode_rope_attention_max_batch":256},"rapdl":{"decode_rope_attention_max_batch":256,"decode_attention_pdl_max_batch":256}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,2,8,32,128 --configs bf16,fp8,fp8+fp8kv \
  --fp8-variants "$V" --bf16-variants "$V" --fp8kv-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"ra":{"decode_rope_attention_max_batch":256},"rapdl":{"decode_rope_attention_max_batch":256,"decode_attention_pdl_max_batch":256},"ra-fp8":{"decode_rope_attention_max_batch":256},"rapdl-fp8":{"decode_rope_attention_max_batch":256,"decode_attention_pdl_max_batch":256}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8,32 --contexts 512,2048 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 python3 -m pytest -m cuda -q -x tests/kernels/test_rope_decode_attention.py tests/kernels/test_decode_attention.py > $OUT/tk.log 2>&1
echo "tk rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 python3 -m pytest -m cuda -q tests/model_wrapper/test_cuda_model.py -k "rope_and_the_store or graph_replay or padding" > $OUT/tm.log 2>&1
echo "tm rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log; grep -hE "decode B=" $OUT/moe.log | cut -c1-100; tail -3 $OUT/tk.log; tail -15 $OUT/tm.log
cd $OUT && tar cJf c2.tar.xz fp8 moe fp8.log moe.log tk.log tm.log && rm -rf fp8 moe
