# session 43, c7 (one GPU, any card): where an FP8 Llama-3-8B decode step's kernel time goes at batch 1 / 8 / 32
# (bf16, per-channel, block; eager, per kernel name), for the next session's aim at issue 25's 1.5-1.8x rows
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
cp benchmarks/results/session43/scripts/fp8_profile.py .probe/fp8_profile.py
timeout 300 taskset -c 0-15 python3 .probe/fp8_profile.py $OUT > $OUT/fp8_profile.log 2>&1; echo "profile rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; cut -c1-130 $OUT/fp8_profile.log | grep -v Warning | tail -140
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
