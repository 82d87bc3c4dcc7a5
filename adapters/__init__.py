"""LoRA: loading PEFT adapters, slots and ranks, the per-token adapter mapping, batched LoRA matmuls."""
