# session 52 c6: the one kernel (default from batch 64) under PDL against without and against two kernels; CUDA tests
# of the final code (rope_decode_attention kernel tests, decode attention, the model-level graph test)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
V='{"off":{"decode_rope_attention_min_batch":1073741824},"pdl":{"decode_attention_pdl_max_batch":256},"again":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 64,128 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"off":{"decode_rope_attention_min_batch":1073741824},"pdl":{"decode_attention_pdl_max_batch":256},"again":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 64,128 --contexts 512 \
  --variants new --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 120 python3 -m pytest -m cuda -q tests/kernels/test_rope_decode_attention.py tests/kernels/test_decode_attention.py > $OUT/tk.log 2>&1
echo "tk rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 python3 -m pytest -m cuda -q tests/model_wrapper/test_cuda_model.py -k "rope_and_the_store or graph_replay or padding or no_host" > $OUT/tm.log 2>&1
echo "tm rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "^decode" $OUT/fp8.log | cut -c1-60; grep -hE "decode B=" $OUT/moe.log | cut -c1-70; tail -2 $OUT/tk.log; grep -E "^E |passed|failed" $OUT/tm.log | head
cd $OUT && tar cJf c6.tar.xz fp8 moe fp8.log moe.log tk.log tm.log && rm -rf fp8 moe
