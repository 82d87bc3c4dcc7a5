"""LoraBatch: one step's adapter mapping, and the batched LoRA matmuls every projection calls.

Built once per step by LoraManager.make_batch from the per-request adapter list (host) and the
step's token layout; each projection's wrapper (adapters.lora_layers.LoraLinear) then brackets
y = x @ W^T with `pending = begin(layer, module, x)` before it and `y = finish(pending, y)` after
it (`apply(layer, module, x, y)` after it gives the same numbers, without the overlap below).
Tokens are grouped by adapter slot once, on the host, with no device sync:

    requests:   r0 (slot 2, 3 tokens)  r1 (base, 2)  r2 (slot 0, 1)  r3 (slot 2, 2)
    token_slot: [2 2 2 -1 -1 0 2 2]                        per token, -1 = base (skipped)
    perm:       [5 | 0 1 2 6 7]                            LoRA tokens, grouped by slot
    segments:   slot 0 -> perm[0:1], slot 2 -> perm[1:6]   seg_indptr [0 1 6], seg_slots [0 2]

For each segment, y[perm[seg], rows of sub-module] += (x[perm[seg]] @ A_slot^T) @ B_slot^T, with
the scaling already folded into B. Three kernels compute it: "torch" (any device; a loop over the
step's distinct adapters, each at its own rank), "flashinfer" (CUDA, bf16/fp16; FlashInfer's
segment GEMM over the slot stacks at max_rank, where the zero padding adds exactly nothing) and
"triton" (CUDA; adapters.triton_kernels: one shrink and one expand launch per fused module that
read only token_slot on the device, so a CUDA graph can replay them with new slots: see
LoraManager.make_graph_batch). With the triton kernel and a manager that overlaps (CUDA, the
default), begin launches the shrink on the manager's side stream, where it runs while the base
GEMM runs, and finish joins it and launches the expand (adapters.side_stream); the other
kernels run all their work in finish. In a graph batch of a manager that folded its A stacks
into the base weights (LoraManager.fold_into), the wrapper calls project_folded instead: one GEMM
gives the base output and the shrink, no shrink kernel, no side stream.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from adapters.lora_manager import LoraManager


class LoraDelta(NamedTuple):
    """A projection's LoRA delta that the kernel consuming y adds (LoraBatch.finish_deferred; the
    fused kernels of model_wrapper/kernels/lora_epilogues.py): for token t with slot >= 0 and sub-module i,
    y[t, off_i + n] += round(sum_p s[p, t, i*R + r]) @ B_i[slot, n, :rank_i].

    s:          [splits, T, n_sub * rank] float32: the shrink's partial sums, complete on the current stream;
                or, with slot_stride > 0, [1, T, num_slots * slot_stride] in the model dtype: a folded
                GEMM's extra columns, every slot's shrink of every token (token t's at slot_t * slot_stride)
    b:          (B_i [num_slots, out_i, rank], ...): one layer's stacks
    token_slot: [T] int32, device: slot per token, -1 = none
    ranks:      [num_slots, n_sub] int32, device: true ranks
    rank:       the stacks' padded rank R
    offsets:    [n_sub + 1] column offsets of the sub-modules in y
    slot_stride: 0, or the columns per slot in s (n_sub * rank) when s holds every slot's shrink
    groups:     [num_slots + 1, >= T + 1] int32, device: the tokens grouped by slot (lora_groups), for
                the slot-major consumers (SiLU-and-mul); None where the batch has none
    """

    s: torch.Tensor
    b: tuple
    token_slot: torch.Tensor
    ranks: torch.Tensor
    rank: int
    offsets: tuple
    slot_stride: int = 0
    groups: torch.Tensor | None = None


def lora_groups(token_slot: torch.Tensor, num_slots: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Host: a step's tokens grouped by adapter slot, as the slot-major fused kernels read them.

    token_slot: [T] int CPU tensor, slot per token, -1 = no adapter (base model, padding rows)
    out:        [num_slots + 1, >= T + 1] int32 (a graph runner's pinned staging buffer), or None
    returns     out: row g < num_slots holds slot g's tokens, row num_slots those without an
                adapter, each as [count, token, token, ...] in token order; later entries unset
    """
    T = token_slot.shape[0]
    if out is None:
        out = torch.empty(num_slots + 1, T + 1, dtype=torch.int32)
    key = torch.where(token_slot < 0, num_slots, token_slot.to(torch.int64))
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=num_slots + 1)
    first = torch.cumsum(counts, 0) - counts
    k = key[order]
    out[:, 0] = counts
    out[k, 1 + torch.arange(T) - first[k]] = order.to(torch.int32)
    return out


class LoraPending(NamedTuple):
    """One projection's LoRA delta as LoraBatch.begin left it, for LoraBatch.finish.

    layer, module: where (module: "qkv", "o", "gate_up" or "down")
    x:             [T, in_features]: the projection's input
    s:             [splits, T, n_sub * R] float32: the shrink's partial sums, forked onto the
                   manager's side stream (triton, overlapping); None = nothing launched yet
    """

    layer: int
    module: str
    x: torch.Tensor
    s: torch.Tensor | None = None


@dataclass
class LoraBatch:
    """One step's mapping; valid until the manager's next make_batch (it may reuse the buffers).

    token_slot:     [T] int32, device: adapter slot of each token, -1 = base model; in a graph
                    batch the runner's static buffer ([max tokens], read as [:T], rewritten before
                    each replay)
    perm:           [N] int64, device: the N tokens that use an adapter, grouped by slot (None in a graph batch)
    seg_indptr:     [S+1] int64, device: segment s is perm[seg_indptr[s]:seg_indptr[s+1]] (not for "triton")
    seg_slots:      [S] int64, device: the slot of each segment, ascending (not for "triton")
    slot_indptr:    [max_loras+1] int32, device: slot s's tokens are perm[slot_indptr[s]:slot_indptr[s+1]]
                    ("triton" only, None in a graph batch)
    segments:       host (slot, start, end) per segment, the same numbers for the torch loop;
                    None = not known on the host (a graph batch): apply() always launches
    identity:       perm is arange(T) (every token uses an adapter, already grouped): no gather
    groups:         [max_loras + 1, >= T + 1] int32, device: a graph batch's tokens grouped by slot
                    (lora_groups; the runner's static buffer, rewritten with token_slot), for the
                    slot-major SiLU-and-mul that adds the gate_up delta; None = not kept (the
                    gate_up delta is then added by an expand kernel of its own)
    kernel:         "torch", "flashinfer" or "triton"
    manager:        the LoraManager whose slot tensors hold the weights
    """

    token_slot: torch.Tensor
    perm: torch.Tensor | None
    seg_indptr: torch.Tensor | None
    seg_slots: torch.Tensor | None
    segments: list[tuple[int, int, int]] | None
    identity: bool
    kernel: str
    manager: "LoraManager"
    slot_indptr: torch.Tensor | None = None
    groups: torch.Tensor | None = None

    @property
    def num_lora_tokens(self) -> int | None:
        """Tokens that use an adapter (None in a graph batch: only the device knows)."""
        if self.segments is None:
            return None
        return self.segments[-1][2] if self.segments else 0

    def apply(self, layer: int, module: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Add the LoRA deltas of `module` ("qkv", "o", "gate_up", "down") in `layer` to y in place.

        x: [T, in_features]; y: [T, out_features] (fused rows, e.g. [q | k | v]); returns y.
        All on the current stream (triton: the shrink, then the expand as its dependent launch).
        """
        if self._empty:
            return y
        if self.kernel == "triton":
            return self._apply_triton(layer, module, x, y)
        if self.kernel == "flashinfer":
            return self._apply_segment_gemm(layer, module, x, y)
        return self._apply_torch(layer, module, x, y)

    def begin(self, layer: int, module: str, x: torch.Tensor) -> LoraPending:
        """Start the LoRA delta of `module` in `layer` before the base projection of x runs.

        x: [T, in_features], the projection's input, complete on the current stream. Triton on an
        overlapping manager: allocates s on the current stream (which reads it in finish), then
        launches the shrink on the side stream after everything the current stream has enqueued
        so far. Otherwise launches nothing. Every begin must be followed by its finish (under a
        CUDA graph capture, before the capture ends: finish joins the side stream back).
        """
        side = self.manager.side
        if side is None or self.kernel != "triton" or self._empty:
            return LoraPending(layer, module, x)
        from adapters.triton_kernels import lora_shrink, lora_shrink_out

        m = self.manager
        a, _, ranks, _ = m.layer_weights(layer, module)
        segments = self._triton_segments
        s = lora_shrink_out(x, a, segments)
        with side.fork():
            lora_shrink(x, a, self.token_slot[: x.shape[0]], ranks, m.max_rank, segments, out=s, pdl=False)
        return LoraPending(layer, module, x, s)

    def finish(self, pending: LoraPending, y: torch.Tensor) -> torch.Tensor:
        """Add begin's delta to y = the base projection of pending.x, in place; returns y.

        y: [T, out_features] (fused rows). Triton after a forked shrink: the current stream waits
        for the side stream, then the expand runs (a plain launch: the kernel before it in this
        stream is the GEMM, not the shrink). Otherwise: apply().
        """
        if pending.s is None:
            return self.apply(pending.layer, pending.module, pending.x, y)
        from adapters.triton_kernels import lora_expand_add

        m = self.manager
        _, b, ranks, offsets = m.layer_weights(pending.layer, pending.module)
        m.side.join()
        return lora_expand_add(pending.s, b, self.token_slot[: y.shape[0]], ranks, m.max_rank, y, offsets,
                               self._triton_segments, pdl=False)

    def finish_deferred(self, pending: LoraPending, y: torch.Tensor) -> LoraDelta | None:
        """finish(), but on a graph batch of the triton kernel (no host grouping) with the manager's
        fuse_expand on (for this module), the expand is left to y's consumer: the shrink is complete on the current
        stream on return (the side stream joined, or the shrink run here) and its LoraDelta comes
        back; y is untouched. Otherwise the delta is added to y here and None comes back."""
        m = self.manager
        if self.kernel != "triton" or self.segments is not None or not self._defers(pending.module):
            self.finish(pending, y)
            return None
        from adapters.triton_kernels import lora_shrink

        a, b, ranks, offsets = m.layer_weights(pending.layer, pending.module)
        slots = self.token_slot[: y.shape[0]]
        if pending.s is None:
            s = lora_shrink(pending.x, a, slots, ranks, m.max_rank, None, pdl=False)
        else:
            m.side.join()
            s = pending.s
        return LoraDelta(s, b, slots, ranks, m.max_rank, offsets, groups=self.groups)

    def _defers(self, module: str) -> bool:
        """Whether the consumer kernel of `module`'s output adds its delta (the manager's
        fuse_modules; the slot-major consumers of gate_up, o and down also need the runner's token
        groups)."""
        return module in self.manager.fuse_modules and (module == "qkv" or self.groups is not None)

    @property
    def defers_norms(self) -> bool:
        """Whether a model may leave the o and down deltas to its residual-add + RMSNorm kernels
        (model_wrapper/kernels/lora_epilogues.add_lora_rms_norm): a graph batch of the triton kernel with
        the runner's token groups whose manager defers all four fused modules."""
        return (self.kernel == "triton" and self.segments is None and self.groups is not None
                and self.manager.fuse_modules >= {"qkv", "o", "gate_up", "down"})

    def folds(self, layer: int, module: str) -> bool:
        """Whether project_folded runs this projection: a graph batch (no host grouping) of a
        manager whose A stacks are folded into the base weights (LoraManager.fold_into)."""
        return self.segments is None and (layer, module) in self.manager.folded

    def project_folded(self, layer: int, module: str, x: torch.Tensor, defer: bool = False):
        """The base projection of x and its LoRA delta through the folded weight (folds() true).

        One GEMM x @ W_ext^T + b_ext -> [y | s] (s: every slot's shrink of every token), then the
        expand of each token's own slot from s: added to y here (a plain kernel right after the
        GEMM), or with defer and the module in the manager's fuse_modules handed back as a
        LoraDelta for y's consumer (y untouched). -> (y [T, N], LoraDelta or None); y is a view
        with row stride N + E (rows contiguous), as every consumer of it accepts.
        """
        from adapters.triton_kernels import lora_expand_add

        m = self.manager
        w, bias, N = m.folded[(layer, module)]
        y_ext = F.linear(x, w, bias)
        _, b, ranks, offsets = m.layer_weights(layer, module)
        cols = len(b) * m.max_rank  # per slot
        y, s = y_ext[:, :N], y_ext[:, N:N + m.max_loras * cols].unsqueeze(0)
        slots = self.token_slot[: x.shape[0]]
        if defer and self._defers(module):
            return y, LoraDelta(s, b, slots, ranks, m.max_rank, offsets, cols, self.groups)
        lora_expand_add(s, b, slots, ranks, m.max_rank, y, offsets, None, pdl=True, slot_stride=cols)
        return y, None

    @property
    def _empty(self) -> bool:
        """No token of the step uses an adapter (known on the host; never for a graph batch)."""
        return self.segments is not None and not self.segments

    def _apply_triton(self, layer, module, x, y):
        from adapters.triton_kernels import lora_expand_add, lora_shrink

        m = self.manager
        a, b, ranks, offsets = m.layer_weights(layer, module)
        slots = self.token_slot[: x.shape[0]]
        s = lora_shrink(x, a, slots, ranks, m.max_rank, self._triton_segments)
        return lora_expand_add(s, b, slots, ranks, m.max_rank, y, offsets, self._triton_segments)

    @functools.cached_property
    def _triton_segments(self):
        """The host's grouping for the triton kernels; None in a graph batch (they scan token_slot)."""
        from adapters.triton_kernels import LoraSegments

        if self.segments is None:
            return None
        return LoraSegments(self.perm, self.slot_indptr, max(end - start for _, start, end in self.segments))

    def _apply_torch(self, layer, module, x, y):
        m = self.manager
        R = m.max_rank
        a_stack, b_stacks = m.lora_a[module][layer], m.lora_b[module]
        offsets = m.shapes.out_offsets(module)
        xs = x if self.identity else x.index_select(0, self.perm)
        for slot, start, end in self.segments:
            targets = m.targets(slot, layer, module)
            if not targets:
                continue
            x_seg = xs[start:end]
            for sub, r in targets:  # each at its own rank: no work on the zero padding
                h = x_seg @ a_stack[slot, sub * R: sub * R + r].T  # [n, r]
                delta = h @ b_stacks[sub][layer, slot, :, :r].T  # [n, out_sub]
                rows = y[:, offsets[sub]: offsets[sub + 1]]
                if self.identity:
                    rows[start:end] += delta
                else:
                    rows.index_add_(0, self.perm[start:end], delta)
        return y

    def _apply_segment_gemm(self, layer, module, x, y):
        m = self.manager
        R = m.max_rank
        gemm = m.segment_gemm()
        xs = (x if self.identity else x.index_select(0, self.perm)).contiguous()
        S = len(self.segments)
        kw = dict(weight_column_major=True, seg_indptr=self.seg_indptr, weight_indices=self.seg_slots)
        # shrink all sub-modules at once: A is [max_loras, n_sub * R, in] -> h [N, n_sub * R]
        h = gemm.run(xs, m.lora_a[module][layer], S, **kw)
        offsets = m.shapes.out_offsets(module)
        for sub, b_stack in enumerate(m.lora_b[module]):
            delta = gemm.run(h[:, sub * R: (sub + 1) * R].contiguous(), b_stack[layer], S, **kw)
            rows = y[:, offsets[sub]: offsets[sub + 1]]
            if self.identity:
                rows += delta
            else:
                rows.index_add_(0, self.perm, delta)
        return y
