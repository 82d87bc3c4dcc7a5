# final check of main: two 1-GPU jobs in parallel, then the 2-GPU tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
source benchmarks/deepgemm_env.sh >> $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt; ROOT=$(pwd)
for name in job0 job1; do d=/tmp/wt/$name; mkdir -p $d $OUT/$name
  tar -C $ROOT --exclude=./.gpu --exclude=./.fiextra --exclude=./benchmarks/results -cf - . | tar -C $d -xf -
  ln -s $ROOT/.gpu $d/.gpu; done
(cd /tmp/wt/job0 && CUDA_VISIBLE_DEVICES=0 OUTJ=$OUT/job0 timeout 460 taskset -c 0-15 bash $ROOT/.probe/job0.sh > $OUT/job0.log 2>&1; echo "job0 rc=$? $(date +%T)" >> $OUT/rc.txt) &
(cd /tmp/wt/job1 && CUDA_VISIBLE_DEVICES=1 OUTJ=$OUT/job1 OMP_NUM_THREADS=4 timeout 460 taskset -c 16-31 bash $ROOT/.probe/job1.sh > $OUT/job1.log 2>&1; echo "job1 rc=$? $(date +%T)" >> $OUT/rc.txt) &
wait
mkdir -p $OUT/tp2; timeout 150 python3 -m pytest -q -p no:cacheprovider -m cuda -rs tests/model_wrapper/test_moe_fp8_shards.py::test_cuda_tp2_nccl_block_fp8_experts tests/model_wrapper/test_tensor_parallel.py::test_cuda_graphs_under_tp2_nccl tests/model_wrapper/test_all_reduce.py > $OUT/tp2/tests.log 2>&1; echo "tp2 rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt
cd $OUT && tar -czf /tmp/all.tgz --exclude=all.tgz . && find . -mindepth 1 -maxdepth 1 ! -name rc.txt -exec rm -rf {} + && mv /tmp/all.tgz $OUT/all.tgz
timeout 330 python3 -m pytest -q -p no:cacheprovider -m cuda --durations=5 tests/model_wrapper/test_add_norm_cuda.py tests/model_wrapper/test_moe_router_norm_cuda.py tests/model_wrapper/test_moe.py tests/model_wrapper/test_fp8_kv_cuda.py tests/model_wrapper/test_cuda_model.py tests/model_wrapper/test_mixed_graph.py tests/text_generator/test_serve_warmup.py tests/text_generator/test_eagle3_cuda.py tests/model_wrapper/test_verify_graph.py 2>&1 | tail -15 > $OUTJ/models.log
timeout 60 python3 -m pytest -q -p no:cacheprovider -m cuda -rs tests/model_wrapper/test_moe_fp8_shards.py 2>&1 | tail -6 > $OUTJ/moe_fp8_shards.log
timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda tests/model_wrapper/test_fp8_checkpoint.py 2>&1 | tail -8 > $OUTJ/fp8_checkpoint.log
timeout 80 python3 -m pytest -q -p no:cacheprovider -m cuda -rA tests/kernels/test_fp8_deepgemm.py tests/kernels/test_fp8_act.py 2>&1 | grep "graphs=\|PASSED\|FAILED\|Error\|passed\|failed\|WARN\|warn" | tail -30 > $OUTJ/deepgemm.log
timeout 140 python3 -m pytest -q -p no:cacheprovider -m cuda tests/kernels/test_fp8_kernels.py tests/kernels/test_gemv.py tests/kernels/test_moe_kernel.py 2>&1 | tail -6 > $OUTJ/kernels.log
timeout 130 python3 benchmarks/ab_eagle3_engine.py --rounds 3 --arms adaptive fixed 2>&1 | grep -v " INFO " > $OUTJ/eagle3.log
