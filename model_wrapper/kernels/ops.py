"""Every Triton entry point of the decoder's kernels in one namespace: what FlashInferKernels calls
as `self._triton.<op>` (importing this module fails without Triton: the torch fallbacks run)."""

from model_wrapper.kernels.activation import silu_and_mul
from model_wrapper.kernels.gemm import skinny_fits, skinny_gemm, wide_gate_up_silu, wide_silu_fits
from model_wrapper.kernels.gemv import gemv, gemv_fits
from model_wrapper.kernels.kv_store import rope_store_kv, store_kv
from model_wrapper.kernels.lora_epilogues import RowScale, add_lora_rms_norm, silu_and_mul_lora
from model_wrapper.kernels.norm import add_rms_norm, add_rms_norm_fits

__all__ = ["RowScale", "add_lora_rms_norm", "add_rms_norm", "add_rms_norm_fits", "gemv", "gemv_fits", "rope_store_kv",
           "silu_and_mul", "silu_and_mul_lora", "skinny_fits", "skinny_gemm", "store_kv", "wide_gate_up_silu",
           "wide_silu_fits"]
