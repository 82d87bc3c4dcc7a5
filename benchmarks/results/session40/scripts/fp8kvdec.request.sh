# fp8kvdec: 1 GPU (H200), ~4 min (branch h/s39-fp8kvdec). e4m3 decode attention: num_stages 3 (the default: one K/V
# shared-memory buffer) against 5 / 7 (two / three buffers); results under $OUT/fp8kvdec/
source .gpu/device-setup.sh > /dev/null 2>&1; D=$OUT/fp8kvdec; mkdir -p $D; nvidia-smi -L > $D/gpu.txt
V='[{"fp8_math":"bits_vreg","block_n":64,"num_warps":4,"num_stages":3,"maxnreg":128},
 {"fp8_math":"bits_vreg","block_n":64,"num_warps":4,"num_stages":5,"maxnreg":128},
 {"fp8_math":"bits_vreg","block_n":64,"num_warps":4,"num_stages":7,"maxnreg":128},
 {"fp8_math":"fp16_vreg","block_n":64,"num_warps":4,"num_stages":5,"maxnreg":128},
 {"fp8_math":"bits_vreg","block_n":64,"num_warps":4,"num_stages":5,"maxnreg":128,"split_factor":2},
 {"fp8_math":"bits_vreg","block_n":128,"num_warps":4,"num_stages":5,"maxnreg":128},
 {"fp8_math":"bits_vreg","block_n":128,"num_warps":8,"num_stages":5,"maxnreg":128}]'
timeout 95 python3 benchmarks/bench_fp8_kv.py --sweep --variants "$V" --cases 32x2048,64x512,64x2048,64x8192,128x2048,128x8192 --out $D > $D/sweep.log 2>&1; echo "sweep rc=$?" >> $D/rc.txt
# the CUDA decode / FP8-KV tests with the e4m3 launch at 5 stages (the candidate default)
timeout 50 python3 -c "import sys; sys.path.insert(0, '.'); import model_wrapper.kernels.decode_attention as d; d.LAUNCH['e4m3']['num_stages'] = 5; import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-m', 'cuda', 'tests/kernels/test_decode_attention.py', 'tests/model_wrapper/test_fp8_kv_cuda.py']))" > $D/cuda_tests_st5.log 2>&1; echo "tests st5 rc=$?" >> $D/rc.txt
for st in 3 5; do  # decode steps, FP8 weights + FP8 KV, the e4m3 launch at 3 / 5 stages
timeout 75 python3 -c "import sys, runpy; sys.path.insert(0, '.'); import model_wrapper.kernels.decode_attention as d; d.LAUNCH['e4m3']['num_stages'] = $st; sys.argv = ['bench_fp8.py', '--decode-only', '--configs', 'fp8+fp8kv', '--batches', '32,128', '--out', '$D/step_st$st']; runpy.run_path('benchmarks/bench_fp8.py', run_name='__main__')" > $D/step_st$st.log 2>&1; echo "step st$st rc=$?" >> $D/rc.txt
done
cat $D/rc.txt; tail -12 $D/sweep.log | cut -c1-200; tail -3 $D/cuda_tests_st5.log; grep -h "ms" $D/step_st*.log | tail -8 | cut -c1-200
