"""Error codes of the adapters package: one enum, raised where an adapter is loaded or mapped.

Every refusal raises LoraError (a ValueError: a bad argument or adapter folder) or LoraStateError
(a RuntimeError: the manager's state or capacity) whose `code` is a LoraErrorCode and whose
message reads
    "[LORA_RANK_TOO_LARGE] load_adapter(name='x'): expected rank <= max_rank=16, got 32"
naming the call (or argument), what was expected and what came. A refused call changes nothing.
The package keeps its own enum so that it never imports text_generator (layering rule).
"""

from __future__ import annotations

from enum import Enum


class LoraErrorCode(str, Enum):
    INVALID_ARGUMENT = "LORA_INVALID_ARGUMENT"  # a LoraManager constructor argument
    NOT_ENABLED = "LORA_NOT_ENABLED"  # TextGenerator.load_adapter before enable_lora()
    ALREADY_ENABLED = "LORA_ALREADY_ENABLED"  # enable_lora() a second time
    INVALID_NAME = "LORA_INVALID_NAME"  # not a non-empty str, or the reserved "base"
    DUPLICATE_NAME = "LORA_DUPLICATE_NAME"
    MISSING_FILE = "LORA_MISSING_FILE"  # no folder, adapter_config.json or adapter_model.safetensors
    INVALID_CONFIG = "LORA_INVALID_CONFIG"  # adapter_config.json unreadable or inconsistent
    UNSUPPORTED_CONFIG = "LORA_UNSUPPORTED_CONFIG"  # DoRA, LoRA bias, trainable biases, not LORA, ...
    UNSUPPORTED_MODULE = "LORA_UNSUPPORTED_MODULE"  # embed_tokens, lm_head, modules_to_save, unknown
    SHAPE_MISMATCH = "LORA_SHAPE_MISMATCH"  # weights that do not fit the base model
    NON_FINITE_WEIGHTS = "LORA_NON_FINITE_WEIGHTS"  # NaN / inf in lora_A / lora_B (or after scaling)
    RANK_TOO_LARGE = "LORA_RANK_TOO_LARGE"  # an adapter above max_rank, or max_rank above hidden_size
    INSUFFICIENT_MEMORY = "LORA_INSUFFICIENT_MEMORY"  # slot stacks larger than the device's free memory
    NO_FREE_SLOT = "LORA_NO_FREE_SLOT"
    NOT_LOADED = "LORA_NOT_LOADED"  # unload (or map) a name that is not loaded
    UNLOAD_BASE = "LORA_UNLOAD_BASE"  # "base" is the model itself, never loaded or unloaded
    TOO_MANY_TOKENS = "LORA_TOO_MANY_TOKENS"  # a step larger than the preallocated mapping buffers
    ALREADY_FOLDED = "LORA_ALREADY_FOLDED"  # LoraManager.fold_into a second time


class _Coded:
    def _init(self, code: LoraErrorCode, argument: str, message: str) -> str:
        self.code = code
        self.argument = argument
        return f"[{code.value}] {argument}: {message}"


class LoraError(ValueError, _Coded):
    """A bad argument or adapter folder: nothing was loaded, unloaded or mapped."""

    def __init__(self, code: LoraErrorCode, argument: str, message: str):
        super().__init__(self._init(code, argument, message))


class LoraStateError(RuntimeError, _Coded):
    """The manager's state or capacity refuses the call: nothing changed."""

    def __init__(self, code: LoraErrorCode, argument: str, message: str):
        super().__init__(self._init(code, argument, message))
