"""Paged attention in plain PyTorch: the executable specification the CUDA backend is tested against.

plan() turns block_tables into, per request, the flat cache slot of every key position and one
boolean mask [B, max_q, max_kv] that says which key each new token may see; run() gathers K/V
through those slots and does masked softmax attention in float32.

    key j of request b lives at slot  block_tables[b, j // block_size] * block_size + j % block_size
    new token i of request b sits at kv index  p = L_b - q_b + i
    visible(b, i, j) = j < L_b  and  (causal: j <= p | spec_mask: j < L_b - q_b or spec[t, j-(L_b-q_b)]
                                      | atten_mask: atten[t, j])  and  (no window | pos_t - pos_j < window)
    pos_j, the position of key j, is j for cached keys and the new token's position_id otherwise:
    in a tree, siblings share kv span but not paths, and the window counts along the path.
"""

from __future__ import annotations

import torch

from model_wrapper.attention.backend import AttentionBackend
from model_wrapper.forward_batch import ForwardBatch


class TorchAttentionBackend(AttentionBackend):
    name = "torch"

    def plan(self, batch: ForwardBatch) -> None:
        dev = batch.input_ids.device
        B, max_q, max_kv = batch.batch_size, batch.max_q, batch.max_kv
        q = batch.q_lens_cpu.to(torch.int64)
        L = batch.seq_lens_cpu.to(torch.int64)
        bs = batch.block_size

        j = torch.arange(max_kv)
        key_valid = j[None, :] < L[:, None]  # [B, max_kv]
        blocks = batch.block_tables_cpu.to(torch.int64)
        block_of_j = torch.gather(blocks, 1, (j // bs).expand(B, -1)) if max_kv else blocks[:, :0]
        kv_slot = torch.where(key_valid, block_of_j * bs + j % bs, 0)

        i = torch.arange(max_q)
        row_valid = i[None, :] < q[:, None]  # [B, max_q]
        # padded token index of (b, i); padding rows point at an extra zero row (index T)
        pad_index = torch.where(row_valid, batch.qo_indptr_cpu[:-1, None].to(torch.int64) + i, batch.num_tokens)
        p = (L - q)[:, None] + i[None, :]  # [B, max_q] kv index of each query

        self._kv_slot = kv_slot.to(dev)
        self._pad_index = pad_index.to(dev)
        self._unpad = torch.nonzero(row_valid.flatten()).flatten().to(dev)  # [T] into B*max_q
        # positions of queries and keys for sliding windows
        tok_pos = torch.cat((batch.positions_cpu, batch.positions_cpu.new_zeros(1)))
        key_pos = j.expand(B, -1).clone()
        req = torch.repeat_interleave(torch.arange(B), q)
        kv_idx = torch.arange(batch.num_tokens) - batch.qo_indptr_cpu[:-1].to(torch.int64)[req] + (L - q)[req]
        key_pos[req, kv_idx] = batch.positions_cpu
        self._q_pos = tok_pos[pad_index].to(dev)  # [B, max_q]
        self._key_pos = key_pos.to(dev)  # [B, max_kv]
        self._base_mask = self._visibility(batch, key_valid, p, j, q, L).to(dev)
        self._masks: dict[int | None, torch.Tensor] = {None: self._base_mask}

    def _visibility(self, batch, key_valid, p, j, q, L) -> torch.Tensor:
        """[B, max_q, max_kv] bool, without the sliding window."""
        B, max_q, max_kv = batch.batch_size, batch.max_q, batch.max_kv
        if batch.atten_mask is not None or batch.spec_mask is not None:
            # per-token masks are given in token order: scatter them into the padded layout
            pad = self._gather_rows_cpu(batch)
        if batch.atten_mask is not None:
            m = pad(batch.atten_mask.cpu(), max_kv)
        elif batch.spec_mask is not None:
            prefix = (L - q)[:, None, None]
            col = j[None, None, :] - prefix  # column among the request's new tokens
            spec = pad(batch.spec_mask.cpu(), batch.max_q)  # [B, max_q, max_q]
            in_new = (col >= 0) & (col < max_q)
            spec_at = torch.gather(spec, 2, col.clamp(0, max(max_q - 1, 0)).expand(B, max_q, max_kv))
            m = (col < 0) | (in_new & spec_at)
        else:
            m = j[None, None, :] <= p[:, :, None]
        return m & key_valid[:, None, :]

    @staticmethod
    def _gather_rows_cpu(batch):
        q = batch.q_lens_cpu.to(torch.int64)
        starts = batch.qo_indptr_cpu[:-1].to(torch.int64)
        i = torch.arange(batch.max_q)
        valid = i[None, :] < q[:, None]
        idx = torch.where(valid, starts[:, None] + i, 0)

        def pad(rows: torch.Tensor, width: int) -> torch.Tensor:
            out = rows[idx][..., :width]  # [B, max_q, width]
            if out.shape[-1] < width:
                out = torch.nn.functional.pad(out, (0, width - out.shape[-1]))
            return out & valid[:, :, None]

        return pad

    def _mask(self, window: int | None) -> torch.Tensor:
        if window not in self._masks:
            in_window = (self._q_pos[:, :, None] - self._key_pos[:, None, :]) < window
            self._masks[window] = self._base_mask & in_window
        return self._masks[window]

    def run(self, layer, q, k_cache, v_cache, window, batch):
        T, H, D = q.shape
        kvh = self.num_kv_heads
        g = H // kvh
        B, max_q = self._pad_index.shape
        k = k_cache.view(-1, kvh, D)[self._kv_slot].float()  # [B, max_kv, kvh, D]
        v = v_cache.view(-1, kvh, D)[self._kv_slot].float()
        qp = torch.cat((q, q.new_zeros(1, H, D)))[self._pad_index].float()  # [B, max_q, H, D]
        qp = qp.view(B, max_q, kvh, g, D)
        scores = torch.einsum("bqhgd,bkhd->bhgqk", qp, k) * self.scale
        mask = self._mask(window)[:, None, None, :, :]
        scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no visible key -> 0
        out = torch.einsum("bhgqk,bkhd->bqhgd", probs, v).reshape(B, max_q, H, D)
        return out.reshape(B * max_q, H, D).index_select(0, self._unpad).to(q.dtype)
