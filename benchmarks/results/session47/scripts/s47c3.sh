# session 47 c3 (H100): the skinny kernel's TMA weight tiles (default for block weights since c2) against pointer
# loads on this card, 8B decode and the Qwen3-30B-A3B FP8 checkpoint's attention projections; a scale a row with TMA
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 120 taskset -c 0-15 python3 -m pytest -q tests/kernels/test_fp8_kernels.py -k skinny_mma > $OUT/t_skinny.log 2>&1
echo "skinny tests rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 130 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 2,4,8,16 --configs fp8 \
  --fp8-variants '{"ptr": {"fp8_skinny_mma_tma": false}, "again": {}, "ptr2": {"fp8_skinny_mma_tma": false}}' \
  --out $OUT/fp8_block > $OUT/fp8_block.log 2>&1
echo "fp8 block rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 110 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 2,4,8,16 --configs fp8 \
  --fp8-variants '{"tma": {"fp8_skinny_mma_row_tma": true}, "again": {}}' --out $OUT/fp8_channel > $OUT/fp8_channel.log 2>&1
echo "fp8 channel rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 130 taskset -c 0-15 python3 benchmarks/bench_moe.py --no-peer --decode-only --batches 2,8,16 --contexts 512 \
  --variants new-fp8,ckpt-ptr-fp8,ckpt-fp8 --out $OUT/moe_ckpt > $OUT/moe_ckpt.log 2>&1
echo "moe ckpt rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 2 $OUT/t_skinny.log; grep -hE "^decode " $OUT/fp8_*.log; grep -hE "decode B=" $OUT/moe_*.log | cut -c1-150
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
