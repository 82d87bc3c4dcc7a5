"""Argument checks of the block manager's calls: each turns a caller's value into what the
manager stores (Python ints, hashable keys) or looks up the sequences it names, or raises
KV_INVALID_ARGUMENT (KV_UNKNOWN_SEQUENCE for a seq_id not admitted) naming it, before any state
changes."""

from __future__ import annotations

import operator
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

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


def prompt_list(token_ids: Sequence[int] | torch.Tensor, where: str) -> list[int]:
    """A prompt's token_ids as token_list's ints, or INVALID_ARGUMENT if there are none."""
    tokens = token_list(token_ids, where)
    if not tokens:
        raise arg_error(f"{where}: expected a non-empty prompt, got 0 token_ids")
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


def check_commit(num_computed: int, num_tokens: int, seq_id: Hashable, n: int, where: str) -> None:
    """A commit's num_computed_tokens n lies in [num_computed, num_tokens] of its sequence (already
    computed .. known tokens), or INVALID_ARGUMENT."""
    if not num_computed <= n <= num_tokens:
        raise arg_error(
            f"{where}: expected num_computed_tokens in [{num_computed}, {num_tokens}] "
            f"(already computed .. num_tokens) for seq_id={seq_id!r}, got {n}"
        )


S = TypeVar("S")


def admitted(seqs: Mapping[Hashable, S], seq_id: Hashable, where: str) -> S:
    """seqs[seq_id], or INVALID_ARGUMENT for an unhashable seq_id, UNKNOWN_SEQUENCE for one not
    admitted."""
    try:
        return seqs[seq_id]
    except TypeError:
        raise arg_error(f"{where}: expected a hashable seq_id, got {type(seq_id).__name__}") from None
    except KeyError:
        raise KVArgumentError(
            KVErrorCode.UNKNOWN_SEQUENCE,
            f"{where}: expected an admitted seq_id, got {seq_id!r}",
        ) from None


def distinct_admitted(seqs: Mapping[Hashable, S], seq_ids: Sequence[Hashable], n_values: int, values: str,
                      where: str) -> list[S]:
    """The sequences of a batched call: admitted, distinct, one of the n_values `values` each."""
    if len(seq_ids) != n_values:
        raise arg_error(f"{where}: expected one value per sequence, got {len(seq_ids)} seq_ids "
                        f"and {n_values} {values}")
    found = [admitted(seqs, s, where) for s in seq_ids]
    if len(set(map(id, found))) != len(found):
        raise arg_error(f"{where}: expected distinct seq_ids, got a repeated one")
    return found


def arg_error(message: str) -> KVArgumentError:
    return KVArgumentError(KVErrorCode.INVALID_ARGUMENT, message)
