"""The parts of the decode CUDA-graph runner that need no GPU: the bucket choice and the static
batch a graph is captured with (a ForwardBatch whose fields track the real one's)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from model_wrapper.cuda_graph import DEFAULT_BUCKETS, DecodeGraphRunner
from model_wrapper.forward_batch import ForwardBatch, ForwardMode


def test_static_batch_is_a_complete_forward_batch():
    runner = object.__new__(DecodeGraphRunner)
    runner.lora = None
    z = torch.zeros(8, dtype=torch.int64)
    bucket = SimpleNamespace(size=8, input_ids=z, positions=z, slots=z.clone(),
                             token_slot=torch.full((8,), -1, dtype=torch.int32))
    batch = runner._static_batch(bucket, block_size=16)
    assert isinstance(batch, ForwardBatch) and batch.mode == ForwardMode.DECODE
    assert batch.batch_size == 8 and batch.num_tokens == 8 and batch.max_q == 1
    assert batch.slots is bucket.slots and batch.write_token_index is None and batch.lora is None


def test_buckets_cover_every_batch_size_up_to_256():
    assert DEFAULT_BUCKETS[0] == 1 and DEFAULT_BUCKETS[-1] == 256
    assert list(DEFAULT_BUCKETS) == sorted(set(DEFAULT_BUCKETS))
    for b in range(1, 257):  # the padding a batch pays is under 8 rows above 8
        size = next(s for s in DEFAULT_BUCKETS if s >= b)
        assert size - b < max(8, b // 2 + 1)


def test_runner_and_wrapper_form_no_reference_cycle():
    """The graphs die with their wrapper by reference counting alone (no collector, gc.freeze()
    or not): NCCL's teardown waits for every graph that holds its collectives."""
    import gc
    import weakref

    class Wrapper:  # what the runner reads of a ModelWrapper at construction
        backend = SimpleNamespace(windows=())

    wrapper = Wrapper()
    wrapper.graphs = DecodeGraphRunner(wrapper)
    assert wrapper.graphs.mw.backend is wrapper.backend
    runner = weakref.ref(wrapper.graphs)
    gc.disable()
    try:
        del wrapper
        assert runner() is None
    finally:
        gc.enable()
