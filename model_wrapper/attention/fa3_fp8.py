"""FlashInfer's fa3 (sm90) prefill with q, K and V all in e4m3: the facts, and the helpers that run it.

Facts (FlashInfer 0.7.2.post1, read from the project's slimmed wheel in .gpu/: flashinfer/prefill.py,
flashinfer/jit/attention/modules.py, csrc/batch_prefill_fp8_sm90.cu, include/flashinfer/attention/hopper/
variants.cuh and quantization/prefill_sm90.cuh):

- Which module: the prefill wrappers pick the FP8 template when q_data_type is float8 (modules.py:
  fp8_enabled = dtype_q in (e4m3, e5m2)), backend "fa3" only (fa2 asserts "fp8 tensor core is not
  supported"); K/V must be of q's dtype (static_assert in batch_prefill_fp8_sm90.cu); the output 16-bit
  (o_data_type float8 is refused: "FP8 output is not supported in fa2/fa3 backends yet"). head_dim
  64 / 128 / 256, head_dim_qk == head_dim_vo. Tiles (head_dim 128): ragged CTA 128 q x 192 kv with TMA
  loads; paged CTA 128 x 128 with per-token (page-table) loads, any page size. One module (the name
  batch_prefill_with_kv_cache_dtype_q_e4m3_dtype_kv_e4m3_dtype_o_bf16_..._sm90) holds both the ragged and
  the paged kernels, for every mask mode (4 x 2 kernel files + binding: 10 nvcc jobs).
- Plan: BatchPrefillWith{Paged,Ragged}KVCacheWrapper(ws, "NHD", backend="fa3"), plan(..., causal=True,
  q_data_type=float8_e4m3fn, kv_data_type=float8_e4m3fn, o_data_type=bfloat16) (o defaults to q's dtype,
  which the FP8 module refuses: pass it). No custom mask (a mask forces fa2), sliding window allowed.
- Scales: the variant (StandardFP8Attention) computes softmax(q.k * q_scale * k_scale * sm_scale) and
  multiplies the output by v_scale in its epilogue; each scale is a float32 device tensor indexed by head
  (q: [num_qo_heads], k and v: [num_kv_heads]; a broadcast view would be read past its one element) or,
  where the tensor is null, a host scalar. run() takes the three tensors POSITIONALLY after the inputs:
  ragged run(q, k, v, scale_q, scale_k, scale_v), paged run(q, (k_cache, v_cache), scale_q, scale_k,
  scale_v). Ragged: without them the call falls into the 16-bit branch with the wrong arguments (its
  q_scale / k_scale / v_scale keywords are ignored for e4m3 q). Paged: the keywords q_scale / k_scale are
  folded into sm_scale on the host and v_scale multiplies the output afterwards (one more kernel per
  layer), so the tensors are the cheaper way for v.
- Inside the kernel P (the softmax numerator, in [0, 1]) is multiplied by 448 and rounded to e4m3
  before the P.V product (PQuantize; p_scale = 448 for e4m3, undone with v_scale in the finalize): the
  accuracy cost beside q's own e4m3 rounding (an e4m3 value carries 3 mantissa bits: relative rounding
  error up to 2^-4; values below 2^-6 lose precision further as subnormals).
- Build: not in the kernel pack (.gpu/kernels-sm90.tar.xz); the slimmed wheel has every source it needs
  (the csrc/*fp8*sm90* files, include/, cutlass/, cccl/). FlashInfer's JIT built it (checked, 2026-11-26)
  with nvcc 13.0 and FLASHINFER_CUDA_ARCH_LIST=9.0a on a machine with no GPU, given curand_kernel.h (CUTLASS's
  util headers include it; that toolkit lacked it: taken from torch's pip nvidia packages, as
  benchmarks/deepgemm_env.sh does, FLASHINFER_EXTRA_CUDAFLAGS=-I...) and a libcuda.so to link against
  (an empty stub with soname libcuda.so.1: FLASHINFER_EXTRA_LDFLAGS=-L...; the .so then needs libcudart.so.13
  only). 10 nvcc jobs (4 mask modes x ragged / paged, the host code, the binding), each kernel 3-5 minutes of
  one core: ~19 minutes on 2 busy cores; the .so is 1.9 MB (0.45 MB xz). Placed at
  flashinfer/data/aot/<name>/<name>.so it is loaded instead of built (jit/env.get_aot_artifacts), which
  benchmarks/fa3_fp8_env.sh does where the archive .fiextra/fa3_fp8_prebuilt.tar.xz is present.

Measured (H200, benchmarks/bench_fp8_attention.py; benchmarks/results/session38/fa3fp8_attention_h200.*): one
4k causal prompt, Llama-3-8B heads, a layer: fa3 bf16 ragged 0.240 ms, fa2 bf16 q over the e4m3 paged cache
0.659, fa3 e4m3 paged 0.232 (+0.037 for quantize_q), fa3 e4m3 ragged 0.205; 8k 0.831 / 2.280 / 0.768 / 0.669;
output error against float64 attention over the same e4m3 inputs 1.6e-2 max / 2.1e-2 rms relative (fa2 3.6e-3:
the P rounding), against bf16 attention on the unrounded inputs 6.0e-2 (fa2 5.8e-2: dominated by the cache's own
K/V rounding).

q's scale: vLLM's FA3 FP8 path quantizes q per tensor with scale 1.0 unless the checkpoint gives a
q_scale; so does this module (Q_SCALE). The post-RoPE q of the models served here is far inside e4m3's
range (|q| < 448) and above its subnormals for all but tiny elements, whose products with k matter least.
"""

from __future__ import annotations

import functools

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
Q_SCALE = 1.0  # q's per-tensor scale (vLLM's default without a checkpoint q_scale)


def quantize_q(q: torch.Tensor, scale: float = Q_SCALE, one_pass: bool | None = None) -> torch.Tensor:
    """q [T, H, D] (16-bit, rows may be strided) -> e4m3 [T, H, D] contiguous: round(q / scale) to the
    nearest e4m3 (ties to even), clamped to +-448 as kv_store.quantize_fp8 clamps: torch's CUDA cast does not
    saturate (torch 2.11, H200: bf16 500 and -1000 became NaN; 460 became 448), its CPU cast does.

    one_pass (default: on CUDA): kernels/fp8_act.quantize_fp8_static, one Triton pass that reads q's strided
    rows and writes e4m3 (IEEE division by the scale, clamp, round-to-nearest-even conversion: the same bytes
    as the torch path). Else torch: clamp, then cast (two kernels; through float32 unless scale is 1.0, as a
    16-bit float is exact in float32): at 4k tokens x 32 heads x 128, 0.037 ms a layer against the bare
    cast's 0.019 (H200, session 38), the cost the one pass removes."""
    if one_pass is None:
        one_pass = q.is_cuda
    if one_pass:
        from model_wrapper.kernels.fp8_act import quantize_fp8_static

        T, H, D = q.shape
        return quantize_fp8_static(q.reshape(T, H * D), _scale_tensor(scale, q.device)).view(T, H, D)
    x = q if scale == 1.0 else q.float() / scale
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


@functools.lru_cache(maxsize=None)
def _scale_tensor(scale: float, device: torch.device) -> torch.Tensor:
    """q's scale as the float32 one-element device tensor the quantize kernel reads (made once a device)."""
    return torch.full((1,), scale, dtype=torch.float32, device=device)


def head_scales(scales: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """The K/V store's per-layer scales [2, num_layers] float32 (device) -> [2, num_layers, num_kv_heads]
    contiguous: the per-head tensors the kernel indexes by KV head (one small copy per plan)."""
    return scales.unsqueeze(-1).expand(-1, -1, num_kv_heads).contiguous()


def supported(head_dim: int, device: torch.device) -> bool:
    """Whether the fa3 FP8 template takes this head_dim on this device (sm90: Hopper only)."""
    if device.type != "cuda" or head_dim not in (64, 128, 256):
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


@functools.lru_cache(maxsize=None)
def prebuilt(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether FlashInfer already has the all-e4m3 module of this head_dim and output dtype on disk (its AOT
    directory, where benchmarks/fa3_fp8_env.sh unpacks the prebuilt one, or its JIT cache), so that a first
    plan loads it instead of building it for minutes (KernelConfig.fp8_kv_prefill "auto"). Reads FlashInfer
    0.7.2's module naming; False where that cannot be read. Cached per process."""
    try:
        from flashinfer.jit import env as jit_env
        from flashinfer.jit.attention.modules import get_batch_prefill_uri

        uri = get_batch_prefill_uri("fa3", E4M3, E4M3, dtype, torch.int32, head_dim, head_dim, 0, False, False, False)
        return bool(jit_env.get_aot_artifacts(uri)) or (jit_env.FLASHINFER_JIT_DIR / uri / f"{uri}.so").exists()
    except Exception:  # noqa: BLE001 (another FlashInfer, or none: not known to be built)
        return False


def plan_kwargs(dtype: torch.dtype, sm_scale: float | None) -> dict:
    """plan()'s dtype arguments of the all-e4m3 module (output in the model's 16-bit dtype)."""
    return dict(q_data_type=E4M3, kv_data_type=E4M3, o_data_type=dtype, sm_scale=sm_scale)
