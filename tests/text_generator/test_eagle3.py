"""EAGLE-3 drafting: the head against a direct torch computation, speculation against plain decoding.

No trained head can be had here, so each test writes a random head in the public EAGLE-3 layout
(config.json + model.safetensors: fc, midlayer.*, norm, lm_head, d2t, t2d). Oracles: the head's
arithmetic written out below in plain torch from the checkpoint's tensors (RMSNorm, RoPE, causal
GQA attention, SiLU MLP, d2t); the target's hidden states from transformers'
output_hidden_states; greedy output from transformers' generate; the sampled output's
distribution from the target's own probabilities (chi-square, as test_speculative).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import save_file

from conftest import hf_generate, hf_model
from kv_manager import BlockManager
from model_wrapper import ModelErrorCode, ModelLoadError
from test_speculative import _chi2_pvalue
from text_generator import TextGenerator
from text_generator.speculative import SpeculativeDecoder, TreeSampling, target_probs
from text_generator.speculative.eagle3 import Eagle3Drafter

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, HIDDEN, DRAFT_VOCAB = 96, 64, 40
HEAD = dict(heads=4, kv_heads=2, inter=80, eps=1e-5, theta=10000.0)


def make_head(path, *, seed=0, hidden=HIDDEN, target_hidden=None, vocab=VOCAB, draft_vocab=DRAFT_VOCAB, aux=None,
              own_embed=False, config=None, drop=(), shapes=None, d2t_shift=0):
    """A random EAGLE-3 head folder; -> its tensors (float32). config / drop / shapes / d2t_shift
    spoil it on purpose (refusal tests)."""
    g = torch.Generator().manual_seed(seed)
    H, hd = hidden, hidden // HEAD["heads"]
    target_hidden = target_hidden or hidden
    q, kv = HEAD["heads"] * hd, HEAD["kv_heads"] * hd

    def w(*shape, scale=0.1):
        return (torch.randn(*shape, generator=g) * scale).contiguous()

    def norm():
        return 1.0 + w(H)

    a = "midlayer.self_attn."
    t = {
        "fc.weight": w(H, 3 * target_hidden, scale=0.05),
        "midlayer.input_layernorm.weight": norm(), "midlayer.hidden_norm.weight": norm(),
        "midlayer.post_attention_layernorm.weight": norm(),
        a + "q_proj.weight": w(q, 2 * H), a + "k_proj.weight": w(kv, 2 * H), a + "v_proj.weight": w(kv, 2 * H),
        a + "o_proj.weight": w(H, q),
        "midlayer.mlp.gate_proj.weight": w(HEAD["inter"], H), "midlayer.mlp.up_proj.weight": w(HEAD["inter"], H),
        "midlayer.mlp.down_proj.weight": w(H, HEAD["inter"]),
        "norm.weight": norm(), "lm_head.weight": w(draft_vocab, H, scale=0.3),
    }
    kept = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values  # the draft vocabulary's target ids
    t["d2t"] = kept - torch.arange(draft_vocab) + d2t_shift
    t["t2d"] = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, kept, True)
    if own_embed:
        t["embed_tokens.weight"] = w(vocab, H, scale=0.5)
    for name, shape in (shapes or {}).items():
        t[name] = w(*shape)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": HEAD["inter"], "num_attention_heads": HEAD["heads"],
           "num_key_value_heads": HEAD["kv_heads"], "num_hidden_layers": 1, "vocab_size": vocab,
           "draft_vocab_size": draft_vocab, "target_hidden_size": target_hidden, "rms_norm_eps": HEAD["eps"],
           "rope_theta": HEAD["theta"], "max_position_embeddings": 2048, "hidden_act": "silu",
           "tie_word_embeddings": False, "torch_dtype": "float32"}
    if aux is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = aux
    cfg.update(config or {})
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v for k, v in t.items() if k not in drop}, str(path / "model.safetensors"))
    return t


# -- the oracle: the head's arithmetic in plain torch -------------------------------------------

def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + HEAD["eps"]) * w


def _rope(x, pos):
    """x [n, heads, d] rotated at positions pos [n] (Llama's rotate-half convention)."""
    d = x.shape[-1]
    inv = 1.0 / HEAD["theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos[:, None].double() * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None].float(), torch.cat([ang.sin(), ang.sin()], -1)[:, None].float()
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + rot * sin


def oracle_head(t, embed, tokens: list[int], feats: torch.Tensor):
    """Entries (tokens [n], features g [n, H]) at positions 0..n-1, causal -> (pre-norm out [n, H],
    draft logits [n, draft_vocab])."""
    a = "midlayer.self_attn."
    n, hd = len(tokens), t[a + "q_proj.weight"].shape[0] // HEAD["heads"]
    x = torch.cat([_rms(embed[torch.tensor(tokens)], t["midlayer.input_layernorm.weight"]),
                   _rms(feats, t["midlayer.hidden_norm.weight"])], -1)
    pos = torch.arange(n)
    q = _rope((x @ t[a + "q_proj.weight"].T).view(n, HEAD["heads"], hd), pos)
    k = _rope((x @ t[a + "k_proj.weight"].T).view(n, HEAD["kv_heads"], hd), pos)
    v = (x @ t[a + "v_proj.weight"].T).view(n, HEAD["kv_heads"], hd)
    rep = HEAD["heads"] // HEAD["kv_heads"]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / hd ** 0.5
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, -1) @ t[a + "o_proj.weight"].T
    h = feats + o
    m = _rms(h, t["midlayer.post_attention_layernorm.weight"])
    m = (torch.nn.functional.silu(m @ t["midlayer.mlp.gate_proj.weight"].T) * (m @ t["midlayer.mlp.up_proj.weight"].T))
    out = h + m @ t["midlayer.mlp.down_proj.weight"].T
    return out, _rms(out, t["norm.weight"]) @ t["lm_head.weight"].T


def oracle_chain(t, embed, states: torch.Tensor, context: list[int], k: int, rank: int = 0) -> list[int]:
    """The chain a head drafts after context (t_0 .. t_{n-1}) from the target's states of
    positions 0 .. n-2 ([n-1, 3, H_t]): entry p = (t_{p+1}, fc(h_p)), then its own outputs; the
    first draft is the head's rank-th best (a tree's branch), the others its best."""
    toks = list(context[1:])
    feats = states.reshape(states.shape[0], -1) @ t["fc.weight"].T
    drafts = []
    for j in range(k):
        out, logits = oracle_head(t, embed, toks, feats)
        d = int(logits[-1].topk(rank + 1).indices[rank]) if j == 0 else int(logits[-1].argmax())
        drafts.append(d + int(t["d2t"][d]))
        toks.append(drafts[-1])
        feats = torch.cat([feats, out[-1:]])
    return drafts


def _load(path):
    return TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32, attention_backend="torch")


@pytest.fixture(scope="module")
def target8(checkpoint_dir):
    """An 8-layer tiny Llama (EAGLE-3's default states 2, 4, 5 exist) and transformers' twin."""
    path = checkpoint_dir("llama", num_hidden_layers=8)
    return _load(path), hf_model(path)


# -- (a) the head's arithmetic -------------------------------------------------------------------

@pytest.mark.parametrize("own_embed", [False, True])
def test_head_matches_a_direct_computation(checkpoint_dir, tmp_path, own_embed):
    gen = _load(checkpoint_dir("llama"))  # 2 layers: the head names its states
    t = make_head(tmp_path / "head", seed=1, aux=[2, 0, 1], own_embed=own_embed)
    embed = t["embed_tokens.weight"] if own_embed else gen.model_wrapper.model.model.embed_tokens.weight.float()
    drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=5, num_blocks=16, block_size=4)
    assert drafter.hidden_layers == (0, 1, 2) and drafter.aux_layers == (2, 0, 1)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, VOCAB, (11,), generator=g).tolist()
    states = torch.randn(11, 3, HIDDEN, generator=g)  # as forward_tensor gives them: layers 0, 1, 2
    fc_order = states[:, [2, 0, 1]]  # the head's own order (aux)
    drafter.start("a", prompt, hidden=states)
    drafter.update("a", [7])
    chain = drafter.propose(["a"], [64])[0]
    assert chain.tokens == [7] + oracle_chain(t, embed, fc_order, prompt + [7], 5)
    # the numbers themselves: one multi-token step over a fresh request
    feats = fc_order.reshape(11, -1) @ t["fc.weight"].T
    toks = prompt[1:] + [7]
    nxt, out = drafter._forward(["b"], [toks], drafter.head.fuse(fc_order, drafter.runner.kernels))
    want_out, want_logits = oracle_head(t, embed, toks, feats)
    assert (out[0] - want_out[-1]).abs().max() / want_out.abs().max() < 1e-4
    d = int(want_logits[-1].argmax())
    assert nxt.tolist() == [[d + int(t["d2t"][d])]]


def test_tree_branches_match_the_direct_computation(checkpoint_dir, tmp_path):
    """branches=3: the root's children are the head's 3 best first drafts, each a greedy chain
    continued in its own lane (a fork of the request's entries), and the budget bounds the tree."""
    gen = _load(checkpoint_dir("llama"))
    t = make_head(tmp_path / "head", seed=4, aux=[0, 1, 2])
    embed = gen.model_wrapper.model.model.embed_tokens.weight.float()
    drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=3, branches=3, num_blocks=24, block_size=4)
    g = torch.Generator().manual_seed(5)
    prompts = {"a": torch.randint(0, VOCAB, (10,), generator=g).tolist(),
               "b": torch.randint(0, VOCAB, (5,), generator=g).tolist()}
    states = {s: torch.randn(len(p), 3, HIDDEN, generator=g) for s, p in prompts.items()}
    for s, p in prompts.items():
        drafter.start(s, p, hidden=states[s])
        drafter.update(s, [3])
    trees = drafter.propose(["a", "b"], [64, 7])  # b: 6 nodes below the root -> 3 branches of 2
    for tree, s, k in zip(trees, "ab", (3, 2)):
        want = [oracle_chain(t, embed, states[s], prompts[s] + [3], k, rank=c) for c in range(3)]
        assert tree.tokens == [3] + sum(want, [])
        assert tree.parents == [-1] + sum(([0] + list(range(1 + c * k, c * k + k)) for c in range(3)), [])
    assert drafter.bm.num_used_blocks == len(drafter.bm.block_table("a")) + len(drafter.bm.block_table("b"))


def test_states_of_a_long_pause_are_folded_and_caught_up_in_one_step(checkpoint_dir, tmp_path, monkeypatch):
    """Updates without proposals (a request that does not draft) keep their states as given, up to
    RAW_LIMIT of them, then fold them into the head's dtype; the next proposal writes every
    pending entry and drafts what the direct computation over the whole context gives."""
    from text_generator.speculative import eagle3

    monkeypatch.setattr(eagle3, "RAW_LIMIT", 3)
    gen = _load(checkpoint_dir("llama"))
    t = make_head(tmp_path / "head", seed=6, aux=[0, 1, 2])
    embed = gen.model_wrapper.model.model.embed_tokens.weight.float()
    drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=3, num_blocks=16, block_size=4)
    g = torch.Generator().manual_seed(8)
    prompt = torch.randint(0, VOCAB, (6,), generator=g).tolist()
    states = torch.randn(13, 3, HIDDEN, generator=g)  # positions 0 .. 12
    drafter.start("a", prompt, hidden=states[:6])
    context = list(prompt)
    for p in range(6, 14):  # 8 tokens; each but the first brings the state of the position before it
        tok = int(torch.randint(0, VOCAB, (1,), generator=g))
        drafter.update("a", [tok], hidden=None if p == 6 else states[p - 1:p])
        context.append(tok)
        assert len(drafter._seqs["a"].raw) < 3
    assert drafter._seqs["a"].num_pending() == 13 and drafter._seqs["a"].picked.shape[0] >= 12
    chain = drafter.propose(["a"], [64])[0]
    assert chain.tokens == [context[-1]] + oracle_chain(t, embed, states[:13], context, 3)


# -- (b) lossless greedy speculation, and the drafter's bookkeeping -------------------------------

class RecordingDrafter(Eagle3Drafter):
    """Records (context, proposed chain) at every proposal."""

    log: list

    def propose(self, seq_ids, budgets):
        trees = super().propose(seq_ids, budgets)
        self.log += [(list(self._seqs[s].context), t.tokens) for s, t in zip(seq_ids, trees)]
        return trees


def test_greedy_speculation_with_eagle3_equals_plain_greedy(target8, tmp_path):
    gen, hf = target8
    t = make_head(tmp_path / "head", seed=3)  # no layer ids: EAGLE-3's default (2, L // 2, L - 3)
    drafter = RecordingDrafter(gen, str(tmp_path / "head"), k=3, num_blocks=64, block_size=4)
    drafter.log = []
    assert drafter.aux_layers == (2, 4, 5)
    rng = random.Random(4)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 14))] for _ in range(4)]
    n = 12
    kv, bm = gen.allocate_kv_cache(96, 4), BlockManager(96, 4, enable_prefix_caching=False)
    dec = SpeculativeDecoder(gen, kv, bm, drafter, adaptive_speculation=False)  # a random head: draft every step
    assert dec.generate(prompts, n) == [hf_generate(hf, p, n) for p in prompts]
    assert dec.stats.drafted > 20 and drafter.bm.num_used_blocks == 0 and bm.num_used_blocks == 0
    # every proposal is the head's chain from the target's true states of the verified context
    embed = gen.model_wrapper.model.model.embed_tokens.weight.float()
    for context, tokens in drafter.log[::3]:
        with torch.no_grad():
            hs = hf(torch.tensor([context[:-1]]), output_hidden_states=True).hidden_states
        states = torch.stack([hs[i][0] for i in (2, 4, 5)], dim=1)
        assert tokens == [context[-1]] + oracle_chain(t, embed, states, context, len(tokens) - 1)
    # trees (three branches) through the same driver: still plain greedy
    tree_drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=2, branches=3, num_blocks=64, block_size=4)
    dec = SpeculativeDecoder(gen, kv, bm, tree_drafter, adaptive_speculation=False)
    assert dec.generate(prompts, n) == [hf_generate(hf, p, n) for p in prompts]
    assert dec.stats.drafted > 40 and tree_drafter.bm.num_used_blocks == 0


def test_a_batch_with_prefix_cache_hits_stays_lossless(target8, tmp_path):
    """A second request whose prompt the target's prefix cache holds: the head drafts from the suffix."""
    gen, hf = target8
    make_head(tmp_path / "head", seed=5)
    drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=2, num_blocks=64, block_size=4)
    prompt = [random.Random(6).randrange(VOCAB) for _ in range(13)]
    kv, bm = gen.allocate_kv_cache(64, 4), BlockManager(64, 4)
    dec = SpeculativeDecoder(gen, kv, bm, drafter)
    ref = hf_generate(hf, prompt, 10)
    assert dec.generate([prompt], 10) == [ref]
    assert dec.generate([prompt, prompt[:9]], 10) == [ref, hf_generate(hf, prompt[:9], 10)]
    assert dec.stats.drafted > 0 and drafter.bm.num_used_blocks == 0


# -- (c) sampling keeps the target's distribution -------------------------------------------------

def test_rejection_sampling_with_eagle3_keeps_the_target_distribution(target8, tmp_path):
    """Prompt -> t1 (the prefill's plain sample) -> t2 (the first verify step, which drafted): t2
    given the most frequent t1 must follow the target's p(. | prompt + t1)."""
    gen, hf = target8
    make_head(tmp_path / "head", seed=7)
    params = TreeSampling(temperature=0.8, top_k=4)
    prompt = [random.Random(8).randrange(VOCAB) for _ in range(6)]
    drafter = Eagle3Drafter(gen, str(tmp_path / "head"), k=2, num_blocks=512, block_size=4)
    kv, bm = gen.allocate_kv_cache(512, 4), BlockManager(512, 4, enable_prefix_caching=False)
    dec = SpeculativeDecoder(gen, kv, bm, drafter, sampling=params, seed=11)
    pairs = []
    for _ in range(12):
        pairs += [(o[0], o[1]) for o in dec.generate([prompt] * 100, 3)]
    assert dec.stats.drafted >= 1200  # every request's first verify step carried a draft
    first = max(set(a for a, _ in pairs), key=[a for a, _ in pairs].count)
    counts = torch.zeros(VOCAB)
    for a, b in pairs:
        if a == first:
            counts[b] += 1
    with torch.no_grad():
        probs = target_probs(hf(torch.tensor([prompt + [first]])).logits[0, -1:], params)[0]
    assert counts.sum() > 300
    assert _chi2_pvalue(counts, probs) > 1e-3
    biased = torch.zeros(VOCAB)
    biased[int(probs.argmax())] = counts.sum()  # the test has power: all on the likeliest token fails
    assert _chi2_pvalue(biased, probs) < 1e-6


# -- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spoil, code, fragment", [
    (dict(target_hidden=32, aux=[0, 1, 2]), ModelErrorCode.DRAFT_MISMATCH, "target_hidden_size"),
    (dict(vocab=97, aux=[0, 1, 2]), ModelErrorCode.DRAFT_MISMATCH, "vocab_size"),
    (dict(d2t_shift=60, aux=[0, 1, 2]), ModelErrorCode.DRAFT_MISMATCH, "d2t"),
    (dict(aux=[0, 1, 9]), ModelErrorCode.DRAFT_MISMATCH, "eagle_aux_hidden_state_layer_ids"),
    (dict(), ModelErrorCode.DRAFT_MISMATCH, "at least 3 layers"),  # a 2-layer target, no ids named
    (dict(aux=[0, 1, 2], drop=("norm.weight",)), ModelErrorCode.MISSING_TENSOR, "norm.weight"),
    (dict(aux=[0, 1, 2], shapes={"lm_head.weight": (DRAFT_VOCAB, 32)}), ModelErrorCode.MISSHAPEN_TENSOR, "lm_head"),
    (dict(aux=[0, 1, 2], shapes={"extra.weight": (2, 2)}), ModelErrorCode.UNEXPECTED_TENSOR, "extra.weight"),
    (dict(aux=[0, 1, 2], config={"architectures": ["LlamaForCausalLM"]}), ModelErrorCode.UNSUPPORTED_ARCHITECTURE,
     "LlamaForCausalLMEagle3"),
    (dict(aux=[0, 1, 2], config={"hidden_size": 32}), ModelErrorCode.MISSHAPEN_TENSOR, "fc.weight"),
])
def test_a_head_that_does_not_fit_the_target_is_refused(checkpoint_dir, tmp_path, spoil, code, fragment):
    gen = _load(checkpoint_dir("llama"))
    make_head(tmp_path / "head", **spoil)
    with pytest.raises(ModelLoadError) as e:
        Eagle3Drafter(gen, str(tmp_path / "head"))
    assert e.value.code == code and fragment in str(e.value), str(e.value)
