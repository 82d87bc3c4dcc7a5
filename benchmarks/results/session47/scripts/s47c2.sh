# session 47 c2: the skinny kernel's TMA weight tiles now on for block weights (default) - A/B against pointer loads
# and stage counts; a scale a row with 128-column tiles (the swizzle's width) through TMA; checkpoint-level FP8 CUDA
# tests under the new default; the FP8-expert MoE decode step's kernel breakdown at batch 32
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 2,4,8,16 --configs fp8 \
  --fp8-variants '{"ptr": {"fp8_skinny_mma_tma": false}, "s4": {"fp8_skinny_mma_stages": 4}, "s6": {"fp8_skinny_mma_stages": 6}, "again": {}, "ptr2": {"fp8_skinny_mma_tma": false}}' \
  --out $OUT/fp8_block > $OUT/fp8_block.log 2>&1
echo "fp8 block rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 150 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 2,4,8,16 --configs fp8 \
  --fp8-variants '{"tma": {"fp8_skinny_mma_row_tma": true}, "tma128": {"fp8_skinny_mma_row_tma": true, "fp8_skinny_mma_row_block_k": 128}, "k128": {"fp8_skinny_mma_row_block_k": 128}, "again": {}}' \
  --out $OUT/fp8_channel > $OUT/fp8_channel.log 2>&1
echo "fp8 channel rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 170 taskset -c 0-15 python3 -m pytest -q -m cuda tests/model_wrapper/test_fp8_checkpoint.py > $OUT/t_ckpt.log 2>&1
echo "ckpt tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 100 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 32 --contexts 512 \
  --variants new-fp8,new --profile new-fp8,new --out $OUT/moe_prof > $OUT/moe_prof.log 2>&1
echo "moe prof rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_ckpt.log; grep -hE "^decode " $OUT/fp8_*.log
grep -vE "INFO|WARN|Warning" $OUT/moe_prof.log | tail -n 60 | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
