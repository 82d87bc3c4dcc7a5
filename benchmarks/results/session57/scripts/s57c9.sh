# session 57 c9: the in-process engine (LLMEngine, Llama-3-8B shape, bf16, random weights) with host_threads' one
# torch CPU thread (new default) against the default pool (OMP_NUM_THREADS=16), each arm its own process; a short load
# (128 prompts of 512 tokens, 64 new tokens each), transformers skipped
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
for arm in one pool; do
  case $arm in pool*) E="OMP_NUM_THREADS=16";; *) E="";; esac
  env $E timeout 140 taskset -c 0-15 python3 benchmarks/bench_engine.py --skip-hf --num-prompts 128 --output-len 64 \
    --checkpoint /tmp/ck8b --out $OUT/engine_$arm > $OUT/engine_$arm.log 2>&1
  echo "engine $arm rc=$? $(date +%T)" >> $OUT/rc.txt
done
cat $OUT/gpus.txt $OUT/rc.txt
for f in engine_one engine_pool; do echo "== $f"; grep -vE "Warning|warn" $OUT/$f.log | tail -6 | cut -c1-140; done
