# Source after .gpu/device-setup.sh on a GPU machine, before python starts:
#     source .gpu/device-setup.sh && source benchmarks/deepgemm_env.sh
# Makes FlashInfer's DeepGEMM port (model_wrapper/kernels/fp8_deepgemm.py) buildable there:
# - unpacks .fiextra/fi_nv_internal.tar.xz (csrc/nv_internal, csrc/fused_moe: the sources the
#   slimmed wheel lacks) into /tmp/site/flashinfer/data once;
# - CUDA_HOME: the toolkit whose include/ holds cuda_runtime_api.h (the runner's .cpp files are
#   compiled by the host compiler, which sees only $CUDA_HOME/include; a PATH wrapper such as
#   /usr/local/bin/nvcc otherwise makes it /usr/local). Its bin/nvcc also compiles each DeepGEMM kernel;
# - cublasLt.h / nvrtc.h / curand_kernel.h and libnvrtc.so / libcuda.so where the toolkit lacks them: taken from the
#   pip nvidia-* packages torch brought (only the files the toolkit lacks, linked into /tmp/dg_inc and
#   /tmp/dg_lib, so no toolkit header is shadowed), passed by FLASHINFER_EXTRA_{CFLAGS,CUDAFLAGS,LDFLAGS};
# - TRTLLM_DG_CACHE_DIR=/tmp/dg_cache: the compiled kernels (cubins, one per tile config);
# - .fiextra/dgemm_prebuilt.tar.xz, where present: the runner prebuilt and kernels precompiled (below).
# Prints one line per fact; never fails the shell (a missing piece shows as the backend's warning).

if [ -f .fiextra/fi_nv_internal.tar.xz ] && [ -d /tmp/site/flashinfer/data ] \
    && [ ! -d /tmp/site/flashinfer/data/csrc/nv_internal ]; then
  tar -xJf .fiextra/fi_nv_internal.tar.xz -C /tmp/site/flashinfer/data/ && echo "deepgemm_env: unpacked .fiextra"
fi
# a prebuilt runner + kernel cubins where the lead carried one (.fiextra/dgemm_prebuilt.tar.xz: aot/<module>/<module>.so,
# which FlashInfer loads instead of building, and dg_cache/cache/<kernel>/nvcc_kernel.cubin)
if [ -f .fiextra/dgemm_prebuilt.tar.xz ] && [ -d /tmp/site/flashinfer/data ] && [ ! -d /tmp/dgpre ]; then
  mkdir -p /tmp/dgpre /tmp/site/flashinfer/data/aot/fp8_blockscale_gemm_90 /tmp/dg_cache/cache \
    && tar -xJf .fiextra/dgemm_prebuilt.tar.xz -C /tmp/dgpre \
    && cp /tmp/dgpre/aot/fp8_blockscale_gemm_90/fp8_blockscale_gemm_90.so /tmp/site/flashinfer/data/aot/fp8_blockscale_gemm_90/ \
    && cp -r /tmp/dgpre/dg_cache/cache/. /tmp/dg_cache/cache/ && echo "deepgemm_env: prebuilt runner and kernels unpacked"
fi
if [ -z "${CUDA_HOME:-}" ] || [ ! -f "$CUDA_HOME/include/cuda_runtime_api.h" ]; then
  for _d in /usr/local/cuda /usr/local/cuda-* /usr/cuda; do
    if [ -f "$_d/include/cuda_runtime_api.h" ] && [ -x "$_d/bin/nvcc" ]; then export CUDA_HOME="$_d"; break; fi
  done
fi
echo "deepgemm_env: CUDA_HOME=${CUDA_HOME:-unset}"
mkdir -p /tmp/dg_inc /tmp/dg_lib /tmp/dg_cache
_sp="$(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [p for p in sys.path if p.endswith("site-packages")]))' 2>/dev/null)"
for _h in cublasLt.h nvrtc.h curand_kernel.h; do
  [ -f "${CUDA_HOME:-/nonexistent}/include/$_h" ] && continue
  _f="$(find $_sp -path '*nvidia*' -name "$_h" 2>/dev/null | head -1)"
  if [ -n "$_f" ]; then
    for _g in "$(dirname "$_f")"/*; do  # that package's headers the toolkit lacks
      [ -e "${CUDA_HOME:-/nonexistent}/include/$(basename "$_g")" ] || ln -sfn "$_g" /tmp/dg_inc/
    done
    echo "deepgemm_env: $_h from $(dirname "$_f")"
  else
    echo "deepgemm_env: no $_h found"
  fi
done
for _l in nvrtc cuda; do
  if [ -e "${CUDA_HOME:-/nonexistent}/lib64/lib$_l.so" ] || ldconfig -p 2>/dev/null | grep -q "lib$_l.so "; then continue; fi
  _f="$( (find $_sp -path '*nvidia*' -name "lib$_l.so*" 2>/dev/null; ldconfig -p 2>/dev/null | awk -v l="lib$_l.so" '$1 ~ "^"l {print $NF}') \
        | grep -v builtins | head -1)"
  if [ -n "$_f" ]; then
    ln -sfn "$_f" "/tmp/dg_lib/lib$_l.so"
    export LD_LIBRARY_PATH="$(dirname "$_f")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "deepgemm_env: lib$_l.so -> $_f"
  else
    echo "deepgemm_env: no lib$_l.so found"
  fi
done
export FLASHINFER_EXTRA_CFLAGS="${FLASHINFER_EXTRA_CFLAGS:+$FLASHINFER_EXTRA_CFLAGS }-I/tmp/dg_inc"
export FLASHINFER_EXTRA_CUDAFLAGS="${FLASHINFER_EXTRA_CUDAFLAGS:+$FLASHINFER_EXTRA_CUDAFLAGS }-I/tmp/dg_inc"
export FLASHINFER_EXTRA_LDFLAGS="${FLASHINFER_EXTRA_LDFLAGS:+$FLASHINFER_EXTRA_LDFLAGS }-L/tmp/dg_lib"
export TRTLLM_DG_CACHE_DIR=/tmp/dg_cache
unset _d _sp _h _f _g _l
