"""Paged attention in plain PyTorch: the executable specification the CUDA backend is tested against.

plan() turns block_tables into, per request, the flat cache slot of every key position, and the
visibility rules of attention/masks.py into one boolean mask [B, max_q, max_kv] per window;
run() gathers K/V through those slots and does masked softmax attention in float32. An FP8
(e4m3) cache is read as e4m3.float() * the layer's scale (attention/kv_store.dequantize).

    key j of request b lives at slot  block_tables[b, j // block_size] * block_size + j % block_size
"""

from __future__ import annotations

import torch

from model_wrapper.attention.backend import AttentionBackend
from model_wrapper.attention.kv_store import FP8_DTYPE, dequantize
from model_wrapper.attention.masks import token_visibility
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
        blocks = batch.block_tables_cpu.to(torch.int64)
        block_of_j = torch.gather(blocks, 1, (j // bs).expand(B, -1))
        self._kv_slot = torch.where(j[None, :] < L[:, None], block_of_j * bs + j % bs, 0).to(dev)

        i = torch.arange(max_q)
        row_valid = i[None, :] < q[:, None]  # [B, max_q]
        # padded (b, i) -> token index; padding rows point at an extra all-zero row (index T)
        pad_index = torch.where(row_valid, batch.qo_indptr_cpu[:-1, None].to(torch.int64) + i, batch.num_tokens)
        self._pad_index_cpu = pad_index
        self._pad_index = pad_index.to(dev)
        self._unpad = torch.nonzero(row_valid.flatten()).flatten().to(dev)  # [T] into B*max_q
        self._batch = batch
        self._masks: dict[int | None, torch.Tensor] = {}

    def _mask(self, window: int | None) -> torch.Tensor:
        """[B, max_q, max_kv] bool on the model's device, built once per step and window."""
        if window not in self._masks:
            vis = token_visibility(self._batch, window)
            vis = torch.cat((vis, vis.new_zeros(1, vis.shape[1])))
            self._masks[window] = vis[self._pad_index_cpu].to(self._pad_index.device)
        return self._masks[window]

    def run(self, layer, q, k_cache, v_cache, window, batch, k=None, v=None):
        T, H, D = q.shape
        kvh = self.num_kv_heads
        g = H // kvh
        B, max_q = self._pad_index.shape
        ks, vs = self.kv_store.layer_scales(layer) if k_cache.dtype == FP8_DTYPE else (None, None)
        k = dequantize(k_cache.view(-1, kvh, D)[self._kv_slot], ks)  # [B, max_kv, kvh, D] float32
        v = dequantize(v_cache.view(-1, kvh, D)[self._kv_slot], vs)
        qp = torch.cat((q, q.new_zeros(1, H, D)))[self._pad_index].float()  # [B, max_q, H, D]
        qp = qp.view(B, max_q, kvh, g, D)
        scores = torch.einsum("bqhgd,bkhd->bhgqk", qp, k) * self.scale
        vis = self._mask(window)  # [B, max_q, max_kv]
        mask = vis[:, None, None, :, :]
        scores = scores.masked_fill(~mask, float("-inf"))  # a NaN key a query cannot see drops out here
        probs = torch.softmax(scores, dim=-1)
        probs = probs.masked_fill(~mask.any(-1, keepdim=True), 0.0)  # rows with no visible key -> 0
        # Non-finite values must reach exactly the queries that see them, as in transformers: a
        # masked key's probability 0 times a NaN value would give NaN to queries that cannot see it
        # (and unused cache slots may hold anything), so such values are zeroed and the visible
        # ones put back as NaN. Finite values pass unchanged: their outputs are bit-identical.
        bad = ~torch.isfinite(v).all(-1)  # [B, max_kv, kvh]
        out = torch.einsum("bhgqk,bkhd->bqhgd", probs, v.masked_fill(bad[..., None], 0.0))
        sees_bad = torch.einsum("bqk,bkh->bqh", vis.float(), bad.float()) > 0  # [B, max_q, kvh]
        out = out.masked_fill(sees_bad[:, :, :, None, None], float("nan"))
        out = out.reshape(B * max_q, H, D)
        return out.index_select(0, self._unpad).to(q.dtype)
