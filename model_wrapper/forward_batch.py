"""ForwardBatch: one step's tensors, built once from forward_tensor's validated arguments.

The generator validates the caller's flat tensors, then the model wrapper builds one ForwardBatch;
the attention backend plans from it once and every layer reads it. Host copies (`*_cpu`) of the
small per-request arrays travel beside the device tensors, so planning needs no device sync.

Token layout (requests one after another, q_len_r new tokens each; L_r = input_length):

    request r:  | cached tokens 0 .. L_r-q_r-1 | new tokens L_r-q_r .. L_r-1 |
    input_ids:  [ r0 new tokens | r1 new tokens | ... ]      qo_indptr = [0, q_0, q_0+q_1, ...]
    new token i of request r has kv index L_r - q_r + i and is written at slots[t]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch

from adapters.lora_layers import LoraStep


class ForwardMode(IntEnum):
    EXTEND = 1  # every request brings prompt (or prompt-chunk) tokens
    DECODE = 2  # every request brings decode token(s): q_len 1, or several for speculation
    MIXED = 3  # prefill chunks and single-token decodes in one call


@dataclass
class ForwardBatch:
    """Per-step metadata shared by all layers. B = batch, T = num_tokens.

    mode:            EXTEND / DECODE / MIXED
    input_ids:       [T] int64, device
    input_ids_cpu:   [T] int64, host copy (validation made it; CUDA-graph replays read it)
    positions:       [T] int64, device; rotary positions (trees: cached_len + depth)
    positions_cpu:   [T] int64, host copy of positions (sliding windows over trees use it)
    slots:           [T] int64, device; flat KV slot of each new token, -1 = write nothing
    slots_cpu:       [T] int64, host copy of slots
    write_slots:     [W] int64, device; the slots that are written (slots without the -1s)
    write_token_index: [W] int64, device; tokens whose K/V is written, or None for all tokens
    block_size:      tokens per KV block
    q_lens_cpu:      [B] int32, host; new tokens per request
    seq_lens_cpu:    [B] int32, host; KV length after this step (input_lengths)
    qo_indptr_cpu:   [B+1] int32, host; token offsets of each request in input_ids
    block_tables_cpu:[B, W] int32, host; padding past ceil(L/block_size) never read
    token_req:       [T] int64, device; request index of each token
    token_req_cpu:   [T] int64, host copy
    token_kv_index_cpu: [T] int64, host; kv index of each new token (L - q + i)
    lm_head_indices: [num_out] int64, device, or None for every token
    spec_mask:       [T, max_q] bool, host (True = attend) or None; backends plan from it
    atten_mask:      [T, max_kv] bool, host (True = attend) or None
    max_q, max_kv:   host ints
    lora:            the LoRA part (adapters.LoraStep: adapter_ids, manager, mapping), or None for a
                     step without adapters; its mapping is made by ensure_lora only where the step
                     runs eagerly (a decode graph replay maps adapter_ids itself)
    extras:          per-feature metadata a backend or feature adds (e.g. CUDA-graph state)
    hidden_layers:   indices into the hidden-state stack to return beside the logits (0 = the
                     embeddings, i = the input of layer i, num_layers = the final normed state),
                     or None (the step returns logits only); for draft heads such as EAGLE-3
    """

    mode: ForwardMode
    input_ids: torch.Tensor
    input_ids_cpu: torch.Tensor | None
    positions: torch.Tensor
    positions_cpu: torch.Tensor
    slots: torch.Tensor
    slots_cpu: torch.Tensor | None
    write_slots: torch.Tensor
    write_token_index: torch.Tensor | None
    block_size: int
    q_lens_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    block_tables_cpu: torch.Tensor
    token_req: torch.Tensor
    token_req_cpu: torch.Tensor | None
    token_kv_index_cpu: torch.Tensor | None
    lm_head_indices: torch.Tensor | None
    spec_mask: torch.Tensor | None
    atten_mask: torch.Tensor | None
    max_q: int
    max_kv: int
    lora: LoraStep | None = None
    extras: dict = field(default_factory=dict)
    # (tokens, rows, index), all on the device: input_ids[rows] = tokens[index] (already applied
    # to input_ids; a CUDA-graph replay applies it to its static input buffer)
    prev_token_ids: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    hidden_layers: tuple[int, ...] | None = None

    @property
    def uses_lora(self) -> bool:
        """Whether the step names adapters (its mapping may not be made yet: ensure_lora)."""
        return self.lora is not None

    def ensure_lora(self) -> None:
        """Make the LoRA part's per-token mapping, where the step names adapters and it has none
        yet: once, before an eager forward (host work a decode graph replay does not need)."""
        if self.lora is not None:
            self.lora.prepare(self)

    @property
    def batch_size(self) -> int:
        return int(self.q_lens_cpu.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def prefix_lens_cpu(self) -> torch.Tensor:
        """[B] int32: tokens of each request already in the cache before this step."""
        return self.seq_lens_cpu - self.q_lens_cpu

    @classmethod
    def build(
        cls,
        *,
        input_ids: torch.Tensor,
        input_ids_cpu: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        is_prefill: bool,
        block_size: int,
        q_lens_cpu: torch.Tensor,
        seq_lens_cpu: torch.Tensor,
        block_tables_cpu: torch.Tensor,
        lm_head_indices: torch.Tensor | None,
        spec_mask: torch.Tensor | None,
        atten_mask: torch.Tensor | None,
        device: torch.device,
        token_req_cpu: torch.Tensor | None = None,
        token_kv_index_cpu: torch.Tensor | None = None,
        prev_token_ids: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> "ForwardBatch":
        """All host inputs are validated and on the CPU (positions, slots, *_cpu); input_ids may be
        on the caller's device. prev_token_ids = (tokens on the device, rows, index on the host):
        input_ids[rows] := tokens[index], on the device (input_ids_cpu keeps the placeholders)."""
        q = q_lens_cpu.to(torch.int64)
        L = seq_lens_cpu.to(torch.int64)
        qo_indptr = torch.zeros(q.shape[0] + 1, dtype=torch.int32)
        torch.cumsum(q_lens_cpu, 0, out=qo_indptr[1:])
        num_tokens = int(qo_indptr[-1])
        req = token_req_cpu
        if req is None:
            req = torch.repeat_interleave(torch.arange(q.shape[0]), q, output_size=num_tokens)
        kv_index = token_kv_index_cpu
        if kv_index is None:
            kv_index = torch.arange(num_tokens) - qo_indptr[:-1].to(torch.int64)[req] + (L - q)[req]
        if not is_prefill:
            mode = ForwardMode.DECODE
        elif bool(((q == 1) & (L > 1)).any()):
            mode = ForwardMode.MIXED
        else:
            mode = ForwardMode.EXTEND
        slots = slots.to(torch.int64)
        write_slots, write_token_index = slots, None
        if bool((slots < 0).any()):
            write_token_index = torch.nonzero(slots >= 0).flatten()
            write_slots = slots[write_token_index]
        # every int64 array the device needs, moved in one pinned host-to-device copy
        parts = {"positions": positions.to(torch.int64), "slots": slots, "write_slots": write_slots,
                 "token_req": req}
        if input_ids.device.type == "cpu":
            parts["input_ids"] = input_ids.to(torch.int64)
        if write_token_index is not None:
            parts["write_token_index"] = write_token_index
        if lm_head_indices is not None:
            parts["lm_head_indices"] = lm_head_indices.to(torch.int64)
        if prev_token_ids is not None:
            parts["prev_rows"], parts["prev_index"] = prev_token_ids[1], prev_token_ids[2]
        on_dev = _to_device(parts, device)
        if "input_ids" not in on_dev:
            on_dev["input_ids"] = input_ids.to(torch.int64)
        prev = None
        if prev_token_ids is not None:
            prev = (prev_token_ids[0], on_dev["prev_rows"], on_dev["prev_index"])
            # out of place: on the CPU on_dev["input_ids"] may be the caller's own tensor
            on_dev["input_ids"] = on_dev["input_ids"].index_copy(0, prev[1], prev[0].index_select(0, prev[2]))

        return cls(
            mode=mode,
            input_ids=on_dev["input_ids"],
            input_ids_cpu=input_ids_cpu,
            positions=on_dev["positions"],
            positions_cpu=positions.to(torch.int64),
            slots=on_dev["slots"],
            slots_cpu=slots,
            write_slots=on_dev["write_slots"],
            write_token_index=on_dev.get("write_token_index"),
            block_size=block_size,
            q_lens_cpu=q_lens_cpu,
            seq_lens_cpu=seq_lens_cpu,
            qo_indptr_cpu=qo_indptr,
            block_tables_cpu=block_tables_cpu,
            token_req=on_dev["token_req"],
            token_req_cpu=req,
            token_kv_index_cpu=kv_index,
            lm_head_indices=on_dev.get("lm_head_indices"),
            spec_mask=spec_mask,
            atten_mask=atten_mask,
            max_q=int(q.max()) if q.numel() else 0,
            max_kv=int(L.max()) if L.numel() else 0,
            prev_token_ids=prev,
        )


def _to_device(parts: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Host int64 tensors -> views of one device tensor, filled by a single non-blocking copy
    from pinned memory (on the CPU: the tensors themselves)."""
    if device.type == "cpu":
        return parts
    sizes = [t.numel() for t in parts.values()]
    host = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=True)
    torch.cat(list(parts.values()), out=host)
    flat = host.to(device, non_blocking=True)
    return dict(zip(parts, flat.split(sizes)))
