"""LoRA: loading PEFT adapters, slots and ranks, the per-token adapter mapping, batched LoRA matmuls.

    gen.enable_lora(max_loras=8, max_rank=64)       # preallocates the slot stacks once
    gen.load_adapter("sql", "/adapters/sql")        # PEFT folder: adapter_config.json + .safetensors
    logits = gen.forward_tensor(..., adapter_ids=["sql", None, "chat"])  # per request; None/"base" = base
    gen.unload_adapter("sql")                       # the slot is free for the next load

Prefix caching: K/V computed under an adapter differ from the base model's (and from those of
an earlier load of the same name), so a scheduler puts the adapter's cache key into the
prefix-cache key:
    key = gen.lora_manager.cache_key(adapter_name)                    # (name, load id)
    block_manager.admit(seq_id, prompt_ids, extra_key=key)            # None for the base model
Sequences with different extra_keys never share cached blocks; after an unload,
block_manager.drop_cached(key) frees what only that key could reach.

This package imports neither model_wrapper nor text_generator; its errors carry LoraErrorCode.
"""

from adapters.errors import LoraError, LoraErrorCode, LoraStateError
from adapters.ids import AdapterIdsError, AdapterIdsFault, resolve_adapter_ids
from adapters.lora_batch import LoraBatch
from adapters.lora_layers import LoraLinear, LoraStep
from adapters.lora_manager import LoraManager
from adapters.peft_adapter import PeftAdapter, read_peft_adapter
from adapters.shapes import FUSED_MODULES, PEFT_MODULES, LoraShapes

__all__ = [
    "AdapterIdsError",
    "AdapterIdsFault",
    "FUSED_MODULES",
    "LoraBatch",
    "LoraError",
    "LoraErrorCode",
    "LoraLinear",
    "LoraManager",
    "LoraShapes",
    "LoraStateError",
    "LoraStep",
    "PEFT_MODULES",
    "PeftAdapter",
    "read_peft_adapter",
    "resolve_adapter_ids",
]
