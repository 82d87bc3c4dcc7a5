"""Argument checks of the block manager's calls: each turns a caller's value into what the
manager stores (Python ints, hashable keys) or raises KV_INVALID_ARGUMENT naming it, before any
state changes."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from kv_manager.errors import KVArgumentError, KVErrorCode


def token_list(token_ids: Sequence[int] | torch.Tensor, where: str) -> list[int]:
    """token_ids as a list of Python ints >= 0 (a tensor's elements would hash by identity,
    never hitting the cache), or INVALID_ARGUMENT: a 1-D integer tensor or a sequence of ints
    (numpy ints too; not bools, floats, strings or nested lists)."""
    if isinstance(token_ids, torch.Tensor):
        if token_ids.dim() != 1 or token_ids.dtype.is_floating_point or token_ids.dtype.is_complex \
                or token_ids.dtype == torch.bool:
            raise arg_error(f"{where}: expected token_ids as a 1-D integer tensor, "
                            f"got {token_ids.dtype} {list(token_ids.shape)}")
        tokens = token_ids.tolist()
    elif isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence) and \
            not hasattr(token_ids, "__iter__"):
        raise arg_error(f"{where}: expected token_ids as a sequence of ints, got {type(token_ids).__name__}")
    else:
        tokens = list(token_ids)
        for i, t in enumerate(tokens):
            if type(t) is not int:  # (the common case costs one type check per token)
                tokens[i] = as_int(t, f"{where}: token_ids[{i}]")
    if tokens and min(tokens) < 0:
        raise arg_error(f"{where}: expected token ids >= 0, got {min(tokens)}")
    return tokens


def as_int(value, what: str) -> int:
    """value as an int (Python or numpy int, a 0-d integer tensor), or INVALID_ARGUMENT naming
    `what` (bools, floats, strings are refused, even 8.0)."""
    if type(value) is int:
        return value
    if not isinstance(value, bool):
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 and not value.dtype.is_floating_point and value.dtype != torch.bool \
                    and not value.dtype.is_complex:
                return int(value)
        else:
            try:
                return operator.index(value)
            except TypeError:
                pass
    raise arg_error(f"{what}: expected an int, got {type(value).__name__} {value!r}")


def check_hashable(value, what: str) -> None:
    try:
        hash(value)
    except TypeError:
        raise arg_error(f"{what}: expected a hashable value, got {type(value).__name__} {value!r}") from None


def arg_error(message: str) -> KVArgumentError:
    return KVArgumentError(KVErrorCode.INVALID_ARGUMENT, message)
