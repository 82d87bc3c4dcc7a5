"""Validation of forward_tensor's arguments, before anything is computed or written.

Input: the caller's arguments exactly as given. Output: a StepArgs with host (CPU) copies of the
per-request arrays and checked token tensors, ready for ForwardBatch.build. Each rule raises a
ForwardArgumentError with its own ErrorCode; the order of the checks is the order of the
contract's table, so the first thing wrong is the thing reported.

All checks run on host copies: tensors the caller keeps on the CPU (the scheduler's usual place)
cost no device sync; a device-resident argument is copied to the host once.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from adapters.ids import AdapterIdsError, AdapterIdsFault, resolve_adapter_ids
from text_generator.errors import ErrorCode, ForwardArgumentError

KNOWN_KWARGS = frozenset({"q_lens", "spec_mask", "atten_mask", "adapter_ids", "max_out_len", "prev_token_ids",
                          "output_hidden_states"})
_MASKED_BELOW = -1e4  # additive mask values at or below this (incl. -inf) mean "do not attend"


@dataclass
class StepArgs:
    input_ids: torch.Tensor  # [T] int64 (caller's device)
    input_ids_cpu: torch.Tensor  # [T] int64 host copy
    token_req: torch.Tensor  # [T] int64 host: request of each token
    token_kv_index: torch.Tensor  # [T] int64 host: kv index of each token (L - q + i)
    positions: torch.Tensor  # [T] int64 host
    slots: torch.Tensor  # [T] int64 host
    is_prefill: bool
    block_size: int
    q_lens: torch.Tensor  # [B] int32 host
    input_lengths: torch.Tensor  # [B] int32 host
    block_tables: torch.Tensor  # [B, W] int32 host
    lm_head_indices: torch.Tensor | None  # [num_out] int64 host
    spec_mask: torch.Tensor | None  # [T, max_q] bool host
    atten_mask: torch.Tensor | None  # [T, max_kv] bool host
    adapter_ids: list[str | None] | None  # per request (length B) or None
    max_out_len: int
    # (tokens [S] int64 on the model's device, rows [n] int64 host, index [n] int64 host):
    # input_ids[rows[i]] := tokens[index[i]] on the device (see _prev_token_ids)
    prev_token_ids: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # indices into the hidden-state stack to return beside the logits (0..num_layers), or None
    hidden_layers: tuple[int, ...] | None = None


def _fail(code: ErrorCode, arg: str, msg: str):
    raise ForwardArgumentError(code, arg, msg)


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _int_tensor(x: Any, arg: str, ndim: int, model_device: torch.device) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        _fail(ErrorCode.INVALID_TYPE, arg, f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype == torch.bool or x.dtype.is_floating_point or x.dtype.is_complex:
        _fail(ErrorCode.INVALID_DTYPE, arg, f"expected an integer dtype, got {x.dtype}")
    if x.dim() != ndim:
        _fail(ErrorCode.INVALID_SHAPE, arg, f"expected a {ndim}-D tensor, got shape {_shape(x)}")
    if x.device.type != "cpu" and x.device != model_device:
        _fail(ErrorCode.INVALID_DEVICE, arg, f"expected the CPU or {model_device}, got {x.device}")
    return x


def _plain_int(x: Any, arg: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.dtype.is_floating_point and x.dtype != torch.bool:
            return int(x.item())
        _fail(ErrorCode.INVALID_TYPE, arg, f"expected an int, got {type(x).__name__}")
    return int(x)


def _first_bad(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask.flatten())[0, 0])


FP8_KV_DTYPE = torch.float8_e4m3fn  # the one FP8 cache format (K/V scaled per layer, see ModelWrapper.kv_scales)


def validate_kv_cache(kv_cache, *, num_layers, num_kv_heads, head_dim, dtype, device,
                      cache_dtypes: tuple | None = None) -> tuple[int, int]:
    """-> (num_blocks, block_size) shared by every layer; the 2 * num_layers tensors must not share
    memory (one pair for two layers, k is v, overlapping views of one buffer: each write would land
    in another layer's or the other half's K/V). The cache dtype is one of cache_dtypes (the model's:
    ModelWrapper.kv_cache_dtypes; None: the model's dtype or float8_e4m3fn, an FP8 cache), the same
    for every tensor."""
    cache_dtypes = (dtype, FP8_KV_DTYPE) if cache_dtypes is None else tuple(cache_dtypes)
    if not isinstance(kv_cache, (list, tuple)):
        _fail(ErrorCode.INVALID_TYPE, "kv_cache", f"expected a list of (k_cache, v_cache), got {type(kv_cache).__name__}")
    if len(kv_cache) != num_layers:
        _fail(ErrorCode.KV_CACHE_MISMATCH, "kv_cache", f"expected {num_layers} layers, got {len(kv_cache)}")
    ref = None
    for i, pair in enumerate(kv_cache):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            _fail(ErrorCode.INVALID_TYPE, f"kv_cache[{i}]", "expected a (k_cache, v_cache) pair")
        for name, t in zip(("k_cache", "v_cache"), pair):
            arg = f"kv_cache[{i}].{name}"
            if not isinstance(t, torch.Tensor):
                _fail(ErrorCode.INVALID_TYPE, arg, f"expected a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 4 or t.shape[2] != num_kv_heads or t.shape[3] != head_dim or t.shape[0] < 1 or t.shape[1] < 1:
                _fail(ErrorCode.KV_CACHE_MISMATCH, arg,
                      f"expected shape [num_blocks, block_size, {num_kv_heads}, {head_dim}], got {_shape(t)}")
            if ref is not None and tuple(t.shape) != ref:
                _fail(ErrorCode.KV_CACHE_MISMATCH, arg, f"expected shape {list(ref)} like layer 0, got {_shape(t)}")
            ref = tuple(t.shape)
            if t.dtype not in cache_dtypes:
                fp8 = FP8_KV_DTYPE in cache_dtypes
                _fail(ErrorCode.INVALID_DTYPE, arg,
                      f"expected the model dtype {dtype}{f' or {FP8_KV_DTYPE} (an FP8 cache)' if fp8 else ''}, got "
                      f"{t.dtype}{'' if fp8 or t.dtype != FP8_KV_DTYPE else ' (an FP8 cache needs a GPU with e4m3)'}")
            if t.dtype != kv_cache[0][0].dtype:
                _fail(ErrorCode.INVALID_DTYPE, arg,
                      f"expected the dtype of kv_cache[0].k_cache ({kv_cache[0][0].dtype}) in every layer, got {t.dtype}")
            if t.device != device:
                _fail(ErrorCode.INVALID_DEVICE, arg, f"expected the model device {device}, got {t.device}")
            if not t.is_contiguous():
                _fail(ErrorCode.KV_CACHE_MISMATCH, arg, "expected a contiguous tensor")
    _check_no_aliasing(kv_cache)
    return ref[0], ref[1]


class KVCacheMemo:
    """The kv_cache that validate_kv_cache accepted last, for one caller (a TextGenerator owns one):
    a scheduler passes the same cache every step, and seeing that it is the same (the same tensor
    objects, each with the same data pointer, shape and strides, under the same model parameters)
    costs about a tenth of checking all 2 * num_layers tensors again. Weak references: the memo
    keeps no cache alive."""

    def __init__(self):
        self._params = None
        self._tensors: tuple = ()
        self._result: tuple[int, int] | None = None

    def lookup(self, kv_cache, params: tuple) -> tuple[int, int] | None:
        """-> validate_kv_cache's result if kv_cache is the one remembered under params, else None."""
        if params != self._params or not isinstance(kv_cache, (list, tuple)) or 2 * len(kv_cache) != len(self._tensors):
            return None
        seen = iter(self._tensors)
        for pair in kv_cache:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                return None
            for t in pair:
                ref, ptr, shape, stride = next(seen)
                if ref() is not t or t.data_ptr() != ptr or t.shape != shape or t.stride() != stride:
                    return None
        return self._result

    def remember(self, kv_cache, params: tuple, result: tuple[int, int]) -> None:
        self._params, self._result = params, result
        self._tensors = tuple((weakref.ref(t), t.data_ptr(), t.shape, t.stride()) for pair in kv_cache for t in pair)


def _check_no_aliasing(kv_cache) -> None:
    """Refuse cache tensors whose memory overlaps. Each is contiguous (checked before), so it
    covers exactly [data_ptr, data_ptr + nbytes): sort the 2 * num_layers ranges by start and
    compare neighbours. Host pointers only: no device sync."""
    spans = []
    for i, pair in enumerate(kv_cache):
        for name, t in zip(("k_cache", "v_cache"), pair):
            start = t.data_ptr()
            spans.append((start, start + t.numel() * t.element_size(), f"kv_cache[{i}].{name}"))
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            _fail(ErrorCode.KV_CACHE_ALIASED, second,
                  f"expected memory of its own (each layer's k_cache and v_cache separate tensors), "
                  f"got memory shared with {first}")


def _mask(x: Any, arg: str, rows: int, cols: int, model_device: torch.device) -> torch.Tensor:
    """-> bool [rows, cols] on the host, True = attend."""
    if not isinstance(x, torch.Tensor):
        _fail(ErrorCode.INVALID_TYPE, arg, f"expected a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cpu" and x.device != model_device:
        _fail(ErrorCode.INVALID_DEVICE, arg, f"expected the CPU or {model_device}, got {x.device}")
    if _shape(x) != [rows, cols]:
        _fail(ErrorCode.INVALID_SHAPE, arg, f"expected shape [{rows}, {cols}], got {_shape(x)}")
    x = x.cpu()
    if x.dtype == torch.bool:
        return x
    if not x.dtype.is_floating_point:
        _fail(ErrorCode.INVALID_DTYPE, arg, f"expected bool or an additive float mask, got {x.dtype}")
    attend = x == 0
    masked = x <= _MASKED_BELOW
    if not bool((attend | masked).all()):
        bad = _first_bad(~(attend | masked))
        _fail(ErrorCode.INVALID_MASK, arg,
              f"expected additive values 0.0 (attend) or -inf / <= {_MASKED_BELOW} (masked), "
              f"got {x.flatten()[bad].item()} at flat index {bad}")
    return attend


def validate_step(
    *,
    input_ids, position_ids, is_prefill, kv_cache, block_tables, slots, input_lengths,
    max_seq_len, lm_head_indices, kwargs: dict,
    num_layers: int, num_kv_heads: int, head_dim: int, vocab_size: int, model_max_len: int,
    dtype: torch.dtype, device: torch.device, loaded_adapters: Sequence[str], kv_memo: KVCacheMemo | None = None,
    cache_dtypes: tuple | None = None,
) -> StepArgs:
    """kv_memo: the caller's memo of the cache it validated last (KVCacheMemo), or None: check every time.
    cache_dtypes: the cache dtypes the model runs (validate_kv_cache)."""
    unknown = sorted(set(kwargs) - KNOWN_KWARGS)
    if unknown:
        _fail(ErrorCode.UNKNOWN_ARGUMENT, unknown[0], f"expected one of {sorted(KNOWN_KWARGS)}, got {unknown}")

    input_ids = _int_tensor(input_ids, "input_ids", 1, device)
    T = input_ids.shape[0]
    if T < 1:
        _fail(ErrorCode.INVALID_SHAPE, "input_ids", "expected at least one token, got shape [0]")
    position_ids = _int_tensor(position_ids, "position_ids", 1, device)
    if position_ids.shape[0] != T:
        _fail(ErrorCode.INVALID_SHAPE, "position_ids", f"expected shape [num_tokens={T}], got {_shape(position_ids)}")
    if not isinstance(is_prefill, bool):
        if isinstance(is_prefill, torch.Tensor) and is_prefill.numel() == 1 and is_prefill.dtype == torch.bool:
            is_prefill = bool(is_prefill.item())
        else:
            _fail(ErrorCode.INVALID_TYPE, "is_prefill", f"expected a bool, got {type(is_prefill).__name__}")
    params = (num_layers, num_kv_heads, head_dim, dtype, device)
    cache_shape = kv_memo.lookup(kv_cache, params) if kv_memo is not None else None
    if cache_shape is None:
        cache_shape = validate_kv_cache(
            kv_cache, num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype, device=device,
            cache_dtypes=cache_dtypes)
        if kv_memo is not None:
            kv_memo.remember(kv_cache, params, cache_shape)
    num_blocks, block_size = cache_shape
    block_tables = _int_tensor(block_tables, "block_tables", 2, device)
    slots = _int_tensor(slots, "slots", 1, device)
    if slots.shape[0] != T:
        _fail(ErrorCode.INVALID_SHAPE, "slots", f"expected shape [num_tokens={T}], got {_shape(slots)}")
    input_lengths = _int_tensor(input_lengths, "input_lengths", 1, device)
    B = input_lengths.shape[0]
    if B < 1:
        _fail(ErrorCode.INVALID_SHAPE, "input_lengths", "expected at least one request, got shape [0]")
    if block_tables.shape[0] != B:
        _fail(ErrorCode.INVALID_SHAPE, "block_tables", f"expected {B} rows (batch, from input_lengths), got shape {_shape(block_tables)}")
    max_seq_len = _plain_int(max_seq_len, "max_seq_len")
    if max_seq_len < 1 or max_seq_len > model_max_len:
        _fail(ErrorCode.MAX_SEQ_LEN_EXCEEDED, "max_seq_len",
              f"expected 1 <= max_seq_len <= the model's limit {model_max_len}, got {max_seq_len}")

    # host copies: one transfer each
    ids_h = input_ids.cpu()
    if bool(((ids_h < 0) | (ids_h >= vocab_size)).any()):
        bad = _first_bad((ids_h < 0) | (ids_h >= vocab_size))
        _fail(ErrorCode.TOKEN_OUT_OF_RANGE, "input_ids",
              f"expected token ids in [0, {vocab_size}), got {int(ids_h[bad])} at index {bad}")
    L = input_lengths.cpu().to(torch.int64)
    if bool(((L < 1) | (L > max_seq_len)).any()):
        bad = _first_bad((L < 1) | (L > max_seq_len))
        _fail(ErrorCode.INVALID_LENGTH, "input_lengths",
              f"expected 1 <= input_length <= max_seq_len={max_seq_len}, got {int(L[bad])} for request {bad}")

    q = _q_lens(kwargs.get("q_lens"), is_prefill, L, T, device)
    starts = torch.cumsum(q, 0) - q
    req = torch.repeat_interleave(torch.arange(B), q)
    kv_index = torch.arange(T) - starts[req] + (L - q)[req]  # [T]

    spec_mask = atten_mask = None
    if kwargs.get("spec_mask") is not None and kwargs.get("atten_mask") is not None:
        _fail(ErrorCode.INVALID_MASK, "spec_mask", "expected at most one of spec_mask and atten_mask, got both")
    if kwargs.get("spec_mask") is not None:
        spec_mask = _mask(kwargs["spec_mask"], "spec_mask", T, int(q.max()), device)
    if kwargs.get("atten_mask") is not None:
        atten_mask = _mask(kwargs["atten_mask"], "atten_mask", T, int(L.max()), device)

    pos = position_ids.cpu().to(torch.int64)
    if spec_mask is None and atten_mask is None:
        bad_pos = pos != kv_index
        expect = "position = cached tokens + index among the request's new tokens"
    else:  # trees place tokens by depth: within the request's new span
        bad_pos = (pos < (L - q)[req]) | (pos >= L[req])
        expect = "input_length - q_len <= position < input_length"
    if bool(bad_pos.any()):
        t = _first_bad(bad_pos)
        _fail(ErrorCode.POSITION_MISMATCH, "position_ids",
              f"expected {expect}; token {t} (request {int(req[t])}, input_length {int(L[req[t]])}, "
              f"q_len {int(q[req[t]])}) has position {int(pos[t])}")

    bt = block_tables.cpu().to(torch.int64)
    need = (L + block_size - 1) // block_size  # [B] blocks in use
    if bt.shape[1] < int(need.max()):
        r = int(torch.argmax(need))
        _fail(ErrorCode.BLOCK_TABLE_TOO_SHORT, "block_tables",
              f"expected at least {int(need[r])} columns for request {r} (input_length {int(L[r])}, "
              f"block_size {block_size}), got {bt.shape[1]}")
    used = torch.arange(bt.shape[1])[None, :] < need[:, None]  # [B, W]
    bad_block = used & ((bt < 0) | (bt >= num_blocks))
    if bool(bad_block.any()):
        f = _first_bad(bad_block)
        r, c = divmod(f, bt.shape[1])
        _fail(ErrorCode.BLOCK_OUT_OF_RANGE, "block_tables",
              f"expected block ids in [0, {num_blocks}), got {int(bt[r, c])} at [{r}, {c}]")
    rows = torch.arange(B)[:, None].expand_as(bt)[used]
    ids = bt[used]
    if torch.unique(rows * num_blocks + ids).numel() != ids.numel():
        _fail(ErrorCode.BLOCK_REPEATED, "block_tables", "expected each request's blocks to be distinct, got a block listed twice in one row")

    sl = slots.cpu().to(torch.int64)
    expected_slot = bt[req, kv_index // block_size] * block_size + kv_index % block_size
    bad_slot = (sl != -1) & (sl != expected_slot)
    if bool(bad_slot.any()):
        t = _first_bad(bad_slot)
        _fail(ErrorCode.SLOT_MISMATCH, "slots",
              f"expected -1 or the slot of the token's kv position (request {int(req[t])}, position "
              f"{int(kv_index[t])}: slot {int(expected_slot[t])}), got {int(sl[t])} at token {t}")
    readers = torch.bincount(ids, minlength=num_blocks)
    written = sl[sl >= 0] // block_size
    shared = readers[written] > 1
    if bool(shared.any()):
        blk = int(written[_first_bad(shared)])
        _fail(ErrorCode.SLOT_CONFLICT, "slots",
              f"expected writes only into blocks no other request of the batch reads, got a write into "
              f"block {blk}, which {int(readers[blk])} requests list (copy the block before writing)")

    lm = None
    if lm_head_indices is not None:
        lm = _int_tensor(lm_head_indices, "lm_head_indices", 1, device).cpu().to(torch.int64)
        if bool(((lm < 0) | (lm >= T)).any()):
            bad = _first_bad((lm < 0) | (lm >= T))
            _fail(ErrorCode.LM_HEAD_INDEX_OUT_OF_RANGE, "lm_head_indices",
                  f"expected indices in [0, num_tokens={T}), got {int(lm[bad])} at {bad}")

    adapter_ids = _adapter_ids(kwargs.get("adapter_ids"), B, loaded_adapters)
    max_out_len = kwargs.get("max_out_len", 256)
    max_out_len = _plain_int(max_out_len, "max_out_len")
    if max_out_len < 1:
        _fail(ErrorCode.INVALID_MAX_OUT_LEN, "max_out_len", f"expected a positive int, got {max_out_len}")

    prev = _prev_token_ids(kwargs.get("prev_token_ids"), T, vocab_size, device)
    hidden_layers = _hidden_layers(kwargs.get("output_hidden_states"), num_layers)

    return StepArgs(
        prev_token_ids=prev, hidden_layers=hidden_layers,
        input_ids=input_ids, input_ids_cpu=ids_h.to(torch.int64), token_req=req, token_kv_index=kv_index,
        positions=pos, slots=sl, is_prefill=is_prefill, block_size=block_size,
        q_lens=q.to(torch.int32), input_lengths=L.to(torch.int32), block_tables=bt.to(torch.int32),
        lm_head_indices=lm, spec_mask=spec_mask, atten_mask=atten_mask,
        adapter_ids=adapter_ids, max_out_len=max_out_len,
    )


def _q_lens(q_lens, is_prefill: bool, L: torch.Tensor, T: int, device) -> torch.Tensor:
    B = L.shape[0]
    if q_lens is None or (isinstance(q_lens, (list, tuple)) and len(q_lens) == 0):
        q = L.clone() if is_prefill else torch.ones(B, dtype=torch.int64)
        source = "default (input_lengths in prefill, 1 in decode)"
    else:
        if isinstance(q_lens, torch.Tensor):
            q = _int_tensor(q_lens, "q_lens", 1, device).cpu().to(torch.int64)
        elif isinstance(q_lens, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in q_lens):
            q = torch.tensor(list(q_lens), dtype=torch.int64)
        else:
            _fail(ErrorCode.INVALID_TYPE, "q_lens", "expected a list of ints or an integer tensor")
        source = "q_lens"
        if q.shape[0] != B:
            _fail(ErrorCode.INVALID_Q_LENS, "q_lens", f"expected {B} entries (batch), got {q.shape[0]}")
        if bool(((q < 1) | (q > L)).any()):
            r = _first_bad((q < 1) | (q > L))
            _fail(ErrorCode.INVALID_Q_LENS, "q_lens",
                  f"expected 1 <= q_len <= input_length ({int(L[r])}) for request {r}, got {int(q[r])}")
    if int(q.sum()) != T:
        _fail(ErrorCode.INVALID_Q_LENS, "q_lens",
              f"expected new tokens per request ({source}) to sum to num_tokens={T}, got {int(q.sum())}")
    return q


# adapters.ids' rule, raised under forward_tensor's codes
_ADAPTER_CODES = {
    AdapterIdsFault.TYPE: ErrorCode.INVALID_TYPE,
    AdapterIdsFault.TOO_LONG: ErrorCode.ADAPTER_IDS_TOO_LONG,
    AdapterIdsFault.LENGTH: ErrorCode.ADAPTER_IDS_LENGTH,
    AdapterIdsFault.NOT_LOADED: ErrorCode.ADAPTER_NOT_LOADED,
}


def _adapter_ids(adapter_ids, B: int, loaded: Sequence[str]) -> list[str | None] | None:
    """The step's one check of adapter_ids (adapters.ids.resolve_adapter_ids): -> per request, or None."""
    try:
        return resolve_adapter_ids(adapter_ids, B, loaded)
    except AdapterIdsError as e:
        _fail(_ADAPTER_CODES[e.fault], e.argument, e.detail)


def _prev_token_ids(value, T: int, vocab_size: int, device: torch.device):
    """prev_token_ids=(tokens, rows, index): the ids of rows `rows` of input_ids are the device
    tensor `tokens` at `index` (a previous step's sampled tokens, not yet copied to the host: an
    engine that schedules step N+1 before step N's tokens reach the host passes them here, and
    any in-range placeholder in input_ids at those rows). tokens stay on the device, so their
    values are not checked here (that would wait for the device); they are clamped into
    [0, vocab_size) on the device, so a bad id cannot read outside the embedding."""
    if value is None:
        return None
    arg = "prev_token_ids"
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        _fail(ErrorCode.INVALID_PREV_TOKEN_IDS, arg,
              f"expected a tuple (tokens, rows, index), got {type(value).__name__}"
              + (f" of length {len(value)}" if isinstance(value, (tuple, list)) else ""))
    tokens, rows, index = value
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.dtype.is_floating_point \
            or tokens.dtype == torch.bool:
        _fail(ErrorCode.INVALID_PREV_TOKEN_IDS, arg, f"expected tokens as a 1-D integer tensor, got "
              f"{type(tokens).__name__ if not isinstance(tokens, torch.Tensor) else f'{tokens.dtype} {_shape(tokens)}'}")
    if tokens.device != device and not (tokens.device.type == device.type == "cuda" and device.index is None):
        _fail(ErrorCode.INVALID_PREV_TOKEN_IDS, arg, f"expected tokens on the model's device {device}, got {tokens.device}")
    rows = _int_tensor(rows, arg + " rows", 1, device).cpu().to(torch.int64)
    index = _int_tensor(index, arg + " index", 1, device).cpu().to(torch.int64)
    if rows.shape != index.shape:
        _fail(ErrorCode.INVALID_PREV_TOKEN_IDS, arg, f"expected rows and index of one length, got {_shape(rows)} "
              f"and {_shape(index)}")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= T):
        _fail(ErrorCode.INVALID_PREV_TOKEN_IDS, arg, f"expected rows in [0, num_tokens={T}), got "
              f"{int(rows.min())}..{int(rows.max())}")
    if torch.unique(rows).numel() != rows.numel():
        _fail(ErrorCode.INVALID_PREV_TOKEN_IDS, arg, "expected distinct rows, got a repeated one")
    S = tokens.shape[0]
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= S):
        _fail(ErrorCode.INVALID_PREV_TOKEN_IDS, arg, f"expected index in [0, len(tokens)={S}), got "
              f"{int(index.min())}..{int(index.max())}")
    return tokens.to(torch.int64).clamp(0, vocab_size - 1), rows, index


def _hidden_layers(value, num_layers: int) -> tuple[int, ...] | None:
    """output_hidden_states=[i, ...]: distinct ints in [0, num_layers], numbered as transformers'
    output_hidden_states tuple (0 = embeddings, i = input of layer i, num_layers = final normed)."""
    if value is None:
        return None
    arg = "output_hidden_states"
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            _fail(ErrorCode.INVALID_HIDDEN_STATES, arg, f"expected a list of ints, got a {value.dtype} tensor of "
                  f"shape {_shape(value)}")
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value \
            or any(isinstance(i, bool) or not isinstance(i, int) for i in value):
        _fail(ErrorCode.INVALID_HIDDEN_STATES, arg, f"expected a non-empty list of ints, got {value!r}")
    bad = [i for i in value if not 0 <= i <= num_layers]
    if bad:
        _fail(ErrorCode.INVALID_HIDDEN_STATES, arg, f"expected indices in [0, num_layers={num_layers}], got {bad[0]}")
    if len(set(value)) != len(value):
        _fail(ErrorCode.INVALID_HIDDEN_STATES, arg, f"expected distinct indices, got {list(value)}")
    return tuple(int(i) for i in value)
