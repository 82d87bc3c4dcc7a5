source .gpu/device-setup.sh > $OUT/setup.log 2>&1
source benchmarks/deepgemm_env.sh >> $OUT/setup.log 2>&1
ROOT=$(pwd); T=tests/model_wrapper/test_all_reduce.py::test_tp2_fp8_and_moe_graphs_on_two_gpus
for v in A B; do d=/tmp/wt/$v; mkdir -p $d; tar -C $ROOT --exclude=./.gpu --exclude=./.fiextra --exclude=./benchmarks/results -cf - . | tar -C $d -xf -; ln -s $ROOT/.gpu $d/.gpu; done
sed -i 's/fp8_block_gemm_backend: str = "auto"/fp8_block_gemm_backend: str = "cublaslt"/' /tmp/wt/A/model_wrapper/kernels/config.py
(cd /tmp/wt/B && git apply --binary $ROOT/.wt/B.patch && echo B patched >> $OUT/rc.txt)
grep -n 'fp8_block_gemm_backend: str' /tmp/wt/A/model_wrapper/kernels/config.py >> $OUT/rc.txt
for v in A B; do (cd /tmp/wt/$v && timeout 90 python3 -m pytest -q -p no:cacheprovider -m cuda $T 2>&1 | grep "^E   \|passed\|failed" | head -5 > $OUT/$v.log; echo "$v rc=$? $(date +%T)" >> $OUT/rc.txt; cat $OUT/$v.log >> $OUT/rc.txt); done
cat $OUT/rc.txt $OUT/A.log $OUT/B.log 2>/dev/null
