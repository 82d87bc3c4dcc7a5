"""How many KV blocks an LLMEngine allocates when it is given no num_blocks.

The count comes from kv_manager.default_num_blocks (free device memory, or the CPU budget) for
the generator's cache spec; under tensor parallelism the ranks agree on the smallest.
"""

from __future__ import annotations

import torch

from kv_manager import default_num_blocks


def size_kv_cache(generator, block_size: int, max_seq_len: int, max_num_seqs: int, fraction: float,
                  cpu_budget: int, kv_dtype=None) -> int:
    """KV blocks for an engine given none: kv_manager.default_num_blocks on this rank (for a cache of
    kv_dtype; None: the model's); under tensor parallelism every rank runs the same scheduler in
    lockstep, so all take the minimum."""
    spec = generator.kv_cache_spec if kv_dtype is None else generator.kv_cache_spec_for(kv_dtype)
    n = default_num_blocks(spec, block_size, device=generator.device, max_seq_len=max_seq_len,
                           max_num_seqs=max_num_seqs, memory_fraction=fraction, cpu_budget_bytes=cpu_budget)
    tp = getattr(generator, "tp_group", None)
    if tp is not None and tp.enabled:
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64, device=generator.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=tp.group)
        n = int(t.item())
    return n

