python3 -m pytest -q -p no:cacheprovider -m cuda --durations=5 tests/model_wrapper/test_cuda_model.py -k "gemv or graph_replay or flashinfer_matches or sync or running_ahead" 2>&1 | tail -15
