"""KV-cache memory: the per-layer cache tensors and the block manager over their block ids."""

from kv_manager.block_manager import BlockManager
from kv_manager.errors import KVArgumentError, KVCacheError, KVErrorCode
from kv_manager.kv_cache import KVCacheSpec, allocate_kv_cache
from kv_manager.memory import default_num_blocks, num_blocks_for_budget, profile_num_blocks

__all__ = [
    "BlockManager",
    "KVArgumentError",
    "KVCacheError",
    "KVCacheSpec",
    "KVErrorCode",
    "allocate_kv_cache",
    "default_num_blocks",
    "num_blocks_for_budget",
    "profile_num_blocks",
]
