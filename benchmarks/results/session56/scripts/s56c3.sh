# session 56 c3: issue 26's rows on this tree with transformers' own static-cache generate side by side (the peer row,
# last measured when the MoE path landed: 4.78x at batch 32 against the target 5x): Qwen3-30B-A3B shape, bf16 and FP8
# experts, decode at batch 1 / 8 / 32 / 128 (ctx 512), prefill 1k / 4k
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 560 taskset -c 0-15 python3 benchmarks/bench_moe.py --batches 1,8,32,128 --contexts 512 \
  --variants new,new-fp8 --out $OUT/moe > $OUT/moe.log 2>&1
echo "moe rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -hE "decode B=|prefill T=|transformers|logit" $OUT/moe.log | cut -c1-110
