"""Which prefill steps may attend over their own K/V only (FlashInfer's ragged kernel): decided
on the host from the step's layout; the kernels themselves are checked on the GPU (tests/model_wrapper/test_cuda_model.py)."""

from __future__ import annotations

import torch

from model_wrapper.attention.flashinfer_backend import only_own_kv
from model_wrapper.forward_batch import ForwardBatch


def batch(q_lens, seq_lens, slots=None, is_prefill=True):
    q, L = torch.tensor(q_lens, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32)
    T = int(q.sum())
    pos = torch.cat([torch.arange(l - n, l) for n, l in zip(q_lens, seq_lens)])
    ids = torch.zeros(T, dtype=torch.int64)
    return ForwardBatch.build(
        input_ids=ids, input_ids_cpu=ids, positions=pos,
        slots=torch.arange(T) if slots is None else torch.tensor(slots), is_prefill=is_prefill, block_size=16,
        q_lens_cpu=q, seq_lens_cpu=L, block_tables_cpu=torch.zeros(len(q_lens), 4, dtype=torch.int32),
        lm_head_indices=None, spec_mask=None, atten_mask=None, device=torch.device("cpu"))


def test_only_fresh_prompts_with_every_slot_written_attend_over_their_own_kv():
    assert only_own_kv(batch([5, 3, 9], [5, 3, 9]))
    assert only_own_kv(batch([1], [1]))  # a one-token prompt is still fresh
    assert not only_own_kv(batch([5, 3], [5, 7]))  # request 1 has 4 tokens cached before this step
    assert not only_own_kv(batch([4], [12]))  # a later chunk of a prompt
    assert not only_own_kv(batch([5, 1], [5, 30]))  # a decode row in the step (mixed)
    assert not only_own_kv(batch([3, 2], [3, 2], slots=[0, 1, -1, 3, 4]))  # a token whose K/V is not written
