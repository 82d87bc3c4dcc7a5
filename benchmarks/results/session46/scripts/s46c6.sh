# session 46 c6: a LoRA prefill past the kernel's LoRA bound on the token tiles (new test), with the long-prefill tests
source .gpu/device-setup.sh > $OUT/setup.log 2>&1
nvidia-smi -L > $OUT/gpus.txt
timeout 280 taskset -c 0-15 python3 -m pytest -q -m cuda tests/model_wrapper/test_cuda_model.py -k "long_lora or long_prefill or lora_decode" > $OUT/t_cuda.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/rc.txt
cat $OUT/gpus.txt $OUT/rc.txt; tail -n 30 $OUT/t_cuda.log
