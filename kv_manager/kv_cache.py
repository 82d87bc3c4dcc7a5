"""Per-layer KV-cache tensors in the layout forward_tensor takes.

A scheduler (or the reference engine) calls `allocate_kv_cache` once, with the model's
`KVCacheSpec` (from `TextGenerator.kv_cache_spec`) and a block count, and then owns the list it
returns; the block manager hands out block ids into it, never the tensors themselves.

    kv_cache[layer] = (k_cache, v_cache)
    k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]   (NHD, = MindIE's ND)
    slot s -> block s // block_size, offset s % block_size
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kv_manager.errors import KVArgumentError, KVCacheError, KVErrorCode


@dataclass(frozen=True)
class KVCacheSpec:
    """What one token's K/V costs: the shape a model needs of its cache.

    num_layers:   decoder layers, one (k, v) pair each
    num_kv_heads: KV heads per layer (after GQA; per rank under tensor parallelism)
    head_dim:     size of one head
    dtype:        element type of the cache (the model's dtype)
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def bytes_per_block(self, block_size: int) -> int:
        return self.bytes_per_token * block_size


def allocate_kv_cache(
    spec: KVCacheSpec,
    num_blocks: int,
    block_size: int,
    device: torch.device | str | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Allocate zeroed K/V tensors `[num_blocks, block_size, num_kv_heads, head_dim]` per layer.

    Refused before anything is allocated: non-int or non-positive sizes (KV_INVALID_ARGUMENT,
    a ValueError), and a cache larger than the device's free memory (KV_INSUFFICIENT_MEMORY)."""
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (num_blocks, block_size)):
        raise KVArgumentError(
            KVErrorCode.INVALID_ARGUMENT,
            f"allocate_kv_cache: expected num_blocks >= 1 and block_size >= 1 (ints), "
            f"got num_blocks={num_blocks!r}, block_size={block_size!r}",
        )
    need = spec.bytes_per_block(block_size) * num_blocks
    free = free_memory_bytes(torch.device(device) if device is not None else torch.device("cpu"))
    if free is not None and need > free:
        raise KVCacheError(
            KVErrorCode.INSUFFICIENT_MEMORY,
            f"allocate_kv_cache: expected a cache that fits the {free / 2**30:.2f} GiB free on "
            f"{device or 'cpu'}, got {need / 2**30:.2f} GiB for num_blocks={num_blocks} of {block_size} tokens",
        )
    shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
    return [
        (
            torch.zeros(shape, dtype=spec.dtype, device=device),
            torch.zeros(shape, dtype=spec.dtype, device=device),
        )
        for _ in range(spec.num_layers)
    ]


def free_memory_bytes(device: torch.device) -> int | None:
    """Free memory of a device (CUDA: the driver's count; CPU: MemAvailable), None if unknown:
    for refusing an allocation that cannot fit before making it, not for sizing a pool."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None
