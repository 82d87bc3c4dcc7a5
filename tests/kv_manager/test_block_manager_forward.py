"""The block manager driving forward_tensor: what its tables and slots mean for the logits.

Oracle: transformers' own model on each sequence's full token list. A prefix-cache hit prefills
only the uncached tail and must give the logits of a cold prefill; a fork continues exactly like
an independent sequence (and its copy-on-write block keeps the two apart); tokens appended and
then truncated away leave no trace.
"""

from __future__ import annotations

import pytest
import torch

from conftest import hf_model, rel_err
from kv_manager import BlockManager
from text_generator import TextGenerator

BS = 4


@pytest.fixture(scope="module")
def setup(checkpoint_dir):
    path = checkpoint_dir("llama")
    return TextGenerator.from_pretrained(path, device="cpu"), hf_model(path)


def run(gen, kv, bm, spans, *, is_prefill):
    """spans: [(seq, start, end)]: feed tokens [start, end) of each sequence -> logits per token."""
    ids, pos, slots, q_lens, lens = [], [], [], [], []
    for seq, a, b in spans:
        ids += bm.token_ids(seq)[a:b]
        pos += list(range(a, b))
        slots.append(bm.slots(seq, a, b))
        q_lens.append(b - a)
        lens.append(b)
    tables = bm.block_tables([s for s, _, _ in spans])
    return gen.forward_tensor(torch.tensor(ids), torch.tensor(pos), is_prefill, kv, tables, torch.cat(slots),
                              torch.tensor(lens), 128, q_lens=q_lens)


def oracle(ref, tokens):
    with torch.no_grad():
        return ref(torch.tensor([tokens])).logits[0]


def test_prefix_cache_hit_prefills_only_the_tail_and_matches_a_cold_prefill(setup):
    gen, ref = setup
    kv = gen.allocate_kv_cache(32, BS)
    bm = BlockManager(32, BS)
    shared = list(range(10, 31))  # 21 tokens: 5 full blocks
    a = shared + [40, 41]
    b = shared[:20] + [50, 51, 52, 53, 54]
    assert bm.admit("a", a) == 0
    run(gen, kv, bm, [("a", 0, len(a))], is_prefill=True)
    bm.commit("a", len(a))
    cached = bm.admit("b", b)
    assert cached == 20  # 5 whole blocks shared with "a"
    assert bm.block_table("b")[:5] == bm.block_table("a")[:5]
    out = run(gen, kv, bm, [("b", cached, len(b))], is_prefill=True)
    assert out.shape[0] == len(b) - cached
    assert rel_err(out, oracle(ref, b)[cached:]) < 1e-4
    # a cold prefill of the same prompt in a fresh cache gives the same rows
    kv2, bm2 = gen.allocate_kv_cache(32, BS), BlockManager(32, BS, enable_prefix_caching=False)
    bm2.admit("b", b)
    cold = run(gen, kv2, bm2, [("b", 0, len(b))], is_prefill=True)
    torch.testing.assert_close(out, cold[cached:], rtol=1e-5, atol=1e-5)


def test_fork_continues_like_independent_sequences(setup):
    gen, ref = setup
    kv = gen.allocate_kv_cache(32, BS)
    bm = BlockManager(32, BS)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # 10 tokens: the last block is partial
    bm.admit("p", prompt)
    run(gen, kv, bm, [("p", 0, len(prompt))], is_prefill=True)
    bm.commit("p", len(prompt))
    copies = bm.fork("p", "c")
    assert len(copies) == 1  # the shared partial block must be copied before either writes
    for k, v in kv:
        for src, dst in copies:
            k[dst].copy_(k[src])
            v[dst].copy_(v[src])
    # different continuations, decoded in one batch: each must match its own sequence alone
    tails = {"p": [7, 7, 8], "c": [11, 12, 13]}
    for i in range(3):
        spans = []
        for s in ("p", "c"):
            bm.append(s, [tails[s][i]])
            n = bm.num_tokens(s)
            spans.append((s, n - 1, n))
        out = run(gen, kv, bm, spans, is_prefill=False)
        for row, s in enumerate(("p", "c")):
            full = prompt + tails[s][: i + 1]
            assert rel_err(out[row], oracle(ref, full)[-1]) < 1e-4, (s, i)
            bm.commit(s, len(full))


def test_truncated_tokens_leave_no_trace(setup):
    gen, ref = setup
    kv = gen.allocate_kv_cache(16, BS)
    bm = BlockManager(16, BS)
    prompt = [8, 6, 7, 5, 3, 0, 9]
    bm.admit("s", prompt)
    run(gen, kv, bm, [("s", 0, len(prompt))], is_prefill=True)
    bm.commit("s", len(prompt))
    bm.append("s", [20, 21, 22, 23, 24])  # drafts: written to the cache, never committed
    run(gen, kv, bm, [("s", len(prompt), len(prompt) + 5)], is_prefill=False)
    bm.truncate("s", len(prompt))
    bm.append("s", [30])
    out = run(gen, kv, bm, [("s", len(prompt), len(prompt) + 1)], is_prefill=False)
    assert rel_err(out[0], oracle(ref, prompt + [30])[-1]) < 1e-4
