"""spec_mask trees and atten_mask in forward_tensor, against transformers on plain sequences.

Oracle: the logits of a tree node equal transformers' logits for the last token of the node's
root-to-node path appended to the request's cached context, run as one plain sequence.
"""

from __future__ import annotations

import pytest
import torch

from conftest import PagedHarness, hf_model, rel_err
from text_generator import TextGenerator

# a tree of 6 new tokens: 0 is the root (the last accepted token), parents before children
PARENTS = [-1, 0, 0, 1, 1, 2]


def tree_rows(parents):
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = []
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
        depth.append(0 if p < 0 else depth[p] + 1)
    return mask, depth


def path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_spec_mask_tree_matches_paths(checkpoint_dir, family, kind):
    ckpt = checkpoint_dir(family)
    gen = TextGenerator.from_pretrained(ckpt, device="cpu")
    ref = hf_model(ckpt)
    g = torch.Generator().manual_seed(2)
    contexts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (9, 4)]
    trees = [PARENTS, [-1, 0, 1]]  # second request: a chain of 3
    h = PagedHarness(gen, 64, 4)
    h.step({r: c for r, c in enumerate(contexts)}, is_prefill=True)
    ids, pos, slots, q_lens, masks = [], [], [], [], []
    for r, (ctx, parents) in enumerate(zip(contexts, trees)):
        toks = torch.randint(0, 96, (len(parents),), generator=g).tolist()
        m, depth = tree_rows(parents)
        start = len(ctx)
        h.ensure(r, start + len(parents))
        ids += toks
        pos += [start + d for d in depth]
        slots += [h.slot(r, start + i) for i in range(len(parents))]
        q_lens.append(len(parents))
        masks.append((m, toks))
    max_q = max(q_lens)
    spec = torch.zeros(len(ids), max_q, dtype=torch.bool)
    row = 0
    for m, _ in masks:
        spec[row : row + m.shape[0], : m.shape[1]] = m
        row += m.shape[0]
    if kind == "additive":
        spec = torch.zeros(spec.shape).masked_fill(~spec, float("-inf"))
    lens = [len(c) + len(t) for c, t in zip(contexts, trees)]
    bt = torch.full((2, max(len(h.tables[0]), len(h.tables[1]))), -1, dtype=torch.int32)
    for r in (0, 1):
        bt[r, : len(h.tables[r])] = torch.tensor(h.tables[r])
    out = gen.forward_tensor(torch.tensor(ids), torch.tensor(pos), False, h.kv_cache, bt, torch.tensor(slots),
                             torch.tensor(lens), 128, q_lens=q_lens, spec_mask=spec)
    row = 0
    for r, (ctx, parents) in enumerate(zip(contexts, trees)):
        toks = masks[r][1]
        for i in range(len(parents)):
            seq = ctx + [toks[j] for j in path(parents, i)]
            want = ref(torch.tensor([seq])).logits[0, -1]
            assert rel_err(out[row + i], want) < 1e-4, (r, i)
        row += len(parents)


def test_atten_mask_causal_equals_default_and_expresses_trees(checkpoint_dir):
    """atten_mask over absolute key positions: the causal pattern reproduces the default, and a
    tree pattern reproduces spec_mask."""
    ckpt = checkpoint_dir("llama")
    gen = TextGenerator.from_pretrained(ckpt, device="cpu")
    ref = hf_model(ckpt)
    ctx = list(range(10, 17))
    tree = [-1, 0, 0, 2]
    toks = [40, 41, 42, 43]
    h = PagedHarness(gen, 32, 4)
    h.step({0: ctx}, is_prefill=True)
    h.ensure(0, len(ctx) + 4)
    m, depth = tree_rows(tree)
    L = len(ctx) + 4
    atten = torch.zeros(4, L, dtype=torch.bool)
    atten[:, : len(ctx)] = True
    atten[:, len(ctx):] = m
    args = (torch.tensor(toks), torch.tensor([len(ctx) + d for d in depth]), False, h.kv_cache,
            torch.tensor([h.tables[0]], dtype=torch.int32),
            torch.tensor([h.slot(0, len(ctx) + i) for i in range(4)]), torch.tensor([L]), 64)
    out = gen.forward_tensor(*args, q_lens=[4], atten_mask=atten)
    out_spec = gen.forward_tensor(*args, q_lens=[4], spec_mask=m)
    torch.testing.assert_close(out, out_spec)
    for i in range(4):
        want = ref(torch.tensor([ctx + [toks[j] for j in path(tree, i)]])).logits[0, -1]
        assert rel_err(out[i], want) < 1e-4
    # the causal pattern equals no mask at all (positions must then be consecutive)
    causal = torch.ones(4, L, dtype=torch.bool).tril(diagonal=len(ctx))
    args_causal = list(args)
    args_causal[1] = torch.arange(len(ctx), L)
    a = gen.forward_tensor(*args_causal, q_lens=[4], atten_mask=causal)
    b = gen.forward_tensor(*args_causal, q_lens=[4])
    torch.testing.assert_close(a, b)
    assert rel_err(b, ref(torch.tensor([ctx + toks])).logits[0, len(ctx):]) < 1e-4
