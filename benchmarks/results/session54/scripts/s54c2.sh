# session 54 c2: the L2 prefetch after qkv (kernels/prefetch.py, off): its CUDA test, then batch 1 / 8 A/B
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 python3 -m pytest -q tests/model_wrapper/test_cuda_model.py -k "l2_prefetch" > $OUT/t.log 2>&1
echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"pf":{"l2_prefetch_max_tokens":8},"pfm8":{"l2_prefetch_max_tokens":8,"l2_prefetch_mlp_bytes":8388608},"pf128":{"l2_prefetch_max_tokens":8,"l2_prefetch_programs":128},"xo":{"fp8_gemv_x_once":true},"again":{}}'
VB='{"pf":{"l2_prefetch_max_tokens":8},"pfm4":{"l2_prefetch_max_tokens":8,"l2_prefetch_mlp_bytes":4194304},"again":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1,8 --configs bf16,fp8 \
  --fp8-variants "$V" --bf16-variants "$VB" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
VM='{"pf":{"l2_prefetch_max_tokens":8},"again":{},"pf-fp8":{"l2_prefetch_max_tokens":8},"again-fp8":{}}'
timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 1,8 --contexts 512 \
  --variants new,new-fp8 --variants-json "$VM" --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT fp8 moe 2>/dev/null; rm -rf $OUT/fp8 $OUT/moe
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/t.log; grep -hE "^decode" $OUT/fp8.log | cut -c1-60
grep -hE "decode B=" $OUT/moe.log | cut -c1-75
