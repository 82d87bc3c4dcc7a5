"""Which keys each new token may see: one host-side definition shared by every backend.

    token t of request r (q_r new tokens, L_r keys after this step) sits at kv index
    p_t = L_r - q_r + i_t.  Key j (0 <= j < L_r) is visible to t when
      default     j <= p_t                                       (causal)
      spec_mask   j < L_r - q_r  or  spec[t, j - (L_r - q_r)]    (cached keys always visible)
      atten_mask  atten[t, j]                                     (instead of causality)
    and, in a layer with a sliding window W, pos_t - pos_j < W, where pos is the position id
    (for cached keys pos_j = j; in a tree, siblings share the kv span but not the path).
"""

from __future__ import annotations

import torch

from model_wrapper.forward_batch import ForwardBatch


def token_geometry(batch: ForwardBatch):
    """Host tensors: req [T] request of each token, kv_index [T], key_valid [T, max_kv]."""
    req, kv_index = batch.token_req_cpu, batch.token_kv_index_cpu
    key_valid = torch.arange(batch.max_kv)[None, :] < batch.seq_lens_cpu.to(torch.int64)[req][:, None]
    return req, kv_index, key_valid


def token_visibility(batch: ForwardBatch, window: int | None) -> torch.Tensor:
    """bool [T, max_kv] on the host: True where token t may attend to key j of its own request."""
    req, kv_index, key_valid = token_geometry(batch)
    j = torch.arange(batch.max_kv)
    if batch.atten_mask is not None:
        vis = batch.atten_mask.cpu()[:, : batch.max_kv]
    elif batch.spec_mask is not None:
        prefix = (batch.seq_lens_cpu - batch.q_lens_cpu).to(torch.int64)[req]
        col = j[None, :] - prefix[:, None]  # column among the request's new tokens
        spec = batch.spec_mask.cpu()
        spec_at = torch.gather(spec, 1, col.clamp(0, spec.shape[1] - 1))
        vis = (col < 0) | ((col < spec.shape[1]) & spec_at)
    else:
        vis = j[None, :] <= kv_index[:, None]
    vis = vis & key_valid
    if window is not None:
        key_pos = j.expand(batch.batch_size, -1).clone()
        key_pos[req, kv_index] = batch.positions_cpu
        vis = vis & ((batch.positions_cpu[:, None] - key_pos[req]) < window)
    return vis


def flat_custom_mask(batch: ForwardBatch, window: int | None) -> torch.Tensor:
    """bool [sum_r q_r * L_r]: each request's [q_r, L_r] block row-major, requests concatenated
    (FlashInfer's custom_mask layout)."""
    _, _, key_valid = token_geometry(batch)
    return token_visibility(batch, window)[key_valid]
