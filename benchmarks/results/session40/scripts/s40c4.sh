# session 40 call c4: the issue-25 benchmark of the final tree, block FP8 (GPU0) | per-channel FP8 (GPU1), full runs
source .gpu/device-setup.sh > $OUT/setup.log 2>&1; source benchmarks/fa3_fp8_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; NG=$(nvidia-smi -L | wc -l); G1=1; [ "$NG" -lt 2 ] && G1=0
( CUDA_VISIBLE_DEVICES=0 timeout ${TB:-420} taskset -c 0-15 python3 benchmarks/bench_fp8.py --kind block --acc-tokens 1024 --out $OUT/block > $OUT/block.log 2>&1; echo "block rc=$? $(date +%T)" >> $OUT/rc.txt ) &
( CUDA_VISIBLE_DEVICES=$G1 timeout ${TC:-420} taskset -c 16-31 python3 benchmarks/bench_fp8.py --kind channel --acc-tokens 1024 --out $OUT/channel > $OUT/channel.log 2>&1; echo "channel rc=$? $(date +%T)" >> $OUT/rc.txt ) &
wait
cat $OUT/gpus.txt $OUT/rc.txt; for k in block channel; do echo "== $k"; grep -vE "INFO|Warning|warn" $OUT/$k.log | grep -E "decode|prefill|engine|tok/s|top-1|KL|bandwidth" | cut -c1-200 | head -30; done
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
