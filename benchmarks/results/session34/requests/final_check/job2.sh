python3 -m pytest -q -p no:cacheprovider -m cuda --durations=5 tests/text_generator/test_eagle3_cuda.py tests/text_generator/test_sampling.py "tests/model_wrapper/test_mixed_graph.py" -k "not mistral" 2>&1 | tail -15
python3 -m pytest -q -p no:cacheprovider -m cuda tests/text_generator/test_serve_warmup.py 2>&1 | tail -5
