"""How many KV blocks fit: from an explicit byte budget, or by profiling free CUDA memory.

The caller passes the model's `KVCacheSpec` and a block size and gets a block count for
`allocate_kv_cache` and `BlockManager`. Profiling runs after the model (and any workspace it
preallocates) is loaded, so what remains free is what the cache may take, the way pymllm's
init_memory_pool and vLLM's gpu_memory_utilization size their pools.
"""

from __future__ import annotations

import torch
from loguru import logger

from kv_manager.errors import KVArgumentError, KVCacheError, KVErrorCode
from kv_manager.kv_cache import KVCacheSpec


def num_blocks_for_budget(
    spec: KVCacheSpec, block_size: int, budget_bytes: int, *, max_seq_len: int | None = None
) -> int:
    """Blocks of `block_size` tokens whose K and V (all layers) fit in budget_bytes.

    Raises KVCacheError(INSUFFICIENT_MEMORY) if not even one sequence fits: one of max_seq_len
    tokens (ceil(max_seq_len / block_size) blocks), or one block when max_seq_len is None.
    """
    if block_size < 1 or budget_bytes < 0:
        raise KVArgumentError(
            KVErrorCode.INVALID_ARGUMENT,
            f"num_blocks_for_budget: expected block_size >= 1 and budget_bytes >= 0, "
            f"got block_size={block_size}, budget_bytes={budget_bytes}",
        )
    if max_seq_len is not None and max_seq_len < 1:
        raise KVArgumentError(
            KVErrorCode.INVALID_ARGUMENT,
            f"num_blocks_for_budget: expected max_seq_len >= 1 or None, got {max_seq_len}",
        )
    block_bytes = spec.bytes_per_block(block_size)
    num_blocks = budget_bytes // block_bytes
    need = 1 if max_seq_len is None else -(-max_seq_len // block_size)
    if num_blocks < need:
        what = "one block" if max_seq_len is None else f"one sequence of {max_seq_len} tokens"
        raise KVCacheError(
            KVErrorCode.INSUFFICIENT_MEMORY,
            f"num_blocks_for_budget: {what} needs {need} blocks of {block_bytes} bytes "
            f"({need * block_bytes} bytes), got a budget of {budget_bytes} bytes "
            f"({num_blocks} blocks)",
        )
    return num_blocks


def profile_num_blocks(
    spec: KVCacheSpec,
    block_size: int,
    *,
    device: torch.device | str,
    memory_fraction: float = 0.9,
    max_seq_len: int | None = None,
) -> int:
    """Blocks that fit in memory_fraction of the device's currently free memory (CUDA only).

    Call it after the model is loaded. On any other device there is nothing sound to measure
    (the CPU's "free" memory is shared with everything else), so it raises KVArgumentError
    asking for an explicit block count or `num_blocks_for_budget`. Raises
    KVCacheError(INSUFFICIENT_MEMORY) as num_blocks_for_budget does.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise KVArgumentError(
            KVErrorCode.INVALID_ARGUMENT,
            f"profile_num_blocks: expected a CUDA device to profile, got device={str(device)!r}; "
            f"pass an explicit num_blocks, or num_blocks_for_budget(spec, block_size, "
            f"budget_bytes)",
        )
    if not 0.0 < memory_fraction <= 1.0:
        raise KVArgumentError(
            KVErrorCode.INVALID_ARGUMENT,
            f"profile_num_blocks: expected 0 < memory_fraction <= 1, got {memory_fraction}",
        )
    # Blocks the caching allocator holds but no tensor uses would count as taken otherwise.
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free_bytes, total_bytes = torch.cuda.mem_get_info(device)
    budget = int(free_bytes * memory_fraction)
    num_blocks = num_blocks_for_budget(spec, block_size, budget, max_seq_len=max_seq_len)
    logger.info(
        "KV cache on {}: {:.2f} of {:.2f} GiB free, taking {:.0%} -> {} blocks of {} tokens",
        device, free_bytes / 2**30, total_bytes / 2**30, memory_fraction, num_blocks, block_size,
    )
    return num_blocks


CPU_KV_BUDGET_BYTES = 2 << 30  # like vLLM's CPU backend default (4 GiB) halved: CPU runs are small


def default_num_blocks(
    spec: KVCacheSpec,
    block_size: int,
    *,
    device: torch.device | str,
    max_seq_len: int,
    max_num_seqs: int,
    memory_fraction: float = 0.9,
    cpu_budget_bytes: int = CPU_KV_BUDGET_BYTES,
) -> int:
    """The block count an engine takes when the caller gives none.

    CUDA: profile_num_blocks (memory_fraction of the free memory). Elsewhere: enough blocks
    for max_num_seqs sequences of max_seq_len tokens (plus one spare block, so a full batch
    is never short of one by rounding), capped by cpu_budget_bytes; raises
    KVCacheError(INSUFFICIENT_MEMORY) if the budget cannot hold one such sequence.
    """
    if block_size < 1 or max_seq_len < 1 or max_num_seqs < 1:
        raise KVArgumentError(
            KVErrorCode.INVALID_ARGUMENT,
            f"default_num_blocks: expected block_size, max_seq_len and max_num_seqs >= 1, got "
            f"block_size={block_size}, max_seq_len={max_seq_len}, max_num_seqs={max_num_seqs}",
        )
    if torch.device(device).type == "cuda":
        return profile_num_blocks(spec, block_size, device=device, memory_fraction=memory_fraction,
                                  max_seq_len=max_seq_len)
    wanted = -(-max_seq_len // block_size) * max_num_seqs + 1
    fits = num_blocks_for_budget(spec, block_size, cpu_budget_bytes, max_seq_len=max_seq_len)
    if fits < wanted:
        logger.info("KV cache on {}: {} blocks for {} sequences of {} tokens exceed the {:.2f} GiB budget; "
                    "taking {}", device, wanted, max_num_seqs, max_seq_len, cpu_budget_bytes / 2**30, fits)
    return min(wanted, fits)
