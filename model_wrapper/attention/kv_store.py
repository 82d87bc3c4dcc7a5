"""KVStore: the one writer of K/V into the caller's paged caches.

Every layer's K/V enters the cache here, by one of two methods:

    write(layer_kv, k, v, batch)   k, v [T, kv_heads, head_dim] at batch.slots (slot -1: nothing)
    rope_write(layer_kv, qkv, ...) RoPE on q and k of the fused projection qkv, in place, and k, v
                                   at the slots: one kernel (the fast path, where fuses_rope says so)

The caches are [num_blocks, block_size, kv_heads, head_dim] per K and V (DESIGN.md's layout); a
flat slot s = block * block_size + offset is row s of the [num_blocks * block_size, kv_heads,
head_dim] view. write has two implementations: the torch reference (index_copy_ of the written
rows, whose -1 slots ForwardBatch filtered out on the host) and, on the CUDA path with Triton,
one store kernel that skips -1 slots itself (kernels/kv_store.store_kv), which a CUDA graph's
padded batch needs (graph_safe). The attention backend carries the store (AttentionBackend.kv_store)
to the layers; ModelWrapper builds it.

FP8 caches: a cache of dtype float8_e4m3fn stores each element as round(x / scale) in e4m3,
x in float32, clamped to +-448 (the largest finite e4m3); attention reads e4m3.float() * scale
(dequantize). The scales are per layer, K and V apart: `scales` [2, num_layers] float32 on the
device (row 0 K, row 1 V; ones until set_scales), with a host copy for backends that take the
scale as a host float. A 16-bit or fp32 cache of the model's dtype ignores them.
"""

from __future__ import annotations

import torch

from model_wrapper.forward_batch import ForwardBatch
from model_wrapper.kernels.config import KernelConfig

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite float8_e4m3fn: larger values saturate instead of becoming NaN


def quantize_fp8(x: torch.Tensor, scale) -> torch.Tensor:
    """x (any float dtype) -> float8_e4m3fn: x / scale computed in float32, clamped to +-FP8_MAX,
    rounded to the nearest e4m3 (ties to even)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize(cache_rows: torch.Tensor, scale) -> torch.Tensor:
    """Cache rows -> float32 values: e4m3 * scale for an FP8 cache, the rows as they are otherwise."""
    if cache_rows.dtype == FP8_DTYPE:
        return cache_rows.float() * scale
    return cache_rows.float()


class KVStore:
    """Owns how K/V is written: the implementation (torch or Triton), the RoPE table of the fused
    path (float32 [max_positions, head_dim]: cos half, then sin half; None: no fused path) and the
    kernel configuration, and the per-layer K/V scales of FP8 caches (scales [2, num_layers] float32
    on the device, scales_host its copy on the host; updated in place only, so kernels and CUDA
    graphs holding their address see every change). It holds no cache tensors: each call names its
    layer's (k_cache, v_cache) and its layer index."""

    def __init__(self, *, triton: bool = False, rope_table: torch.Tensor | None = None,
                 config: KernelConfig | None = None, num_layers: int = 1, device=None):
        self._kernels = None
        if triton:
            try:
                from model_wrapper.kernels import kv_store as kernels
            except ImportError:  # no Triton: the torch reference
                kernels = None
            self._kernels = kernels
        self.rope_table = rope_table if self._kernels is not None else None
        self.config = config if config is not None else KernelConfig()
        self.scales = torch.ones(2, num_layers, dtype=torch.float32, device=device)
        self.scales_host = torch.ones(2, num_layers, dtype=torch.float32)

    def set_scales(self, k_scales, v_scales) -> None:
        """Per-layer K and V scales (sequences or tensors of num_layers positive finite floats),
        copied in place into scales and scales_host. The caller (ModelWrapper.set_kv_scales)
        validates them; K/V already written with other scales are not rescaled."""
        host = torch.stack((torch.as_tensor(k_scales, dtype=torch.float32).cpu().flatten(),
                            torch.as_tensor(v_scales, dtype=torch.float32).cpu().flatten()))
        self.scales_host.copy_(host)
        self.scales.copy_(host)

    def layer_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (k_scale, v_scale) of a layer: one-element float32 views of scales on the device."""
        return self.scales[0, layer:layer + 1], self.scales[1, layer:layer + 1]

    @property
    def name(self) -> str:
        return "torch" if self._kernels is None else "triton"

    @property
    def graph_safe(self) -> bool:
        """Whether write takes a batch whose slots hold -1 (padding) on the device, with no host
        filtering: what a CUDA graph's static batch needs."""
        return self._kernels is not None

    def fuses_rope(self, num_tokens: int, kv_dtype: torch.dtype, dtype: torch.dtype, qk_norm: bool = False,
                   lora: bool = False) -> bool:
        """Whether rope_write takes a step of num_tokens tokens: the Triton kernel with a RoPE table
        of a power-of-two head_dim, up to config.rope_store_max_tokens tokens (config.rope_store_lora_max_tokens
        where the step names adapters: their deltas go to the kernel's one-token programs, which lose to
        FlashInfer's RoPE and the store kernel on long prompts), and a cache of the projection's dtype. qk_norm:
        the layer has q / k norms (taken in the kernel unless config.rope_store_qk_norm is off)."""
        if self.rope_table is None or (qk_norm and not self.config.rope_store_qk_norm):
            return False
        head_dim = self.rope_table.shape[1]
        most = self.config.rope_store_lora_max_tokens if lora else self.config.rope_store_max_tokens
        return head_dim & (head_dim - 1) == 0 and num_tokens <= most and kv_dtype in (dtype, FP8_DTYPE)

    def write(self, layer_kv, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch, layer: int = 0) -> None:
        """Write k, v [T, kv_heads, head_dim] (rows may be strided) into layer_kv = (k_cache, v_cache)
        at batch.slots; tokens with slot -1 write nothing. layer: whose scales an FP8 cache takes."""
        k_cache, v_cache = layer_kv
        ks, vs = self.layer_scales(layer)
        if self._kernels is not None:  # one kernel for K and V; -1 slots skipped inside it
            self._kernels.store_kv(k, v, k_cache, v_cache, batch.slots, ks, vs)
            return
        idx = batch.write_token_index
        slots = batch.write_slots
        if idx is not None:
            k, v = k.index_select(0, idx), v.index_select(0, idx)
        if k_cache.dtype == FP8_DTYPE:  # index_copy_ has no float8 kernels: copy the bytes
            k, v = quantize_fp8(k, ks).view(torch.uint8), quantize_fp8(v, vs).view(torch.uint8)
            k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))

    def rope_write(self, layer_kv, qkv: torch.Tensor, positions: torch.Tensor, num_heads: int, num_kv_heads: int,
                   head_dim: int, slots: torch.Tensor, lora=None, scale=None, layer: int = 0, qk_norm=None) -> None:
        """In place on qkv [T, (Hq + 2 Hk) * D] (rows contiguous): (its rows normalised by scale, a
        RowScale; the qkv LoRA delta lora, a LoraDelta, added,) RoPE on q and k at positions [T], and
        k, v written at slots [T] of layer_kv (-1: nothing): one kernel (kernels/kv_store.rope_store_kv).
        Only where fuses_rope holds. layer: whose scales an FP8 cache takes. qk_norm: (q_norm weight,
        k_norm weight, eps) [D] each: q and k heads RMS-normalised before RoPE."""
        k_cache, v_cache = layer_kv
        ks, vs = self.layer_scales(layer)
        self._kernels.rope_store_kv(qkv, positions, self.rope_table, num_heads, num_kv_heads, head_dim,
                                    k_cache, v_cache, slots, lora, scale, self.config, ks, vs, qk_norm)
