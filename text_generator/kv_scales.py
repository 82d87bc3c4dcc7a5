"""Per-layer K/V scales of FP8 (e4m3) KV caches: checking them, and calibrating them on prompts.

An FP8 cache stores round(x / scale) in e4m3 (at most 448 in magnitude) and attention reads
e4m3 * scale (model_wrapper/attention/kv_store.py). The scales live on the model
(ModelWrapper.kv_scales, [2, num_layers] float32: K row, V row), come from the checkpoint where it
has them, are 1.0 otherwise, or are measured here:

    calibrate: each prompt runs as one prefill through forward_tensor into a cache of the model's
               own dtype; the cache then holds exactly the K (after RoPE) and V of every prompt
               token, so per layer   k_scale = max |K| / 448,   v_scale = max |V| / 448
               over all prompts (1.0 for a layer whose K or V is all zero). Under tensor
               parallelism the maxima are taken over the ranks too, so every rank has one scale.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from text_generator.errors import ErrorCode, ForwardArgumentError

FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def check_kv_scales(k_scales, v_scales, num_layers: int) -> tuple[list[float], list[float]]:
    """-> the scales as two lists of num_layers floats; ForwardArgumentError(INVALID_KV_SCALES)
    naming k_scales / v_scales unless each is num_layers positive finite numbers."""
    out = []
    for name, s in (("k_scales", k_scales), ("v_scales", v_scales)):
        try:
            values = [float(x) for x in (s.flatten().tolist() if isinstance(s, torch.Tensor) else s)]
        except (TypeError, ValueError):
            raise ForwardArgumentError(ErrorCode.INVALID_KV_SCALES, name,
                                       f"expected {num_layers} positive finite floats, got {s!r}") from None
        if len(values) != num_layers or not all(math.isfinite(x) and x > 0 for x in values):
            raise ForwardArgumentError(ErrorCode.INVALID_KV_SCALES, name,
                                       f"expected {num_layers} positive finite floats, got {values}")
        out.append(values)
    return out[0], out[1]


def calibrate_kv_scales(generator, input_ids_list: Sequence, *, block_size: int = 16) -> torch.Tensor:
    """Measure the K/V scales on prompts (token id lists or 1-D int tensors, each at least one token
    and at most the model's length) and -> [2, num_layers] float32 (CPU): K row, V row. The caller
    sets them (TextGenerator.calibrate_kv_scales does)."""
    cfg = generator.config
    if isinstance(input_ids_list, torch.Tensor) or not isinstance(input_ids_list, (list, tuple)) \
            or len(input_ids_list) == 0:
        raise ForwardArgumentError(ErrorCode.INVALID_TYPE, "input_ids_list",
                                   f"expected a non-empty list of prompts (token id lists or 1-D int tensors), "
                                   f"got {type(input_ids_list).__name__}")
    prompts = []
    for i, ids in enumerate(input_ids_list):
        ids = torch.as_tensor(ids).flatten().cpu()
        if ids.numel() < 1 or ids.numel() > cfg.max_position_embeddings or ids.dtype.is_floating_point \
                or ids.dtype == torch.bool:
            raise ForwardArgumentError(ErrorCode.INVALID_LENGTH, f"input_ids_list[{i}]",
                                       f"expected 1 to {cfg.max_position_embeddings} integer token ids, "
                                       f"got {ids.numel()} of {ids.dtype}")
        prompts.append(ids.to(torch.int64))
    longest = max(p.numel() for p in prompts)
    blocks = -(-longest // block_size)
    kv_cache = generator.allocate_kv_cache(blocks, block_size, dtype=generator.dtype)
    amax = torch.zeros(2, cfg.num_layers, dtype=torch.float32, device=generator.device)
    table = torch.arange(blocks, dtype=torch.int32)[None]
    for ids in prompts:
        n = ids.numel()
        for k, v in kv_cache:  # a fresh cache per prompt: only this prompt's K/V are in it
            k.zero_()
            v.zero_()
        generator.forward_tensor(ids, torch.arange(n), True, kv_cache, table, torch.arange(n),
                                 torch.tensor([n], dtype=torch.int32), n, lm_head_indices=torch.tensor([n - 1]))
        for layer, (k, v) in enumerate(kv_cache):
            amax[0, layer] = torch.maximum(amax[0, layer], k.abs().amax().float())
            amax[1, layer] = torch.maximum(amax[1, layer], v.abs().amax().float())
    tp = generator.tp_group
    if tp.enabled:
        import torch.distributed as dist

        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=tp.group)
    scales = amax / FP8_MAX
    return torch.where(scales > 0, scales, torch.ones_like(scales)).cpu()
