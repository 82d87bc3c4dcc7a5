"""Error codes of kv_manager, raised at its boundary (argument checks before any state changes).

A scheduler catches these around BlockManager calls: `KVCacheError` (a RuntimeError) means the
request was fine but the resources are not there now (retry later, preempt, evict); the
`KVArgumentError` (a ValueError) means the call itself was wrong. Both carry `.code` and a
message `"[CODE] where: expected ..., got ..."`; a failed call has changed nothing.
"""

from __future__ import annotations

from enum import Enum


class KVErrorCode(str, Enum):
    """Stable codes; the value is what appears in brackets at the start of a message."""

    OUT_OF_BLOCKS = "KV_OUT_OF_BLOCKS"
    INSUFFICIENT_MEMORY = "KV_INSUFFICIENT_MEMORY"
    UNKNOWN_SEQUENCE = "KV_UNKNOWN_SEQUENCE"
    DUPLICATE_SEQUENCE = "KV_DUPLICATE_SEQUENCE"
    INVALID_ARGUMENT = "KV_INVALID_ARGUMENT"


class _CodedError(Exception):
    def __init__(self, code: KVErrorCode, message: str) -> None:
        super().__init__(f"[{code.value}] {message}")
        self.code = code


class KVCacheError(_CodedError, RuntimeError):
    """State or resources: out of blocks, not enough device memory for one sequence."""


class KVArgumentError(_CodedError, ValueError):
    """A bad argument: unknown or duplicate sequence id, a length or index out of range."""
