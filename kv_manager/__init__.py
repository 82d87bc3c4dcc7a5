"""KV-cache memory: the per-layer cache tensors and the block manager over their block ids."""

from kv_manager.kv_cache import KVCacheSpec, allocate_kv_cache

__all__ = ["KVCacheSpec", "allocate_kv_cache"]
