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


class ModelLoadError(ValueError):
    """A checkpoint that cannot be loaded: `code` says why, the message says what and where."""

    def __init__(self, code: ModelErrorCode, message: str):
        self.code = code
        super().__init__(f"[{code.value}] {message}")
