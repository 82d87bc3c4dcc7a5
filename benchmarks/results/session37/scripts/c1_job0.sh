timeout 175 python3 -m pytest -q -p no:cacheprovider -m cuda tests/kernels/test_fp8_kernels.py tests/kernels/test_gemv.py tests/kernels/test_moe_kernel.py 2>&1 | tail -8 > $OUTJ/kernels.log
timeout 50 python3 -m pytest -q -p no:cacheprovider -m cuda -rs tests/model_wrapper/test_moe_fp8_shards.py 2>&1 | tail -6 > $OUTJ/moe_fp8_shards.log
timeout 95 python3 .probe/fastacc.py > $OUTJ/fastacc.log 2>&1
