"""Folding the LoRA A stacks into the base weights (LoraManager.fold_into; kernel "triton", decode
graph batches): each layer's A stack moves into extra rows below the base weight, so one GEMM
gives the base output and every slot's shrink at once:

    W_ext [N + E, in] = [ W (the model's weight: linear.weight is now the view W_ext[:N]) ]
                        [ A of slot 0 | slot 1 | ... (lora_a[m][layer] is the view of these rows) ]
                        [ zero rows padding E to a multiple of 8 (aligned output rows) ]
    x @ W_ext^T  ->  [ y | s ]    s[t, slot * n_sub * R + i * R + r]: every slot's shrink of token t

The expand reads token t's own slot's columns of s. This replaces the shrink kernel and the side
stream's fork / join (measured on an H100 at about 4.5% of a decode step on their own) with
extra GEMM rows: every slot's A is read each step, used or not, hence only where max_loras *
max_rank is small (fold="auto": <= FOLD_MAX_SLOT_RANK). Eager steps keep the shrink kernel
(over the same A rows); the model's own forward reads only W_ext[:N].
"""

from __future__ import annotations

import torch

from adapters.errors import LoraError, LoraErrorCode
from adapters.shapes import FUSED_MODULES, LoraShapes

# fold="auto" folds the A stacks into the base GEMMs (fold_into) when max_loras * max_rank is at
# most this: 16 slots of rank 16 add 2.6% to the bytes of a Llama-3-8B decode step at batch 32 and
# 2k context, which the fold must read even when only one adapter runs
FOLD_MAX_SLOT_RANK = 256
FOLD_ROW_ALIGN = 8  # W_ext rows padded to a multiple of this: 16-byte aligned rows of [y | s]

Folded = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor | None, int]]


def check_linears(linears, shapes: LoraShapes, device: torch.device, dtype: torch.dtype, arg: str) -> None:
    """linears: {(layer, fused module): nn.Linear} with a `dtype` weight [N, in] on `device` for
    every layer and module of FUSED_MODULES, or INVALID_ARGUMENT naming the first that is not."""
    for m in FUSED_MODULES:
        want = (sum(shapes.out_features(m)), shapes.in_features(m))
        for layer in range(shapes.num_layers):
            lin = linears.get((layer, m)) if hasattr(linears, "get") else None
            w = getattr(lin, "weight", None)
            if not isinstance(w, torch.Tensor) or tuple(w.shape) != want or w.dtype != dtype \
                    or w.device.type != device.type or device.index not in (None, w.device.index):
                got = (f"{w.dtype} {list(w.shape)} on {w.device}" if isinstance(w, torch.Tensor)
                       else type(lin).__name__)
                raise LoraError(LoraErrorCode.INVALID_ARGUMENT, f"{arg}[{(layer, m)}]",
                                f"expected a Linear with a {dtype} weight {list(want)} on {device}, got {got}")


def fold_a_stacks(linears, lora_a: dict[str, torch.Tensor], shapes: LoraShapes, max_loras: int, max_rank: int,
                  device: torch.device, dtype: torch.dtype, folded: Folded) -> dict[str, list[torch.Tensor]]:
    """Build W_ext (and bias_ext) of every (layer, fused module) from linears (checked by
    check_linears) and the A stacks lora_a[m] [num_layers, max_loras, n_sub * R, in]; point each
    linear's weight / bias at the first N rows; enter each into folded as it is made:
    (layer, m) -> (W_ext [N + E, in], bias_ext [N + E] or None, N).
    -> {m: per layer, the view [max_loras, n_sub * R, in] of W_ext's A rows}."""
    S, R = max_loras, max_rank
    views: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():
        for m, subs in FUSED_MODULES.items():
            rows = len(subs) * R
            N, K = sum(shapes.out_features(m)), shapes.in_features(m)
            E = -(-(N + S * rows) // FOLD_ROW_ALIGN) * FOLD_ROW_ALIGN - N
            views[m] = []
            for layer in range(shapes.num_layers):
                lin = linears[(layer, m)]
                w = torch.zeros(N + E, K, device=device, dtype=dtype)
                w[:N].copy_(lin.weight)
                w[N:N + S * rows].copy_(lora_a[m][layer].reshape(S * rows, K))
                lin.weight.data = w[:N]
                b = None
                if lin.bias is not None:
                    b = torch.zeros(N + E, device=device, dtype=lin.bias.dtype)
                    b[:N].copy_(lin.bias)
                    lin.bias.data = b[:N]
                folded[(layer, m)] = (w, b, N)
                views[m].append(w[N:N + S * rows].view(S, rows, K))
                if device.type == "cuda":  # hand the old weight's block back: W_ext is larger,
                    torch.cuda.empty_cache()  # so the cache could not reuse it (peak: one W more)
    return views
