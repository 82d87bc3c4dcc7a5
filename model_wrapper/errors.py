"""Errors raised while loading a checkpoint or building a model (below the generator's layer).

The generator's own validation errors live in text_generator.errors; these carry a code of their
own enum so that model_wrapper never imports upward.
"""

from __future__ import annotations

from enum import Enum


class ModelErrorCode(str, Enum):
    MISSING_FILE = "MODEL_MISSING_FILE"
    BAD_CONFIG = "MODEL_BAD_CONFIG"
    UNSUPPORTED_ARCHITECTURE = "MODEL_UNSUPPORTED_ARCHITECTURE"
    UNSUPPORTED_FEATURE = "MODEL_UNSUPPORTED_FEATURE"
    MISSING_TENSOR = "MODEL_MISSING_TENSOR"
    MISSHAPEN_TENSOR = "MODEL_MISSHAPEN_TENSOR"
    BACKEND_UNAVAILABLE = "MODEL_BACKEND_UNAVAILABLE"
    UNSUPPORTED_QUANTIZATION = "MODEL_UNSUPPORTED_QUANTIZATION"  # config.json quantization_config
    UNSUPPORTED_DTYPE = "MODEL_UNSUPPORTED_DTYPE"  # a tensor or requested dtype that is not a float type
    UNSUPPORTED_FORMAT = "MODEL_UNSUPPORTED_FORMAT"  # pytorch_model.bin and other non-safetensors weights
    UNEXPECTED_TENSOR = "MODEL_UNEXPECTED_TENSOR"  # a checkpoint tensor the config has no place for
    DUPLICATE_TENSOR = "MODEL_DUPLICATE_TENSOR"  # one tensor name in two shards
    CORRUPT_FILE = "MODEL_CORRUPT_FILE"  # unreadable JSON or safetensors (truncated, lying header)
    BAD_INDEX = "MODEL_BAD_INDEX"  # model.safetensors.index.json malformed or disagreeing with the shards
    UNSAFE_PATH = "MODEL_UNSAFE_PATH"  # a file that resolves outside the checkpoint folder
    NONFINITE_WEIGHT = "MODEL_NONFINITE_WEIGHT"  # NaN or inf in a weight
    DRAFT_MISMATCH = "MODEL_DRAFT_MISMATCH"  # a draft head whose sizes or vocabulary do not fit its target


class ModelLoadError(ValueError):
    """A checkpoint that cannot be loaded: `code` says why, the message says what and where."""

    def __init__(self, code: ModelErrorCode, message: str):
        self.code = code
        super().__init__(f"[{code.value}] {message}")
