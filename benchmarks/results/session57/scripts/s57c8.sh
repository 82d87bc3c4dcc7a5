# session 57 c8: TextGenerator's host_threads (one torch CPU thread on a GPU, new default) against the default pool
# (OMP_NUM_THREADS=16 leaves torch's 16 threads, as before), each in its own process: the CUDA test, Qwen3-30B-A3B
# prefill 1k / 4k (bench_moe), Llama-3-8B bf16 / block-FP8 4k prefill (bench_fp8 --prefill-only)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 120 python3 -m pytest -m cuda -q -rf --tb=short tests/text_generator/test_host_threads.py > $OUT/test.log 2>&1
echo "test rc=$? $(date +%T)" >> $OUT/rc.txt
for arm in one pool one2 pool2; do
  case $arm in pool*) E="OMP_NUM_THREADS=16";; *) E="";; esac
  env $E timeout 200 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --batches 1 --contexts 512 \
    --variants new --out $OUT/moe_$arm > $OUT/moe_$arm.log 2>&1
  echo "moe $arm rc=$? $(date +%T)" >> $OUT/rc.txt
done
for arm in one pool; do
  case $arm in pool*) E="OMP_NUM_THREADS=16";; *) E="";; esac
  env $E timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --prefill-only --out $OUT/fp8_$arm \
    > $OUT/fp8_$arm.log 2>&1
  echo "fp8 $arm rc=$? $(date +%T)" >> $OUT/rc.txt
done
tar cf $OUT/json.tar -C $OUT moe_one moe_pool moe_one2 moe_pool2 fp8_one fp8_pool 2>/dev/null
rm -rf $OUT/moe_one $OUT/moe_pool $OUT/moe_one2 $OUT/moe_pool2 $OUT/fp8_one $OUT/fp8_pool
cat $OUT/gpus.txt $OUT/rc.txt; tail -2 $OUT/test.log
for f in moe_one moe_pool moe_one2 moe_pool2; do echo "== $f"; grep -hE "prefill T=|decode B=" $OUT/$f.log | cut -c1-100; done
for f in fp8_one fp8_pool; do echo "== $f"; grep -hiE "prefill" $OUT/$f.log | grep -v Warn | cut -c1-140 | head -12; done
