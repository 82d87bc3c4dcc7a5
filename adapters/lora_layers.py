"""LoRA as a wrapper of a linear: the model's projections with the step's adapter deltas added.

Where it comes from: ModelWrapper.enable_lora replaces each decoder layer's `<name>_proj` linear
(name "qkv", "o", "gate_up" or "down": adapters.shapes.FUSED_MODULES) with LoraLinear(base, layer,
name). This package never imports model_wrapper: the base is duck-typed, with the call of
model_wrapper/layers/linear.py:

    base(x, batch, kernels, fuse_tail) -> (y, None)   the whole projection
    base.project(x, kernels) -> y                     this rank's product (row-parallel: partial sums)
    base.reduce(y) -> y                               the TP all-reduce and bias, or y itself
    base.reduces                                      whether reduce() does anything
    base.silu(x, batch, kernels)                      gate_up only: silu(gate) * up
    base.weight, base.bias

Where the step's adapters come from: the ForwardBatch's LoRA part, batch.lora (a LoraStep, made by
the generator from adapter_ids; its LoraBatch made before an eager forward, or by a CUDA-graph
runner once per captured graph). No LoRA part (a step without adapters, or LoRA never enabled):
the base projection, exactly.

What the wrapper owns, per projection (LoraBatch does the arithmetic):

    folded (decode graphs; LoraManager.fold_into)  one GEMM gives y and every slot's shrink, then the expand
    otherwise                                      begin (shrink, on the side stream) | base GEMM | finish (expand)
    row-parallel under TP                          the partial delta joins the partial sums before the all-reduce
    fuse_tail and the batch defers                 the expand is handed back as the tail (a LoraDelta) that the
                                                   consumer kernel adds: RoPE + store after qkv; the residual
                                                   add + RMSNorm after o / down (only where the batch defers all
                                                   four modules: that norm leaves its division, a RowScale, to
                                                   the kernels after the next GEMMs, which need the qkv and
                                                   gate_up deltas deferred too)
    gate_up's silu(x, scale)                       the GEMM, then SiLU-and-mul adding the deferred delta (and
                                                   dividing by the RowScale of the norm before, with scale)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from adapters.lora_batch import LoraBatch
from adapters.shapes import FUSED_MODULES

if TYPE_CHECKING:
    from adapters.lora_manager import LoraManager

# projections whose output the decoder feeds to a residual add + RMSNorm (a tail there leaves a RowScale)
NORM_FED = frozenset({"o", "down"})


@dataclass
class LoraStep:
    """The ForwardBatch's LoRA part: which adapters a step runs, and their per-token mapping.

    adapter_ids: per request (validated; length 1 = the whole batch; None / "base" = the base
                 model), or None for a CUDA-graph runner's static batch (it maps the ids itself)
    manager:     the LoraManager holding the adapters
    mapping:     the LoraBatch the projections read; None until prepare() (host work a decode
                 graph replay does not need)
    """

    adapter_ids: list | None
    manager: "LoraManager"
    mapping: LoraBatch | None = None

    def prepare(self, batch) -> None:
        """Make the mapping for `batch` (the step's ForwardBatch), once, before an eager forward."""
        if self.mapping is None:
            self.mapping = self.manager.make_batch(self.adapter_ids, batch)


class LoraLinear(nn.Module):
    """A base projection of one layer and the LoRA deltas of whatever adapters the step names.

    Owns no weights (the manager's slot stacks hold A and B); base keeps its parameters, so
    base.weight / base.bias stay what the loader filled (or, once folded, views of W_ext).
    """

    def __init__(self, base: nn.Module, layer: int, module: str):
        super().__init__()
        if module not in FUSED_MODULES:
            raise ValueError(f"LoraLinear(module): expected one of {sorted(FUSED_MODULES)}, got {module!r}")
        self.base, self.layer, self.module = base, layer, module
        self.norm_fed = module in NORM_FED

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def forward(self, x: torch.Tensor, batch, kernels, fuse_tail: bool = False):
        """x [T, in] -> (y [T, out], the tail for y's consumer or None): the base projection plus the
        delta of each token's adapter, added here or (fuse_tail, where the batch defers) left to the
        caller's next kernel."""
        lora = _mapping(batch)
        if lora is None:
            return self.base(x, batch, kernels)
        if self.base.reduces:  # row-parallel: the partial delta joins the partial sums (LoRA is linear in x)
            pending = lora.begin(self.layer, self.module, x)
            y = lora.finish(pending, self.base.project(x, kernels))
            return self.base.reduce(y), None
        return self._project(lora, x, kernels, fuse_tail and (not self.norm_fed or lora.defers_norms))

    def silu(self, x: torch.Tensor, batch, kernels, scale=None) -> torch.Tensor:
        """gate_up: x [T, in] -> silu(gate) * up [T, out // 2] with the delta added (by SiLU-and-mul
        where the kernels take it). scale: x is the rows of a norm that took a tail, undivided; the
        RowScale divides them (needs the delta deferred)."""
        lora = _mapping(batch)
        if lora is None and scale is None:  # the base's fused gate_up + SiLU-and-mul
            return self.base.silu(x, batch, kernels)
        if lora is None:
            gate_up, tail = self.base(x, batch, kernels)
        else:
            gate_up, tail = self._project(lora, x, kernels, kernels.fuses_lora)
        if scale is not None and tail is None:
            raise RuntimeError("a RowScale needs a deferred gate_up delta")
        return kernels.silu_mul(gate_up, lora=tail, scale=scale)

    def _project(self, lora: LoraBatch, x: torch.Tensor, kernels, defer: bool):
        """-> (y, None), or with defer possibly (y, LoraDelta) where the batch leaves the expand to
        y's consumer. The shrink is begun before the base GEMM, so that it may overlap it."""
        if lora.folds(self.layer, self.module):  # the shrink rides in the GEMM's extra rows
            return lora.project_folded(self.layer, self.module, x, defer)
        pending = lora.begin(self.layer, self.module, x)
        y = self.base.project(x, kernels)
        if defer:
            return y, lora.finish_deferred(pending, y)
        return lora.finish(pending, y), None

    def extra_repr(self) -> str:
        return f"layer={self.layer}, module={self.module!r}"


def _mapping(batch) -> LoraBatch | None:
    step = batch.lora
    if step is None:
        return None
    if step.mapping is None:
        raise RuntimeError("batch.lora has no mapping: call ForwardBatch.ensure_lora() before the forward")
    return step.mapping
