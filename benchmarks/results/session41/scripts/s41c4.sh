# session 41 call c4: the router's cost past the decode path (sweep_moe: a layer against its experts alone at 1 / 8 /
# 32 tokens); the e4m3 KV decode attention on the H200 (bench_fp8_kv, batch 32-128 x 2k / 8k); test_mixed_graph alone
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 80 taskset -c 0-15 python3 benchmarks/sweep_moe.py --switches --only experts-only --tokens 1,8,32 --out $OUT/router.json \
  > $OUT/router.log 2>&1; echo "router rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 100 taskset -c 0-15 python3 benchmarks/bench_fp8_kv.py --batches 32,64,128 --contexts 2048,8192 --out $OUT/kv > $OUT/kv.log 2>&1
echo "kv rc=$? $(date +%T)" >> $OUT/rc.txt
OMP_NUM_THREADS=8 timeout 390 taskset -c 0-15 python3 -m pytest -q -rA -p no:cacheprovider -m cuda tests/model_wrapper/test_mixed_graph.py \
  > $OUT/t_mixed_graph.log 2>&1; echo "mixed rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "^T=" $OUT/router.log | cut -c1-100; grep -iE "fraction|e4m3|triton|flashinfer" $OUT/kv.log | tail -24 | cut -c1-160
grep -E "^(PASSED|FAILED|ERROR)" $OUT/t_mixed_graph.log | cut -c1-200; tail -1 $OUT/t_mixed_graph.log
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
