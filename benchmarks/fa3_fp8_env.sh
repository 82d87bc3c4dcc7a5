# Source after .gpu/device-setup.sh on a GPU machine, before python starts:
#     source .gpu/device-setup.sh && source benchmarks/fa3_fp8_env.sh
# Makes FlashInfer's fa3 all-e4m3 prefill module (model_wrapper/attention/fa3_fp8.py) load without a build:
# - .fiextra/fa3_fp8_prebuilt.tar.xz, where present (built on a CPU machine with nvcc 13.0 and
#   FLASHINFER_CUDA_ARCH_LIST=9.0a from the slimmed wheel's own sources): <module>/<module>.so, unpacked into
#   /tmp/site/flashinfer/data/aot/, which FlashInfer loads instead of building (jit/env.get_aot_artifacts);
# - else the module is built on first use (10 nvcc jobs, minutes): CUTLASS's util headers include
#   curand_kernel.h, which the toolkit may lack; deepgemm_env.sh sets CUDA_HOME and takes that header from
#   torch's pip nvidia packages (FLASHINFER_EXTRA_CUDAFLAGS), so it is sourced here too.
# Prints one line per fact; never fails the shell.

_fa3_name=batch_prefill_with_kv_cache_dtype_q_e4m3_dtype_kv_e4m3_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False_sm90
if [ -f .fiextra/fa3_fp8_prebuilt.tar.xz ] && [ -d /tmp/site/flashinfer/data ]; then
  mkdir -p /tmp/site/flashinfer/data/aot \
    && tar -xJf .fiextra/fa3_fp8_prebuilt.tar.xz -C /tmp/site/flashinfer/data/aot \
    && echo "fa3_fp8_env: prebuilt modules unpacked: $(tar -tJf .fiextra/fa3_fp8_prebuilt.tar.xz | grep -c '\.so$')"
fi
if [ -f "/tmp/site/flashinfer/data/aot/$_fa3_name/$_fa3_name.so" ]; then
  echo "fa3_fp8_env: head_dim 128 bf16-out module present (no build)"
else
  echo "fa3_fp8_env: no prebuilt module: the first fa3 FP8 call builds it (minutes)"
fi
export MAX_JOBS="${MAX_JOBS:-16}"
source "$(dirname "${BASH_SOURCE[0]}")/deepgemm_env.sh"
unset _fa3_name
