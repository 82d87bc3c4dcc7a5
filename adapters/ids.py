"""The adapter-id rule: what a step's `adapter_ids` may be. Checked once, where a step enters the
library (text_generator.validation for forward_tensor, the engine for add_request's adapter);
everything after that (LoraManager.make_batch / slots_for, the CUDA-graph runner) takes the
resolved list as given.

    adapter_ids = None                    no LoRA in the step
    adapter_ids = [a]                     a for every request of the batch
    adapter_ids = [a_0, ..., a_{B-1}]     a_i for request i
    a: None or "base" (the base model), or the name (str) of a loaded adapter
    anything else: a str in place of the list, a tuple of another length, a non-str entry,
    a name that is not loaded

The rule says what is wrong (AdapterIdsError.kind); the caller raises it under its own error
code (forward_tensor: text_generator.ErrorCode), since this package never imports upward.
"""

from __future__ import annotations

from enum import Enum
from typing import Sequence


class AdapterIdsFault(str, Enum):
    """Which part of the rule adapter_ids broke."""

    TYPE = "type"  # not a list / tuple, or an entry that is neither str nor None
    TOO_LONG = "too_long"  # more entries than requests
    LENGTH = "length"  # neither 1 entry nor one per request (e.g. empty)
    NOT_LOADED = "not_loaded"  # a name that is not loaded


class AdapterIdsError(ValueError):
    """adapter_ids broke the rule. fault: AdapterIdsFault; argument: "adapter_ids" or
    "adapter_ids[i]"; detail: "expected ..., got ..."."""

    def __init__(self, fault: AdapterIdsFault, argument: str, detail: str):
        super().__init__(f"{argument}: {detail}")
        self.fault, self.argument, self.detail = fault, argument, detail


def resolve_adapter_ids(adapter_ids, batch_size: int, loaded: Sequence[str]) -> list[str | None] | None:
    """-> one entry per request (length batch_size; None for the base model), or None when no
    request of the step uses an adapter. Raises AdapterIdsError (see the module docstring)."""
    if adapter_ids is None:
        return None
    if isinstance(adapter_ids, str) or not isinstance(adapter_ids, (list, tuple)):
        raise AdapterIdsError(AdapterIdsFault.TYPE, "adapter_ids",
                              f"expected a list of str or None, got {type(adapter_ids).__name__}")
    n = len(adapter_ids)
    if n > batch_size:
        raise AdapterIdsError(AdapterIdsFault.TOO_LONG, "adapter_ids",
                              f"expected at most batch size {batch_size} entries, got {n}")
    if n not in (1, batch_size):
        raise AdapterIdsError(AdapterIdsFault.LENGTH, "adapter_ids",
                              f"expected 1 entry (whole batch) or {batch_size} (one per request), got {n}")
    names = []
    for i, a in enumerate(adapter_ids):
        if a is not None and not isinstance(a, str):
            raise AdapterIdsError(AdapterIdsFault.TYPE, f"adapter_ids[{i}]",
                                  f"expected str or None, got {type(a).__name__}")
        if a is not None and a != "base" and a not in loaded:
            raise AdapterIdsError(AdapterIdsFault.NOT_LOADED, "adapter_ids",
                                  f"expected a loaded adapter ({sorted(loaded)} or 'base'), got {a!r} for request {i}")
        names.append(None if a in (None, "base") else a)
    if n == 1:
        names = names * batch_size
    return None if all(a is None for a in names) else names
