source .gpu/device-setup.sh > $OUT/setup.log 2>&1
source benchmarks/deepgemm_env.sh >> $OUT/setup.log 2>&1
mkdir -p $OUT/job0 $OUT/job1
(CUDA_VISIBLE_DEVICES=0 timeout 330 taskset -c 0-15 python3 .probe/engprobe.py > $OUT/job0/engprobe.log 2>&1; echo "job0 rc=$? $(date +%T)" >> $OUT/rc.txt) &
(CUDA_VISIBLE_DEVICES=1 timeout 200 taskset -c 16-31 python3 .probe/fastacc.py > $OUT/job1/fastacc.log 2>&1; echo "job1 rc=$? $(date +%T)" >> $OUT/rc.txt) &
wait
cat $OUT/rc.txt; grep -v INFO $OUT/job0/engprobe.log | grep "tok/s\|slowest"; cat $OUT/job1/fastacc.log | grep -v INFO | tail -8
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
