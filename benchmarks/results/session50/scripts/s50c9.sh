# session 50 c9: main's CUDA tests around the change (xdist carried in .probe): every FP8 model-level test, the
# mixed graphs, the decode attention kernels (Triton and CUDA)
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
pip install -q --no-deps .probe/*.whl > /dev/null 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 540 python3 -m pytest -m cuda -q -n 8 tests/model_wrapper -k "fp8 or mixed_graph" tests/kernels/test_e4m3_decode_cuda.py \
  tests/kernels/test_decode_attention.py > $OUT/tests.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 3 $OUT/tests.log; grep -E "^FAILED|^ERROR" $OUT/tests.log | head -20 | cut -c1-300
