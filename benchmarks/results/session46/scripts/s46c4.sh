# session 46 c4: the fused RoPE + store with token tiles (_rope_store_rows_kernel) alone and in Qwen3-30B-A3B's prefill
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 60 taskset -c 0-15 python3 -m pytest -q tests/kernels/test_kv_store.py > $OUT/t_kv_store.log 2>&1
echo "kv tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 200 taskset -c 0-15 python3 benchmarks/ab_rope_store.py --out $OUT/rope > $OUT/rope.log 2>&1
echo "rope rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 240 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1 --contexts 512 \
  --variants new,rope-t1,rope-t16,rope-t32,new2 --profile-prefill rope-t16 --out $OUT/moe_rope > $OUT/moe_rope.log 2>&1
echo "moe rope rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/t_kv_store.log; grep -E " us" $OUT/rope.log | cut -c1-120; tail -3 $OUT/rope.log | cut -c1-300
grep -E "decode B=|prefill T=|^  " $OUT/moe_rope.log | cut -c1-140
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
