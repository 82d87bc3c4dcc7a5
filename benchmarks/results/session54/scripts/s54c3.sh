# session 54 c3: why the L2 prefetch after qkv lost (c2): its CUDA tests; a profile of FP8 batch 1 with and without;
# the launch alone (16 bytes) against 4 / 8 MB of o and all of it
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 200 python3 -m pytest -m cuda -q tests/model_wrapper/test_cuda_model.py -k "l2_prefetch" > $OUT/t.log 2>&1
echo "t rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/profile_dense_decode.py --models fp8 --batches 1 \
  --variants '{"pf":{"l2_prefetch_max_tokens":8}}' --out $OUT/prof > $OUT/prof.log 2>&1
echo "prof rc=$? $(date +%T)" >> $OUT/rc.txt
V='{"hop":{"l2_prefetch_max_tokens":8,"l2_prefetch_o_bytes":16},"o4m":{"l2_prefetch_max_tokens":8,"l2_prefetch_o_bytes":4194304},"o8m":{"l2_prefetch_max_tokens":8,"l2_prefetch_o_bytes":8388608},"pf":{"l2_prefetch_max_tokens":8},"again":{}}'
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --decode-only --batches 1 --configs fp8 \
  --fp8-variants "$V" --out $OUT/fp8 > $OUT/fp8.log 2>&1
echo "fp8 rc=$? $(date +%T)" >> $OUT/rc.txt
tar cf $OUT/json.tar -C $OUT fp8 prof 2>/dev/null; rm -rf $OUT/fp8 $OUT/prof
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/t.log; grep -hE "^decode" $OUT/fp8.log | cut -c1-60
grep -vE "^\s*$" $OUT/prof.log | grep -v Warn | tail -40
