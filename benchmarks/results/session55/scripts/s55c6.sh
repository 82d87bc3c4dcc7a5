# session 55 c6: CUDA tests of the decode graphs with decode_attention_fat (on by default): the new on / off test, the
# graph / mixed-graph / verify-graph / FP8 KV model tests and the decode attention kernel tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 280 python3 -m pytest -q -m cuda tests/model_wrapper/test_cuda_model.py -k "program_a_sm or graph_replay_equals_eager or rope_and_the_store or padding_slots or no_host_device_sync" > $OUT/tm.log 2>&1
echo "tm rc=$? $(date +%T)" >> $OUT/rc.txt
timeout 280 python3 -m pytest -q -m cuda tests/model_wrapper/test_cuda_graph.py tests/model_wrapper/test_verify_graph.py tests/model_wrapper/test_fp8_kv_cuda.py tests/kernels/test_decode_attention.py > $OUT/tg.log 2>&1
echo "tg rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -3 $OUT/tm.log; tail -3 $OUT/tg.log; grep -E "^FAILED|^ERROR" $OUT/tm.log $OUT/tg.log | head -20
