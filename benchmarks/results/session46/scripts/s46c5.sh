# session 46 c5: the rows kernel's lower bound (ab_rope_store at 32-4096 tokens); model-level A/B of the new defaults
# (rope_store_max_tokens unbounded, token tiles) against session 45's (rope-s45) on Qwen3-30B-A3B (profiled at 1k / 4k)
# and Llama-3-8B FP8 prefill; GPU tests of the fused RoPE + store
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
true \
  > /dev/null
echo "rope small rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 240 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1 --contexts 512 \
  --variants new,rope-s45,new2 --profile-prefill new,rope-s45 --profile-prefill-tokens 1024,4096 --out $OUT/moe_ab > $OUT/moe_ab.log 2>&1
echo "moe ab rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/bench_fp8.py --prefill-only --skip-engine --kind block \
  --prefill-variants '{"s45": {"rope_store_max_tokens": 1024, "rope_store_block_t_min_tokens": 1073741824}}' --out $OUT/fp8_pf > $OUT/fp8_pf.log 2>&1
echo "fp8 pf rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 60 taskset -c 0-15 python3 -m pytest -q tests/kernels/test_kv_store.py > $OUT/t_kv.log 2>&1
timeout 300 taskset -c 0-15 python3 -m pytest -q -m cuda tests/model_wrapper/test_cuda_model.py tests/model_wrapper/test_mixed_graph.py \
  -k "long_prefill or flashinfer_matches or lora or fresh_prompts or mixed" > $OUT/t_cuda.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/t_kv.log $OUT/t_cuda.log; grep -E " us" $OUT/rope_small.log | cut -c1-80
grep -E "decode B=|prefill T=|^  .*(rope|RMSNorm|direct_copy|Rotary|store_kv)" $OUT/moe_ab.log | cut -c1-140
grep -iE "prefill|ms" $OUT/fp8_pf.log | grep -v "^$" | tail -25 | cut -c1-160
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
