"""Non-finite values in the CPU reference attention reach exactly the queries that see them.

The oracle is transformers on the same checkpoint: a causal model's output at position i depends
only on tokens 0..i, so transformers run on a prefix gives what positions before a NaN token must
be, and transformers on the whole sequence shows the NaN that positions from it on must carry.
(Weights with NaN are refused at load; the NaN is put into an embedding row after loading.)
"""

from __future__ import annotations

import pytest
import torch

from conftest import PagedHarness, hf_model, rel_err
from text_generator import TextGenerator

pytestmark = pytest.mark.usefixtures("one_thread")

POISON = 9


def _poisoned(path):
    gen = TextGenerator.from_pretrained(path, device="cpu", attention_backend="torch")
    ref = hf_model(path)
    with torch.no_grad():
        gen.model_wrapper.model.model.embed_tokens.weight[POISON] = float("nan")
        ref.model.embed_tokens.weight[POISON] = float("nan")
    return gen, ref


@torch.no_grad()
def test_nan_reaches_only_the_queries_that_see_it(checkpoint_dir):
    path = checkpoint_dir("llama")
    gen, ref = _poisoned(path)
    harness = PagedHarness(gen, 16, 4)
    bad, good = [3, 1, 4, POISON, 5, 2], [6, 2, 8, 3, 1]
    out = harness.step({0: bad, 1: good}, is_prefill=True)
    ours_bad, ours_good = out[: len(bad)], out[len(bad):]
    full = ref(torch.tensor([bad])).logits[0]
    p = bad.index(POISON)
    assert torch.isnan(full[p:]).all()  # transformers: NaN from the poisoned token on
    assert torch.isnan(ours_bad[p:]).all()  # not zeros or other finite garbage
    assert torch.isfinite(ours_bad[:p]).all()
    assert rel_err(ours_bad[:p], ref(torch.tensor([bad[:p]])).logits[0]) < 1e-4
    # a request batched alongside is untouched
    assert rel_err(ours_good, ref(torch.tensor([good])).logits[0]) < 1e-4
    step = harness.step({0: [7], 1: [7]}, is_prefill=False)
    assert torch.isnan(step[0]).all()
    assert rel_err(step[1], ref(torch.tensor([good + [7]])).logits[0, -1]) < 1e-4


@torch.no_grad()
def test_nan_in_unused_cache_slots_is_never_read(checkpoint_dir):
    # a cache allocated with torch.empty may hold NaN bit patterns in slots no request owns yet
    path = checkpoint_dir("mistral")  # a sliding window: keys outside it are masked too
    gen = TextGenerator.from_pretrained(path, device="cpu", attention_backend="torch")
    harness = PagedHarness(gen, 32, 4)  # its blocks leave block 0 (slot 0, where padding key rows point) unwritten
    for k, v in harness.kv_cache:
        k.fill_(float("nan"))
        v.fill_(float("nan"))
    ref = hf_model(path)
    long, short = [5, 3, 9, 1, 4, 4, 8, 2, 7, 6], [2, 7, 1]  # the short one's key rows past 3 are padding
    out = harness.step({0: long, 1: short}, is_prefill=True)
    assert rel_err(out[: len(long)], ref(torch.tensor([long])).logits[0]) < 1e-4
    assert rel_err(out[len(long):], ref(torch.tensor([short])).logits[0]) < 1e-4
    step = harness.step({0: [3], 1: [3]}, is_prefill=False)
    assert rel_err(step[1], ref(torch.tensor([short + [3]])).logits[0, -1]) < 1e-4
