"""Error codes of forward_tensor and the generator: one enum, raised at the boundary.

Every rejected call raises ForwardArgumentError (a ValueError) or GeneratorStateError (a
RuntimeError) whose `code` is an ErrorCode and whose message reads
    "[TG_INVALID_SHAPE] slots: expected shape [num_tokens=7], got [6]"
naming the argument, what was expected and what came.
"""

from __future__ import annotations

from enum import Enum


class ErrorCode(str, Enum):
    INVALID_TYPE = "TG_INVALID_TYPE"
    INVALID_SHAPE = "TG_INVALID_SHAPE"
    INVALID_DTYPE = "TG_INVALID_DTYPE"
    INVALID_DEVICE = "TG_INVALID_DEVICE"
    UNKNOWN_ARGUMENT = "TG_UNKNOWN_ARGUMENT"
    TOKEN_OUT_OF_RANGE = "TG_TOKEN_OUT_OF_RANGE"
    INVALID_LENGTH = "TG_INVALID_LENGTH"
    MAX_SEQ_LEN_EXCEEDED = "TG_MAX_SEQ_LEN_EXCEEDED"
    INVALID_Q_LENS = "TG_INVALID_Q_LENS"
    POSITION_MISMATCH = "TG_POSITION_MISMATCH"
    BLOCK_TABLE_TOO_SHORT = "TG_BLOCK_TABLE_TOO_SHORT"
    BLOCK_OUT_OF_RANGE = "TG_BLOCK_OUT_OF_RANGE"
    BLOCK_REPEATED = "TG_BLOCK_REPEATED"
    SLOT_MISMATCH = "TG_SLOT_MISMATCH"
    SLOT_CONFLICT = "TG_SLOT_CONFLICT"
    LM_HEAD_INDEX_OUT_OF_RANGE = "TG_LM_HEAD_INDEX_OUT_OF_RANGE"
    INVALID_MASK = "TG_INVALID_MASK"
    KV_CACHE_MISMATCH = "TG_KV_CACHE_MISMATCH"
    KV_CACHE_ALIASED = "TG_KV_CACHE_ALIASED"  # two cache tensors share memory
    ADAPTER_IDS_TOO_LONG = "TG_ADAPTER_IDS_TOO_LONG"
    ADAPTER_IDS_LENGTH = "TG_ADAPTER_IDS_LENGTH"
    ADAPTER_NOT_LOADED = "TG_ADAPTER_NOT_LOADED"
    INVALID_MAX_OUT_LEN = "TG_INVALID_MAX_OUT_LEN"
    INVALID_PREV_TOKEN_IDS = "TG_INVALID_PREV_TOKEN_IDS"
    INVALID_HIDDEN_STATES = "TG_INVALID_HIDDEN_STATES"
    INVALID_KV_SCALES = "TG_INVALID_KV_SCALES"  # FP8 K/V scales: not num_layers positive finite floats
    INVALID_KV_CACHE_DTYPE = "TG_INVALID_KV_CACHE_DTYPE"  # a cache dtype the model does not run
    INVALID_STRUCTURED_OUTPUT = "TG_INVALID_STRUCTURED_OUTPUT"
    STRUCTURED_OUTPUT_UNAVAILABLE = "TG_STRUCTURED_OUTPUT_UNAVAILABLE"
    NO_CHAT_TEMPLATE = "TG_NO_CHAT_TEMPLATE"
    INVALID_HOST_THREADS = "TG_INVALID_HOST_THREADS"  # TextGenerator(host_threads=): not None or an int >= 1
    # the OpenAI-compatible server (text_generator/serve): the `code` of its error bodies
    INVALID_REQUEST = "TG_INVALID_REQUEST"
    MODEL_NOT_FOUND = "TG_MODEL_NOT_FOUND"
    PROMPT_TOO_LONG = "TG_PROMPT_TOO_LONG"
    QUEUE_FULL = "TG_QUEUE_FULL"
    ADAPTER_REFUSED = "TG_ADAPTER_REFUSED"
    ENGINE_FAILED = "TG_ENGINE_FAILED"


class _Coded:
    def _init(self, code: ErrorCode, argument: str, message: str):
        self.code = code
        self.argument = argument
        return f"[{code.value}] {argument}: {message}"


class ForwardArgumentError(ValueError, _Coded):
    """A bad argument: nothing was computed or written."""

    def __init__(self, code: ErrorCode, argument: str, message: str):
        super().__init__(self._init(code, argument, message))


class GeneratorStateError(RuntimeError, _Coded):
    """The generator's state or resources refuse the call: nothing was computed or written."""

    def __init__(self, code: ErrorCode, argument: str, message: str):
        super().__init__(self._init(code, argument, message))
