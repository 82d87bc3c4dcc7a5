# session 40 call c6: skinny_mma at 17-64 tokens against the cuBLASLt paths, block (GPU0) | per-channel (GPU1)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); G1=1; [ "$NG" -lt 2 ] && G1=0
V='{"mma32": {"fp8_skinny_mma_max_tokens": 32}, "mma64": {"fp8_skinny_mma_max_tokens": 64}}'
( CUDA_VISIBLE_DEVICES=0 timeout 130 taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --decode-only --batches 32,64 --configs fp8 --fp8-variants "$V" --out $OUT/block > $OUT/block.log 2>&1; echo "block rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( CUDA_VISIBLE_DEVICES=$G1 timeout 130 taskset -c 16-31 python3 benchmarks/bench_fp8.py --kind channel --decode-only --batches 32,64 --configs fp8 --fp8-variants "$V" --out $OUT/channel > $OUT/channel.log 2>&1; echo "channel rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/gpus.txt $OUT/rc.txt; grep -h "^decode\|Error\|error" $OUT/block.log $OUT/channel.log | cut -c1-160
