# session 37 call 2: the 2-GPU tests (no DeepGEMM env: cuBLASLt, no nvcc at load), then two 1-GPU jobs
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd)
mkdir -p $OUT/tp2; timeout 200 python3 -m pytest -v -p no:cacheprovider -m cuda -rs --durations=0 tests/model_wrapper/test_moe_fp8_shards.py::test_cuda_tp2_nccl_block_fp8_experts tests/model_wrapper/test_tensor_parallel.py::test_cuda_graphs_under_tp2_nccl tests/model_wrapper/test_all_reduce.py > $OUT/tp2/tests.log 2>&1; echo "tp2 rc=$? $(date +%T)" >> $OUT/rc.txt
source benchmarks/deepgemm_env.sh >> $OUT/setup.log 2>&1
for name in job0 job1; do d=/tmp/wt/$name; mkdir -p $d $OUT/$name
  tar -C $ROOT --exclude=./.gpu --exclude=./.fiextra --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
  ln -s $ROOT/.gpu $d/.gpu; done
(cd /tmp/wt/job0 && CUDA_VISIBLE_DEVICES=0 OUTJ=$OUT/job0 timeout 300 taskset -c 0-15 bash $ROOT/.probe/c2_job0.sh > $OUT/job0.log 2>&1; echo "job0 rc=$? $(date +%T)" >> $OUT/rc.txt) &
(cd /tmp/wt/job1 && CUDA_VISIBLE_DEVICES=1 OUTJ=$OUT/job1 OMP_NUM_THREADS=4 timeout 310 taskset -c 16-31 bash $ROOT/.probe/c2_job1.sh > $OUT/job1.log 2>&1; echo "job1 rc=$? $(date +%T)" >> $OUT/rc.txt) &
wait
cat $OUT/gpus.txt $OUT/rc.txt; grep -E "PASS|FAIL|passed|failed" $OUT/tp2/tests.log | tail -8; tail -12 $OUT/job0/fastacc.log; grep -v INFO $OUT/job1/bench_fp8.log | tail -4
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
