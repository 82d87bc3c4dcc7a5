"""forward_tensor against transformers' own model classes on the same random checkpoint.

One scenario per (family, dtype, block_size) walks three requests through every kind of step a
scheduler sends: batched prefill of uneven prompts with a chunked one, a mixed step (prefill
chunk + decodes), a plain decode step with lm_head_indices, and multi-token decode. Every
returned logit row is compared with transformers' logits for the same position of the same
full sequence. fp32: max relative error < 1e-4. bf16: our error against transformers' fp32 may
be at most twice transformers' own bf16 error (plus a small floor): no worse than the oracle.
"""

from __future__ import annotations

import pytest
import torch

from conftest import FAMILIES, PagedHarness, hf_model, rel_err
from text_generator import TextGenerator

VOCAB = 96


def _script(seed: int):
    g = torch.Generator().manual_seed(seed)
    full = {r: torch.randint(0, VOCAB, (n,), generator=g).tolist() for r, n in ((0, 18), (1, 9), (2, 31))}
    # (is_prefill, {rid: (start, end)}, lm_head) — token spans of each request per step
    steps = [
        (True, {0: (0, 11), 1: (0, 5), 2: (0, 8)}, False),  # uneven prompts, request 2 chunked
        (True, {0: (11, 12), 1: (5, 6), 2: (8, 24)}, False),  # mixed: decodes + prefill chunk
        (False, {0: (12, 13), 1: (6, 7), 2: (24, 25)}, True),  # decode, lm_head_indices
        (False, {0: (13, 16), 1: (7, 9), 2: (25, 26)}, False),  # multi-token decode
    ]
    return full, steps


def _reference(path, dtype, full):
    model = hf_model(path, dtype)
    with torch.no_grad():
        return {r: model(torch.tensor([t])).logits[0].float() for r, t in full.items()}


def run_scenario(gen, full, steps, block_size, seed=0):
    h = PagedHarness(gen, num_blocks=256 // block_size + 8, block_size=block_size, seed=seed)
    outputs = []  # (rid, position, logits row)
    for is_prefill, spans, use_lm_head in steps:
        chunks = {r: full[r][a:b] for r, (a, b) in spans.items()}
        positions = [(r, p) for r, (a, b) in spans.items() for p in range(a, b)]
        lm = None
        if use_lm_head:  # ask for the rows in reverse order: order must be honoured
            lm = torch.arange(len(positions) - 1, -1, -1)
            positions = [positions[i] for i in lm.tolist()]
        logits = h.step(chunks, is_prefill=is_prefill, lm_head_indices=lm)
        assert logits.dtype == torch.float32 and logits.shape == (len(positions), VOCAB)
        outputs += [(r, p, logits[i]) for i, (r, p) in enumerate(positions)]
    return outputs


def _max_err(outputs, ref):
    got = torch.stack([o for _, _, o in outputs])
    want = torch.stack([ref[r][p] for r, p, _ in outputs])
    return rel_err(got, want)


@pytest.mark.parametrize("block_size", [1, 16, 128])
@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_parity(checkpoint_dir, family, block_size):
    path = checkpoint_dir(family)
    full, steps = _script(seed=hash(family) % 1000)
    ref = _reference(path, torch.float32, full)
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32)
    outputs = run_scenario(gen, full, steps, block_size)
    assert len(outputs) == sum(b - a for _, spans, _ in steps for a, b in spans.values())
    assert _max_err(outputs, ref) < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_parity(checkpoint_dir, family):
    path = checkpoint_dir(family)
    full, steps = _script(seed=7)
    ref32 = _reference(path, torch.float32, full)
    ref16 = _reference(path, torch.bfloat16, full)
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.bfloat16)
    assert gen.dtype == torch.bfloat16
    outputs = run_scenario(gen, full, steps, block_size=16)
    oracle_err = _max_err([(r, p, ref16[r][p]) for r, p, _ in outputs], ref32)
    ours = _max_err(outputs, ref32)
    assert ours <= 2 * oracle_err + 1e-3, (ours, oracle_err)


def test_sliding_window_matters(checkpoint_dir):
    """Mistral's window (6) is shorter than the sequences: dropping it would change the logits."""
    path = checkpoint_dir("mistral")
    no_window = checkpoint_dir("mistral", sliding_window=None)
    full, steps = _script(seed=3)
    a = run_scenario(TextGenerator.from_pretrained(path, device="cpu"), full, steps, 4)
    b = run_scenario(TextGenerator.from_pretrained(no_window, device="cpu"), full, steps, 4)
    assert _max_err(a, _reference(path, torch.float32, full)) < 1e-4
    assert _max_err(a, {r: v for r, v in _reference(no_window, torch.float32, full).items()}) > 1e-3
    assert _max_err(b, _reference(no_window, torch.float32, full)) < 1e-4


def test_qwen2_per_layer_sliding_window(checkpoint_dir):
    """Qwen2 with use_sliding_window: only the layers layer_types marks use the window."""
    path = checkpoint_dir("qwen2", use_sliding_window=True, sliding_window=5, max_window_layers=1,
                          layer_types=["full_attention", "sliding_attention"])
    gen = TextGenerator.from_pretrained(path, device="cpu")
    assert gen.config.layer_windows == (None, 5)
    full, steps = _script(seed=5)
    assert _max_err(run_scenario(gen, full, steps, 8), _reference(path, torch.float32, full)) < 1e-4


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_batch_invariance_and_block_ids(checkpoint_dir, family):
    """A request's logits are the same alone or batched, whatever the block ids are."""
    gen = TextGenerator.from_pretrained(checkpoint_dir(family), device="cpu")
    full, steps = _script(seed=11)
    together = {(r, p): o for r, p, o in run_scenario(gen, full, steps, 4, seed=1)}
    for rid in full:
        alone_steps = [(pf, {rid: spans[rid]}, False) for pf, spans, _ in steps]
        alone = run_scenario(gen, {rid: full[rid]}, alone_steps, 4, seed=100 + rid)
        for r, p, o in alone:
            torch.testing.assert_close(o, together[(r, p)], rtol=1e-5, atol=1e-5)


def test_padding_slot_writes_nothing(checkpoint_dir):
    """A -1 slot marks a padding request: its K/V is not written, other requests are unaffected."""
    gen = TextGenerator.from_pretrained(checkpoint_dir("llama"), device="cpu")
    kv = gen.allocate_kv_cache(8, 4)
    before = [(k.clone(), v.clone()) for k, v in kv]
    ids = torch.tensor([5, 6, 7, 9])
    out = gen.forward_tensor(
        ids, torch.tensor([0, 1, 2, 0]), True, kv,
        torch.tensor([[3, -1], [6, -1]], dtype=torch.int32), torch.tensor([12, 13, 14, -1]),
        torch.tensor([3, 1]), 64)
    ref = hf_model(checkpoint_dir("llama"))(ids[None, :3]).logits[0]
    assert rel_err(out[:3], ref) < 1e-4
    for (k, v), (k0, v0) in zip(kv, before):
        assert torch.equal(k[6], k0[6]) and torch.equal(v[6], v0[6])  # padding block untouched
        assert not torch.equal(k[3], k0[3])  # the real request wrote its block
