"""forward_tensor(..., output_hidden_states=[i, ...]) against transformers' output_hidden_states.

Oracle: transformers' model class on the same random checkpoint, run over each request's full
sequence with output_hidden_states=True; its tuple (embeddings, the input of each layer, the final
normed state) is what the indices name. Every step kind a scheduler sends: batched prefill with a
chunked prompt, a mixed step, a decode step with lm_head_indices in reverse order, a multi-token
decode; a LoRA batch against peft. fp32: max relative error < 1e-4 per state.
"""

from __future__ import annotations

import pytest
import torch

from conftest import FAMILIES, MOE_FAMILIES, PagedHarness, hf_model, rel_err
from text_generator import ErrorCode, ForwardArgumentError, TextGenerator

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 96


def _load(path):
    return TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32, attention_backend="torch")


def _script(seed: int):
    g = torch.Generator().manual_seed(seed)
    full = {r: torch.randint(0, VOCAB, (n,), generator=g).tolist() for r, n in ((0, 14), (1, 7), (2, 20))}
    steps = [  # (is_prefill, {rid: (start, end)}, reversed lm_head_indices)
        (True, {0: (0, 9), 1: (0, 4), 2: (0, 6)}, False),
        (True, {0: (9, 10), 1: (4, 5), 2: (6, 17)}, False),  # decodes + a prefill chunk
        (False, {0: (10, 11), 1: (5, 6), 2: (17, 18)}, True),
        (False, {0: (11, 14), 1: (6, 7), 2: (18, 20)}, False),  # several tokens per request
    ]
    return full, steps


def hidden_scenario(gen, layers, seed=0, **kwargs):
    """-> [(rid, position, logits row, hidden [len(layers), H])] over the script's steps."""
    full, steps = _script(seed)
    h = PagedHarness(gen, num_blocks=48, block_size=4, seed=seed)
    out = []
    for is_prefill, spans, reverse in steps:
        positions = [(r, p) for r, (a, b) in spans.items() for p in range(a, b)]
        lm = None
        if reverse:
            lm = torch.arange(len(positions) - 1, -1, -1)
            positions = [positions[i] for i in lm.tolist()]
        logits, hidden = h.step({r: full[r][a:b] for r, (a, b) in spans.items()}, is_prefill=is_prefill,
                                lm_head_indices=lm, output_hidden_states=layers, **kwargs)
        assert hidden.dtype == torch.float32 and hidden.shape == (len(positions), len(layers), gen.config.hidden_size)
        assert logits.shape == (len(positions), VOCAB)
        out += [(r, p, logits[i], hidden[i]) for i, (r, p) in enumerate(positions)]
    return out


def reference_states(model, seqs: dict[int, list[int]]) -> dict[int, torch.Tensor]:
    """rid -> [num_layers + 1, len, H]: transformers' output_hidden_states over the full sequence."""
    with torch.no_grad():
        return {r: torch.stack([s[0] for s in model(torch.tensor([t]), output_hidden_states=True).hidden_states])
                for r, t in seqs.items()}


def check_states(out, ref, layers):
    for j, layer in enumerate(layers):
        got = torch.stack([hid[j] for _, _, _, hid in out])
        want = torch.stack([ref[r][layer, p] for r, p, _, _ in out])
        assert rel_err(got, want) < 1e-4, (layer, rel_err(got, want))


@pytest.mark.parametrize("family", FAMILIES + MOE_FAMILIES[:1])
def test_every_state_matches_transformers(checkpoint_dir, family):
    path = checkpoint_dir(family)
    gen = _load(path)
    layers = list(range(gen.config.num_layers, -1, -1))  # every state, in an order of our choosing
    out = hidden_scenario(gen, layers)
    check_states(out, reference_states(hf_model(path), _script(0)[0]), layers)


def test_logits_unchanged_and_plain_return_without_the_kwarg(checkpoint_dir):
    gen = _load(checkpoint_dir("llama"))
    with_states = hidden_scenario(gen, [2, 0], seed=3)
    full, steps = _script(3)
    h = PagedHarness(gen, num_blocks=48, block_size=4, seed=3)
    plain = []
    for is_prefill, spans, reverse in steps:
        n = sum(b - a for a, b in spans.values())
        logits = h.step({r: full[r][a:b] for r, (a, b) in spans.items()}, is_prefill=is_prefill,
                        lm_head_indices=torch.arange(n - 1, -1, -1) if reverse else None)
        assert isinstance(logits, torch.Tensor)
        plain.append(logits)
    assert torch.equal(torch.cat(plain), torch.stack([lo for _, _, lo, _ in with_states]))


def test_lora_states_match_peft(checkpoint_dir, tmp_path):
    from test_lora import make_adapter

    path = checkpoint_dir("qwen3")
    oracle = make_adapter(path, tmp_path / "a", seed=2, r=4, lora_alpha=8, target_modules="all-linear")
    gen = _load(path)
    gen.enable_lora(max_loras=1, max_rank=4)
    gen.load_adapter("a", str(tmp_path / "a"))
    layers = [0, 1, 2]
    out = hidden_scenario(gen, layers, adapter_ids=["a"])
    check_states(out, reference_states(oracle, _script(0)[0]), layers)


@pytest.mark.parametrize("value, fragment", [
    ([], "non-empty list"), ([1, 1], "distinct"), ([3], "[0, num_layers=2]"), ([-1], "[0, num_layers=2]"),
    ([0.5], "list of ints"), ("1", "list of ints"), ([True], "list of ints"),
])
def test_bad_output_hidden_states_is_refused_and_changes_nothing(checkpoint_dir, value, fragment):
    gen = _load(checkpoint_dir("llama"))
    h = PagedHarness(gen, num_blocks=16, block_size=4)
    before = [(k.clone(), v.clone()) for k, v in h.kv_cache]
    with pytest.raises(ForwardArgumentError) as e:
        h.step({0: [1, 2, 3, 4, 5]}, is_prefill=True, output_hidden_states=value)
    assert e.value.code == ErrorCode.INVALID_HIDDEN_STATES and "output_hidden_states" in str(e.value)
    assert fragment in str(e.value)
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(h.kv_cache, before))
