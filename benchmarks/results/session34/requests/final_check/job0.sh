python3 -m pytest -q -p no:cacheprovider -m cuda --durations=5 tests/model_wrapper/test_add_norm_cuda.py tests/kernels/test_fp8_act.py tests/model_wrapper/test_fp8_checkpoint.py 2>&1 | tail -15
