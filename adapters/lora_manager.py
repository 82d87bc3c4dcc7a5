"""LoraManager: the adapter slots on the model's device, and the per-step mapping into them.

Data flow: a PEFT folder -> read_peft_adapter (host, validated, scaling folded into B) -> copied
into a free slot of the preallocated stacks here (load_adapter). Each step, the generator calls
make_batch(adapter_ids, forward_batch) once (through the ForwardBatch's LoRA part,
adapters.lora_layers.LoraStep); the LoraBatch it returns is what the LoraLinear wrappers of the
model's projections call (LoraBatch.begin / finish).

Slot stacks, per fused module (see adapters.shapes), R = max_rank, all zeros at construction:

    lora_a[m]      [num_layers, max_loras, n_sub * R, in_features]   sub-module i in rows i*R ..
                   (once folded: a list of num_layers views [max_loras, n_sub * R, in_features])
    lora_b[m][i]   [num_layers, max_loras, out_features_i, R]        one stack per sub-module
    lora_rank[m]   [num_layers, max_loras, n_sub] int32              true rank per sub-module, 0 = none

An adapter of rank r < R (per module) fills rows / columns 0..r-1 and leaves zeros after them, so
adapters of different ranks share one stack and the padded product is exact; a module the
adapter does not target stays all zeros (the torch kernel skips it, the triton kernel masks it
out through lora_rank).

CUDA graphs (kernel "triton" only): a runner owns a static [max tokens] int32 buffer, gets a
LoraBatch reading it from make_graph_batch(buffer) once (at capture), and before each replay
writes slots_for(adapter_ids) (-1 for padding rows) into it; optionally also a [max_loras + 1,
max tokens + 1] buffer of the tokens grouped by slot (groups_for), which the slot-major
consumers (SiLU-and-mul, the residual add + RMSNorm) read. Loading or unloading adapters between
replays is seen by the graph: the stacks are written in place, never reallocated.

Overlap (kernel "triton" on CUDA, on unless overlap=False): the manager owns one side stream
(adapters.side_stream) on which each projection's shrink runs while its base GEMM runs, eagerly
and, unless folded, inside the graphs (LoraBatch.begin / finish).

Folding (fold_into; kernel "triton", decode graph batches): each layer's A stack moves into extra
rows below the base weight, so one GEMM gives the base output and every slot's shrink at once
(adapters/lora_fold.py).
"""

from __future__ import annotations

from typing import Sequence

import torch

from adapters.errors import LoraError, LoraErrorCode, LoraStateError
from adapters.lora_batch import LoraBatch, lora_groups
from adapters.lora_fold import FOLD_MAX_SLOT_RANK, check_linears, fold_a_stacks
from adapters.peft_adapter import PeftAdapter, read_peft_adapter
from adapters.shapes import FUSED_MODULES, PEFT_MODULES, LoraShapes
from adapters.side_stream import SideStream
from kv_manager.kv_cache import free_memory_bytes

KERNELS = ("auto", "torch", "flashinfer", "triton")
# Graph batches: the qkv expand runs inside the RoPE + K/V-store kernel and the gate_up expand inside
# SiLU-and-mul (model_wrapper/kernels/lora_epilogues.py), one launch fewer per projection. RoPE + store
# goes token by token, so tokens sharing an adapter each read its B: measured on an H100 (batch 32,
# 16 adapters) a gain at rank 16 (replay +13.0% -> +11.0% over the base model) but a loss at rank 64
# with one shared adapter (+16.9% -> +26.4%); hence only up to max_rank 16. SiLU-and-mul goes slot
# by slot over the runner's token groups instead (each B read once; rank 16, 1 / 4 / 16 adapters:
# +11.4 / +11.5 / +12.6% -> +10.7 / +10.2 / +11.3%). The o / down deltas go into the residual add +
# RMSNorm, slot by slot and column-parallel, the norm's division left to RoPE + store / SiLU-and-mul
# after the next GEMM (model_wrapper/kernels/lora_epilogues.add_lora_rms_norm; one program per token
# streaming B measured a loss): same-run A/B, 1 / 4 / 16 adapters, +10.9 / +10.4 / +11.5% ->
# +10.7 / +9.3 / +10.5%. Without the runner's groups (or a model that cannot take the division
# later) o / down keep their expand kernels.
FUSE_MODULES = ("qkv", "o", "gate_up", "down")
FUSE_MAX_RANK = 16
FOLDS = ("auto", True, False)
SEGMENT_GEMM_WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended size


class LoraManager:
    """Owns max_loras adapter slots (weights on `device` in `dtype`) and the name -> slot table.

    Invariants: a slot holds at most one adapter; its stack entries are exactly that adapter's
    (scaled) weights padded with zeros; loading copies into a free slot and never reallocates, so
    it is safe between steps while other requests keep running. The name "base" is reserved for
    the model itself. Optional `max_num_tokens` preallocates the per-step mapping buffers (for
    CUDA graphs); a step with more tokens is then refused. `overlap` (kernel "triton" on CUDA
    only; ignored elsewhere): run the shrinks on a side stream, concurrently with the base GEMMs;
    False keeps all LoRA work on the current stream (for A/B timings). `fuse_expand` (kernel
    "triton", decode graph batches, max_rank <= FUSE_MAX_RANK): the qkv, gate_up (and, with a
    runner's token groups, o and down) expands run inside the kernels that consume those
    projections (LoraBatch.finish_deferred); False runs them as expand kernels of their own (for
    A/B timings). `fold` ("auto", True, False; kernel "triton" only): whether fold_into moves the
    A stacks into the base weights ("auto": where max_loras * max_rank <= FOLD_MAX_SLOT_RANK and
    the device is CUDA).
    """

    def __init__(self, *, num_layers: int, hidden_size: int, q_size: int, kv_size: int,
                 intermediate_size: int, max_loras: int = 8, max_rank: int = 64,
                 device: torch.device | str, dtype: torch.dtype, max_num_tokens: int | None = None,
                 kernel: str = "auto", overlap: bool = True, fuse_expand: bool = True, fold: bool | str = "auto"):
        for arg, value in dict(num_layers=num_layers, hidden_size=hidden_size, q_size=q_size, kv_size=kv_size,
                               intermediate_size=intermediate_size, max_loras=max_loras,
                               max_rank=max_rank).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LoraError(LoraErrorCode.INVALID_ARGUMENT, arg, f"expected a positive int, got {value!r}")
        if max_num_tokens is not None and (not isinstance(max_num_tokens, int) or max_num_tokens < 1):
            raise LoraError(LoraErrorCode.INVALID_ARGUMENT, "max_num_tokens",
                            f"expected None or a positive int, got {max_num_tokens!r}")
        for arg, value in dict(overlap=overlap, fuse_expand=fuse_expand).items():
            if not isinstance(value, bool):
                raise LoraError(LoraErrorCode.INVALID_ARGUMENT, arg, f"expected a bool, got {value!r}")
        if not any(fold is f for f in FOLDS):
            raise LoraError(LoraErrorCode.INVALID_ARGUMENT, "fold", f"expected one of {FOLDS}, got {fold!r}")
        # the fused modules whose expand finish_deferred leaves to the kernel consuming the output
        self.fuse_modules = frozenset(FUSE_MODULES if fuse_expand and max_rank <= FUSE_MAX_RANK else ())
        self.shapes = LoraShapes(num_layers, hidden_size, q_size, kv_size, intermediate_size)
        self.max_loras, self.max_rank = max_loras, max_rank
        self.device, self.dtype = torch.device(device), dtype
        self.kernel = _resolve_kernel(kernel, self.device, dtype)
        # sizes, before anything is allocated
        if max_rank > hidden_size:  # every projection has hidden_size as its input or output width
            raise LoraError(LoraErrorCode.RANK_TOO_LARGE, "max_rank",
                            f"expected max_rank <= hidden_size={hidden_size} (no projection has a useful "
                            f"rank above it), got {max_rank}")
        _check_fits(self.shapes, max_loras, max_rank, self.device, dtype, max_num_tokens)
        R = max_rank
        z = dict(device=self.device, dtype=dtype)
        self.lora_a = {m: torch.zeros(num_layers, max_loras, len(subs) * R, self.shapes.in_features(m), **z)
                       for m, subs in FUSED_MODULES.items()}
        self.lora_b = {m: tuple(torch.zeros(num_layers, max_loras, out, R, **z) for out in self.shapes.out_features(m))
                       for m in FUSED_MODULES}
        self.lora_rank = {m: torch.zeros(num_layers, max_loras, len(subs), dtype=torch.int32, device=self.device)
                          for m, subs in FUSED_MODULES.items()}
        self._layer_weights: dict[tuple[int, str], tuple] = {}
        self._slot_names: list[str | None] = [None] * max_loras
        self._slots: dict[str, int] = {}  # name -> slot, in load order
        # name -> its load id: a count of every load ever made here, so a name unloaded and
        # loaded again (perhaps with other weights) gets a new one (see cache_key)
        self._load_ids: dict[str, int] = {}
        self._loads = 0
        # per slot: (layer, fused module) -> ((sub-module index, rank), ...) it adapts
        self._targets: list[dict[tuple[int, str], tuple[tuple[int, int], ...]]] = [{} for _ in range(max_loras)]
        self.max_num_tokens = max_num_tokens
        self._buffers = None
        if max_num_tokens is not None:
            i64 = dict(device=self.device, dtype=torch.int64)
            self._buffers = dict(
                token_slot=torch.empty(max_num_tokens, device=self.device, dtype=torch.int32),
                perm=torch.empty(max_num_tokens, **i64), seg_indptr=torch.empty(max_loras + 1, **i64),
                seg_slots=torch.empty(max_loras, **i64),
                slot_indptr=torch.empty(max_loras + 1, device=self.device, dtype=torch.int32))
        self._segment_gemm = None
        # the side stream of LoraBatch.begin / finish; None: everything on the current stream
        self.side = (SideStream(self.device) if overlap and self.kernel == "triton" and self.device.type == "cuda"
                     else None)
        # whether fold_into folds: the triton kernel only (graph batches), "auto" where it pays
        self.folds = self.kernel == "triton" and (
            fold is True or (fold == "auto" and self.device.type == "cuda"
                             and max_loras * max_rank <= FOLD_MAX_SLOT_RANK))
        # (layer, fused module) -> (W_ext [N + E, in], bias_ext [N + E] or None, N); empty: not folded
        self.folded: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor | None, int]] = {}

    @property
    def overlap(self) -> bool:
        """Whether the shrinks run on a side stream, overlapping the base GEMMs."""
        return self.side is not None

    # -- adapters ------------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> int:
        """Load the PEFT adapter folder `path` under `name` into a free slot; return the slot."""
        self._check_can_add(name)  # before reading a possibly large file
        return self.add_adapter(read_peft_adapter(name, path, self.shapes, max_rank=self.max_rank))

    def add_adapter(self, adapter: PeftAdapter) -> int:
        """Copy an adapter already in memory (e.g. read_peft_adapter's) into a free slot; return the slot.

        adapter.weights must fit self.shapes (read_peft_adapter checks that); tensors may be on any device.
        """
        self._check_can_add(adapter.name)
        if adapter.max_rank > self.max_rank:
            raise LoraError(LoraErrorCode.RANK_TOO_LARGE, f"load_adapter(name={adapter.name!r})",
                            f"expected rank <= max_rank={self.max_rank}, got {adapter.max_rank}")
        if self.dtype.is_floating_point:  # finite in float32 may still overflow the slots' dtype
            limit = torch.finfo(self.dtype).max
            for (layer, proj), (a, b) in adapter.weights.items():
                for name, w in (("lora_A", a), ("lora_B * scale", b)):
                    if w.numel() and not bool(w.abs().max() <= limit):
                        raise LoraError(LoraErrorCode.NON_FINITE_WEIGHTS, f"load_adapter(name={adapter.name!r})",
                                        f"expected finite {name} values within {self.dtype}'s range "
                                        f"(|x| <= {limit:g}) for layer {layer} {proj}, got max |x| = "
                                        f"{float(w.abs().max()):g}")
        slot = self._slot_names.index(None)
        self._write_slot(slot, adapter)
        self._slot_names[slot] = adapter.name
        self._slots[adapter.name] = slot
        self._load_ids[adapter.name] = self._loads
        self._loads += 1
        return slot

    def _check_can_add(self, name) -> None:
        arg = f"load_adapter(name={name!r})"
        if not isinstance(name, str) or not name or name == "base":
            raise LoraError(LoraErrorCode.INVALID_NAME, arg,
                            f"expected a non-empty str other than 'base' (the model itself), got {name!r}")
        if name in self._slots:
            raise LoraError(LoraErrorCode.DUPLICATE_NAME, arg,
                            f"expected a name not loaded yet, got one loaded in slot {self._slots[name]}")
        if None not in self._slot_names:
            raise LoraStateError(LoraErrorCode.NO_FREE_SLOT, arg,
                                 f"expected a free slot of max_loras={self.max_loras}, got all used by "
                                 f"{self.list_adapters()}: unload one first")

    def unload_adapter(self, name: str) -> None:
        """Free the slot of `name`; requests that still name it are refused from the next step on."""
        arg = f"unload_adapter(name={name!r})"
        if name == "base" or name is None:
            raise LoraError(LoraErrorCode.UNLOAD_BASE, arg, "expected a loaded adapter, got the base model")
        if not isinstance(name, str) or name not in self._slots:
            raise LoraError(LoraErrorCode.NOT_LOADED, arg,
                            f"expected one of the loaded adapters {self.list_adapters()}, got {name!r}")
        slot = self._slots.pop(name)
        del self._load_ids[name]
        self._slot_names[slot] = None
        self._targets[slot] = {}
        for ranks in self.lora_rank.values():
            ranks[:, slot] = 0

    def list_adapters(self) -> list[str]:
        """Names of the loaded adapters, in load order."""
        return list(self._slots)

    def cache_key(self, name: str) -> tuple[str, int]:
        """The prefix-cache key of K/V computed under the loaded adapter `name`: (name, load id).
        It identifies the weights, not only the name: after unload_adapter(name) and a new
        load_adapter(name, ...) the key differs, so K/V cached under the old weights is never
        served again (a block manager's extra_key; see adapters' package docstring)."""
        if not isinstance(name, str) or name not in self._slots:
            raise LoraError(LoraErrorCode.NOT_LOADED, f"cache_key(name={name!r})",
                            f"expected one of the loaded adapters {self.list_adapters()}, got {name!r}")
        return name, self._load_ids[name]

    def slot_of(self, name: str) -> int:
        return self._slots[name]

    def layer_weights(self, layer: int, module: str):
        """(A [max_loras, n_sub * R, in], (B_i [max_loras, out_i, R], ...), ranks [max_loras, n_sub] int32,
        out_offsets) of one layer: views of the stacks, made once."""
        key = (layer, module)
        if key not in self._layer_weights:
            self._layer_weights[key] = (self.lora_a[module][layer], tuple(b[layer] for b in self.lora_b[module]),
                                        self.lora_rank[module][layer], self.shapes.out_offsets(module))
        return self._layer_weights[key]

    def targets(self, slot: int, layer: int, module: str) -> tuple[tuple[int, int], ...]:
        """((sub-module index, rank), ...) that the adapter in `slot` adapts in (layer, fused module)."""
        return self._targets[slot].get((layer, module), ())

    def _write_slot(self, slot: int, adapter: PeftAdapter) -> None:
        R = self.max_rank
        for m in FUSED_MODULES:  # a reused slot must not keep a former adapter's weights
            for a in self.lora_a[m]:  # per layer (a list of views into W_ext once folded)
                a[slot].zero_()
            for b in self.lora_b[m]:
                b[:, slot].zero_()
        ranks = {m: torch.zeros(r.shape[0], r.shape[2], dtype=torch.int32) for m, r in self.lora_rank.items()}
        targets: dict[tuple[int, str], list[tuple[int, int]]] = {}
        for (layer, proj), (a, b) in adapter.weights.items():
            fused, sub = PEFT_MODULES[proj]
            r = a.shape[0]
            self.lora_a[fused][layer][slot, sub * R: sub * R + r].copy_(a)
            self.lora_b[fused][sub][layer, slot, :, :r].copy_(b)
            ranks[fused][layer, sub] = r
            targets.setdefault((layer, fused), []).append((sub, r))
        for m, r in ranks.items():
            self.lora_rank[m][:, slot].copy_(r)
        self._targets[slot] = {k: tuple(sorted(v)) for k, v in targets.items()}

    def fold_into(self, linears) -> bool:
        """Move the A stacks into extra rows of the base weights (see adapters/lora_fold.py); once.

        linears: {(layer, fused module): nn.Linear} for every layer and every module of
        adapters.shapes.FUSED_MODULES: the model's (unsharded) projections, weight [N, in] on this
        manager's device and dtype. Their weight (and bias) become views of the extended tensors
        (same values); anything holding the old storage (a captured CUDA graph) must be dropped.
        Adapters already loaded keep their weights. Returns whether it folded (self.folds).
        """
        arg = "fold_into(linears)"
        if self.folded:
            raise LoraStateError(LoraErrorCode.ALREADY_FOLDED, arg, "expected a first call, got A already folded")
        if not self.folds:
            return False
        check_linears(linears, self.shapes, self.device, self.dtype, arg)
        views = fold_a_stacks(linears, self.lora_a, self.shapes, self.max_loras, self.max_rank, self.device,
                              self.dtype, self.folded)
        self.lora_a.update(views)  # per layer from now on: views into W_ext
        self._layer_weights.clear()
        return True

    # -- the per-step mapping ------------------------------------------------------------------
    def slots_for(self, adapter_ids: Sequence[str | None]) -> list[int]:
        """Host: the slot of each adapter name, -1 for None / "base"; a name with no slot (not
        loaded: adapter_ids that skipped the boundary's resolve_adapter_ids) raises NOT_LOADED.

        For a CUDA-graph runner filling make_graph_batch's buffer (one entry per decode token)."""
        slots = []
        for i, a in enumerate(adapter_ids):
            if a is None or a == "base":
                slots.append(-1)
            elif isinstance(a, str) and a in self._slots:
                slots.append(self._slots[a])
            else:
                raise LoraError(LoraErrorCode.NOT_LOADED, "adapter_ids",
                                f"expected a loaded adapter ({self.list_adapters()} or 'base'), "
                                f"got {a!r} for request {i}")
        return slots

    def groups_for(self, token_slot: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Host: the tokens grouped by slot (adapters.lora_batch.lora_groups) over this manager's
        max_loras slots: what a CUDA-graph runner writes into make_graph_batch's groups_buffer."""
        return lora_groups(token_slot, self.max_loras, out)

    def make_batch(self, adapter_ids: Sequence[str | None], batch) -> LoraBatch:
        """Map each token to its adapter slot and group the tokens by slot, once per step.

        adapter_ids: per request (length 1 = the whole batch); None or "base" = the base model;
               as resolved by adapters.ids.resolve_adapter_ids at the step's boundary (not
               checked again here, beyond the name -> slot lookup).
        batch: the step's ForwardBatch (duck-typed): q_lens_cpu [B] int host, tokens laid out
               request after request.
        Everything is computed on the host and copied to the device without a sync.
        """
        q = batch.q_lens_cpu.to(torch.int64)
        B = int(q.shape[0])
        ids = list(adapter_ids) * B if len(adapter_ids) == 1 else list(adapter_ids)
        slots = self.slots_for(ids)
        T = int(q.sum())
        if self._buffers is not None and T > self.max_num_tokens:
            raise LoraStateError(LoraErrorCode.TOO_MANY_TOKENS, "make_batch",
                                 f"expected at most max_num_tokens={self.max_num_tokens} tokens, got {T}")
        req_slot = torch.tensor(slots, dtype=torch.int64)  # [B]
        starts = torch.cumsum(q, 0) - q  # [B] first token of each request
        lora = req_slot >= 0
        order = torch.nonzero(lora).flatten()
        order = order[torch.argsort(req_slot[order], stable=True)]  # LoRA requests grouped by slot
        lens = q[order]
        N = int(lens.sum())
        # token j of the i-th grouped request sits at starts[i] + j; built without a loop
        perm = torch.arange(N) + torch.repeat_interleave(starts[order] - (torch.cumsum(lens, 0) - lens), lens,
                                                         output_size=N)
        per_slot = torch.zeros(self.max_loras, dtype=torch.int64).index_add_(0, req_slot[lora], q[lora])
        seg_slots = torch.nonzero(per_slot).flatten()
        seg_indptr = torch.zeros(seg_slots.shape[0] + 1, dtype=torch.int64)
        torch.cumsum(per_slot[seg_slots], 0, out=seg_indptr[1:])
        bounds = seg_indptr.tolist()
        segments = [(s, bounds[i], bounds[i + 1]) for i, s in enumerate(seg_slots.tolist())]
        identity = N == T and bool((req_slot[1:] >= req_slot[:-1]).all())

        token_slot = torch.repeat_interleave(req_slot.to(torch.int32), q, output_size=T)
        triton = self.kernel == "triton"
        slot_indptr = torch.zeros(self.max_loras + 1, dtype=torch.int32)
        slot_indptr[1:] = torch.cumsum(per_slot, 0)
        return LoraBatch(
            token_slot=self._to_device("token_slot", token_slot), perm=self._to_device("perm", perm),
            seg_indptr=None if triton else self._to_device("seg_indptr", seg_indptr),
            seg_slots=None if triton else self._to_device("seg_slots", seg_slots),
            segments=segments, identity=identity, kernel=self.kernel, manager=self,
            slot_indptr=self._to_device("slot_indptr", slot_indptr) if triton else None)

    def make_graph_batch(self, token_slot_buffer: torch.Tensor,
                         groups_buffer: torch.Tensor | None = None) -> LoraBatch:
        """A LoraBatch for a CUDA-graph runner, made once per captured graph (kernel "triton").

        token_slot_buffer: [max tokens] int32 on this manager's device, owned by the runner, which
        writes the slot of each token (slots_for(adapter_ids); -1 for the base model and padding
        rows) into its first T entries before each replay. apply() reads buffer[:T] on the device
        only (T = the rows of x): no host value of the mapping is captured, so one graph serves
        any mix of adapters, including none.
        groups_buffer: optional [max_loras + 1, max tokens + 1] int32 on the device, which the runner
        rewrites with lora_groups(its T slots) alongside: with it the gate_up delta is added inside
        SiLU-and-mul, slot-major (where fuse_modules has gate_up); without it by an expand kernel.
        """
        arg = "make_graph_batch(token_slot_buffer)"
        buf = token_slot_buffer
        if not isinstance(buf, torch.Tensor) or buf.dtype != torch.int32 or buf.dim() != 1 \
                or buf.device.type != self.device.type or self.device.index not in (None, buf.device.index):
            got = (f"{buf.dtype} {list(buf.shape)} on {buf.device}" if isinstance(buf, torch.Tensor)
                   else type(buf).__name__)
            raise LoraError(LoraErrorCode.INVALID_ARGUMENT, arg,
                            f"expected a 1-D int32 tensor on {self.device}, got {got}")
        if not _triton_runs(self.device, self.dtype):
            raise LoraError(LoraErrorCode.INVALID_ARGUMENT, arg,
                            f"expected triton installed, a CUDA device and bf16/fp16/fp32 (graph batches run "
                            f"the triton kernel), got device {self.device}, dtype {self.dtype}")
        groups = groups_buffer
        if groups is not None and (not isinstance(groups, torch.Tensor) or groups.dtype != torch.int32
                                   or tuple(groups.shape) != (self.max_loras + 1, buf.shape[0] + 1)
                                   or groups.device != buf.device or not groups.is_contiguous()):
            got = (f"{groups.dtype} {list(groups.shape)} on {groups.device}" if isinstance(groups, torch.Tensor)
                   else type(groups).__name__)
            raise LoraError(LoraErrorCode.INVALID_ARGUMENT, "make_graph_batch(groups_buffer)",
                            f"expected a contiguous int32 tensor [{self.max_loras + 1}, {buf.shape[0] + 1}] on "
                            f"{buf.device}, got {got}")
        return LoraBatch(token_slot=buf, perm=None, seg_indptr=None, seg_slots=None, segments=None,
                         identity=False, kernel="triton", manager=self, groups=groups)

    def _to_device(self, key: str, host: torch.Tensor) -> torch.Tensor:
        out = self._out(key, host.shape[0], host.dtype)
        if out.device.type == "cuda":  # a copy from pageable memory would wait for the stream
            host = host.pin_memory()
        return out.copy_(host, non_blocking=True)

    def _out(self, key: str, n: int, dtype: torch.dtype) -> torch.Tensor:
        if self._buffers is None:
            return torch.empty(n, dtype=dtype, device=self.device)
        return self._buffers[key][:n]

    def segment_gemm(self):
        """FlashInfer's SegmentGEMMWrapper, made on first use (the "flashinfer" kernel only)."""
        if self._segment_gemm is None:
            import flashinfer

            workspace = torch.empty(SEGMENT_GEMM_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
            self._segment_gemm = flashinfer.SegmentGEMMWrapper(workspace)
        return self._segment_gemm


def stack_bytes(shapes: LoraShapes, max_loras: int, max_rank: int, dtype: torch.dtype,
                max_num_tokens: int | None = None) -> int:
    """Bytes of the slot stacks a LoraManager allocates (A and B of every fused module, ranks)."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_slot_layer = 0
    for m, subs in FUSED_MODULES.items():
        per_slot_layer += (len(subs) * shapes.in_features(m) + sum(shapes.out_features(m))) * max_rank * elem
        per_slot_layer += len(subs) * 4  # int32 ranks
    mapping = 0 if max_num_tokens is None else max_num_tokens * (4 + 8)  # token_slot int32, perm int64
    return per_slot_layer * max_loras * shapes.num_layers + mapping


def _check_fits(shapes: LoraShapes, max_loras: int, max_rank: int, device: torch.device, dtype: torch.dtype,
                max_num_tokens: int | None) -> None:
    """Refuse slot stacks (and mapping buffers) larger than the device's free memory, before
    allocating any of it."""
    need = stack_bytes(shapes, max_loras, max_rank, dtype, max_num_tokens)
    free = free_memory_bytes(device)
    if free is not None and need > free:
        raise LoraStateError(LoraErrorCode.INSUFFICIENT_MEMORY, "enable_lora(max_loras, max_rank)",
                             f"expected slot stacks that fit the {free / 2**30:.2f} GiB free on {device}, got "
                             f"{need / 2**30:.2f} GiB for max_loras={max_loras}, max_rank={max_rank}, "
                             f"max_num_tokens={max_num_tokens}")


def _resolve_kernel(kernel: str, device: torch.device, dtype: torch.dtype) -> str:
    """"auto": triton where it runs, else flashinfer where it runs, else torch."""
    if kernel not in KERNELS:
        raise LoraError(LoraErrorCode.INVALID_ARGUMENT, "kernel", f"expected one of {KERNELS}, got {kernel!r}")
    if kernel == "torch":
        return kernel
    if kernel == "triton" and not _triton_runs(device, dtype):
        raise LoraError(LoraErrorCode.INVALID_ARGUMENT, "kernel",
                        f"expected 'triton' only with triton installed, a CUDA device and bf16/fp16/fp32, "
                        f"got device {device}, dtype {dtype}")
    if kernel == "flashinfer" and not _flashinfer_runs(device, dtype):
        raise LoraError(LoraErrorCode.INVALID_ARGUMENT, "kernel",
                        f"expected 'flashinfer' only with flashinfer installed, a CUDA device and bf16/fp16, "
                        f"got device {device}, dtype {dtype}")
    if kernel == "auto":
        return ("triton" if _triton_runs(device, dtype) else
                "flashinfer" if _flashinfer_runs(device, dtype) else "torch")
    return kernel


def _triton_runs(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cuda" and dtype in (torch.bfloat16, torch.float16, torch.float32)
            and _imports("adapters.triton_kernels"))  # triton with griddepcontrol (3.3 and later)


def _flashinfer_runs(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and _imports("flashinfer")


def _imports(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
