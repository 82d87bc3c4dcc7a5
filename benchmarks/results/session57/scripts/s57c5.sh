# session 57 c5: the Qwen3-30B-A3B 4k prefill's wall clock against its GPU time (c4: 84-101 ms against 59): the
# allocator's retries, the GPU span and the host's CUDA calls, at 48 layers (61 GB of bf16 weights on an 80 GB card)
# and 24
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 400 taskset -c 0-15 python3 benchmarks/results/session57/scripts/s57c5_prefill_gaps.py --layers 48,24 \
  > $OUT/gaps.log 2>&1
echo "gaps rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; grep -vE "^-|^Name|^ *$|Self CPU" $OUT/gaps.log | cut -c1-150 | head -90
