"""The CUDA path's Triton kernels, a file per family (gemv, gemm, norm, activation, kv_store,
lora_epilogues, decode_attention, moe, fp8 and its GEMV fp8_gemv with their torch arithmetic in
fp8_reference; common: PDL and shared arithmetic), and KernelConfig, their launch constants. Only KernelConfig is
imported here: the kernel modules need Triton, which a CPU-only install lacks; import them (or
kernels.ops, all of their entry points) where used."""

from model_wrapper.kernels.config import KernelConfig

__all__ = ["KernelConfig"]
